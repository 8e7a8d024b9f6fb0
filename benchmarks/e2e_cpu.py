"""End to end on the CPU, everything in one run: ours default, tuned, fused and bf16 vs spconv
2.3.8, against the conv roofline, for MinkUNet 0.5x / 1.0x (inference and training step) and
CenterPoint's VoxelResBackBone8x; plus every kernel map of MinkUNet, ours vs spconv.

Workloads: benchmarks/models.py (the generated 64-beam scan, seed 0; MinkUNet at 0.05 m with
random features; the backbone on CenterPoint's Waymo grid; BatchNorm statistics randomised; the
spconv twins of benchmarks/spconv_twins.py with our weights copied in). Every timed call gets
fresh input tensors, so kernel maps are built inside it.

Contenders (all at --threads, default 2, the machine's cores; spconv also at 1 thread, its only
race-free setting; its >1-thread figures are RACY):
- ours default: no config set anywhere, the per-device default (CPU: fetch_on_demand);
- ours tuned: the shipped tuned file for the model and mode (configs/tuned/*_cpu.yaml), when one
  exists (MinkUNet 0.5x, the backbone);
- ours fused (inference): torchsparse_pp.nn.fuse(model): BatchNorm folded into the convs, ReLU and
  residual sums in the conv kernel's epilogue;
- ours bf16: the default model under torch.autocast("cpu", torch.bfloat16) (the conv kernels use
  AVX512-BF16 dot products where the CPU has them); ours fused bf16 (inference) likewise;
- spconv 2.3.8 (ConvAlgo.Native; its CPU backward needs the get_current_stream patch of
  benchmarks/models.py).
Before timing: each of ours' float32 outputs vs spconv's at 1 thread (rel. error < 1e-4; bf16
variants < 5e-2) and the bf16 per-voxel argmax agreement with float32 (MinkUNet; with these random
weights and BatchNorm statistics many voxels' top logits nearly tie, so this is a worst case: the
agreement of a trained model, >= 99 %, is a test: tests/test_bf16_agreement.py).

Roofline: the network's conv MACs (every Conv3d: pairs x C_in x C_out, 1x1x1 convs N x C_in x
C_out; counted on the timed input) at the rate of torch.mm on 2048 x 2048 matrices at the same
thread count (float32, or bfloat16 for the bf16 rows), timed as one more task of the same
round-robin rounds as the model (its median rate per model and mode), so that the machine's
drift during a run moves the roofline with the times it is compared to; a training step counts
3x the MACs (forward, dgrad, wgrad). "of roofline" = t_roofline / t_ours (1.0 = the convs at the dense GEMM
rate and nothing else).

Kernel maps (MinkUNet: submanifold 3^3 at tensor strides 1-16, k2 s2 downsamples 1->2 ... 8->16;
the transposed convs reuse the downsamples' maps in both libraries): ours = the map on a fresh
cache plus the pairs view fetch_on_demand reads; spconv = ops.get_indice_pairs.

Timing: round-robin rounds (benchmarks/common.py interleaved_times), median of --repeats after
--warmup (the kernel maps: of --map-repeats). The training rounds also time the default's
inference ("ours-default-inference"): training / (3 x inference) divides times of the same rounds
(train_over_3x_inference; the ratio to the inference rounds' time, minutes earlier, is
train_over_3x_inference_across_phases). Output: e2e_cpu.json + e2e_cpu.png (inference,
training step, kernel maps) in a new benchmarks/out/e2e_cpu-<time>/, --out DIR, or
benchmarks/results/ with --publish.

Usage: python benchmarks/e2e_cpu.py [--repeats N] [--warmup N] [--threads T] [--models ...] [--quick]
       [--map-repeats N] [--no-maps] [--out DIR | --publish]
"""
import argparse
import contextlib
import copy
import os
import sys
import time
from typing import Dict, List, Optional

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, add_round_arguments, check_round_arguments, interleaved_times,  # noqa: E402
                    load_average, machine_info, mm_rates, mm_rates_from, mm_tasks, num_threads, output_dir, pyplot,
                    save_figure,
                    write_json)
from models import WORKLOADS, compare_outputs, patch_spconv_cpu_backward  # noqa: E402

from torchsparse_pp import backends as tsp_backends, ops  # noqa: E402
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map, submanifold_map  # noqa: E402
from torchsparse_pp.nn import Conv3d, fuse  # noqa: E402
from torchsparse_pp.tune import apply as apply_tuned  # noqa: E402
from torchsparse_pp.utils import cpu_bf16  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUNED = {("minkunet0.5", "inference"): "configs/tuned/minkunet_0.5x_inference_cpu.yaml",
         ("minkunet0.5", "training"): "configs/tuned/minkunet_0.5x_training_cpu.yaml",
         ("centerpoint", "inference"): "configs/tuned/centerpoint_backbone_inference_cpu.yaml",
         ("centerpoint", "training"): "configs/tuned/centerpoint_backbone_training_cpu.yaml"}
SAME_ROUND_INFERENCE = "default-inference"  # a variant timed in the training rounds, see model_tasks
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}
LR, MOMENTUM = 1e-3, 0.9
TARGETS = {"default_vs_spconv_inference": 2.5, "fused_of_roofline": 1 / 1.15, "bf16_over_fp32": 1.6,
           "train_vs_spconv": 2.0, "train_over_3x_inference": 1.25, "maps_vs_spconv": 3.0}


class Variant:
    """One of ours: a model, an autocast dtype (None: float32) and the modes it runs in."""

    def __init__(self, model, dtype: Optional[torch.dtype], modes):
        self.model, self.dtype, self.modes = model, dtype, modes

    def context(self):
        return torch.autocast("cpu", dtype=self.dtype) if self.dtype is not None else contextlib.nullcontext()


def conv_macs(model, x) -> int:
    """MACs of every Conv3d on input x (pairs x C_in x C_out; 1x1x1: N x C_in x C_out)."""
    total = []

    def hook(module, inputs, output):
        inp = inputs[0]
        g = module.geometry
        if g.is_pointwise:
            total.append(inp.num_points * module.in_channels * module.out_channels)
            return
        kmap = next(k for _, k in inp.cache.maps() if k.geometry == g and (
            (not module.transposed and k.in_coords is inp.C and k.out_coords is output.C)
            or (module.transposed and k.out_coords is inp.C and k.in_coords is output.C)))
        total.append(int(kmap.pairs.offsets[-1]) * module.in_channels * module.out_channels)
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, Conv3d)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return int(sum(total))


def variants(key: str, w) -> Dict[str, Variant]:
    out = {"default": Variant(copy.deepcopy(w.ours), None, ("inference", "training"))}
    for mode in ("inference", "training"):
        path = TUNED.get((key, mode))
        if path is not None:
            model = copy.deepcopy(w.ours)
            apply_tuned(model, os.path.join(ROOT, path), strict=False)
            out[f"tuned-{mode}"] = Variant(model, None, (mode,))
    out["fused"] = Variant(fuse(w.ours), None, ("inference",))
    out["bf16"] = Variant(copy.deepcopy(w.ours), torch.bfloat16, ("inference", "training"))
    out["fused-bf16"] = Variant(fuse(w.ours), torch.bfloat16, ("inference",))
    return out


def check(w, ours: Dict[str, Variant]) -> dict:
    """Every variant's inference output vs spconv's at 1 thread; bf16 argmax agreement."""
    result = {"output_rel_err": {}, "tolerance": TOLERANCE}
    with num_threads(1), torch.no_grad():
        w.spconv.eval()
        sp_out = w.spconv_output(w.spconv(w.spconv_input("cpu")))
        outs = {}
        for name, v in ours.items():
            v.model.eval()
            with v.context():
                out = w.ours_output(v.model(w.ours_input("cpu")))
            outs[name] = out
            err = compare_outputs(w, (out[0], out[1].float()), sp_out)
            result["output_rel_err"][name] = err
            tol = TOLERANCE["bfloat16" if v.dtype is not None else "float32"]
            if not err < tol:
                raise AssertionError(f"{w.name} {name}: output rel. error {err:.2e} vs spconv (tolerance {tol})")
    if w.kind == "minkunet":
        ref = outs["default"][1].argmax(1)
        result["bf16_argmax_agreement"] = float((outs["bf16"][1].float().argmax(1) == ref).double().mean())
    return result


def model_tasks(w, ours: Dict[str, Variant], optimizers, threads: int, mode: str) -> dict:
    training = mode == "training"

    def runner(v: Variant, optimizer, to_features, t, training=training):
        def infer(x):
            with num_threads(t), torch.no_grad(), v.context():
                to_features(v.model(x))

        def train(x):
            with num_threads(t):
                optimizer.zero_grad(set_to_none=True)
                with v.context():
                    out = to_features(v.model(x))
                w.loss(out.float()).backward()
                optimizer.step()
        return train if training else infer

    tasks = {}
    for name, v in ours.items():
        if mode in v.modes:
            v.model.train(training)
            tasks[f"ours-{name}"] = (runner(v, optimizers.get(name), lambda o: w.ours_output(o)[1], threads),
                                     lambda: w.ours_input("cpu"))
    if training:
        # The default's inference once more in the training rounds, so that the step / inference
        # ratio compares times of the same rounds (free of the drift between the two phases). It
        # runs a copy that is never trained: the trained model's next inference would also repack
        # its changed weights (~4 %), which a deployed model does once.
        frozen = ours[SAME_ROUND_INFERENCE]
        frozen.model.eval()
        infer = runner(frozen, None, lambda o: w.ours_output(o)[1], threads, training=False)
        tasks[f"ours-{SAME_ROUND_INFERENCE}"] = (infer, lambda: w.ours_input("cpu"))
    w.spconv.train(training)
    sp = lambda o: w.spconv_output(o)[1]  # noqa: E731
    spconv_runner = Variant(w.spconv, None, ())
    for t in sorted({1, threads}):
        tasks[f"spconv@{t}t"] = (runner(spconv_runner, optimizers["spconv"], sp, t), lambda: w.spconv_input("cpu"))
    return tasks


def run_model(key: str, args, bar) -> dict:
    w = WORKLOADS[key]()
    ours = variants(key, w)
    correctness = check(w, ours)
    ours[SAME_ROUND_INFERENCE] = Variant(copy.deepcopy(w.ours), None, ())  # model_tasks' same-round inference
    macs = conv_macs(ours["default"].model.eval(), w.ours_input("cpu"))
    optimizers = {n: torch.optim.SGD(v.model.parameters(), lr=LR, momentum=MOMENTUM)
                  for n, v in ours.items() if "training" in v.modes}
    optimizers["spconv"] = torch.optim.SGD(w.spconv.parameters(), lr=LR, momentum=MOMENTUM)
    row = {"model": w.name, "key": key, "voxels": int(len(w.coords)), "parameters": w.parameters,
           "conv_macs": macs, "correctness": correctness, "timings": {}, "roofline_s": {}}
    row["mm_rate_flops"] = {}
    for mode in ("inference", "training"):
        bar.set_description(f"{w.name}: {mode}")
        mm, mm_flops = mm_tasks(args.threads)
        times = interleaved_times({**model_tasks(w, ours, optimizers, args.threads, mode), **mm}, args.repeats,
                                  args.warmup, on_round=bar.update)
        rates = row["mm_rate_flops"][mode] = mm_rates_from(times, mm_flops)
        row["timings"][mode] = {k: v["median_s"] for k, v in times.items() if k not in mm}
        factor = 3 if mode == "training" else 1
        row["roofline_s"][mode] = {dt: factor * 2.0 * macs / rate for dt, rate in rates.items()}
    row["summary"] = summarize(row)
    return row


def summarize(row) -> dict:
    inf, tr = row["timings"]["inference"], row["timings"]["training"]
    roof_i, roof_t = row["roofline_s"]["inference"], row["roofline_s"]["training"]
    sp2 = lambda t: next(v for k, v in t.items() if k.startswith("spconv@") and k != "spconv@1t")  # noqa: E731
    s = {
        "default_vs_spconv_inference_racy": sp2(inf) / inf["ours-default"],
        "default_vs_spconv1t_inference": inf["spconv@1t"] / inf["ours-default"],
        "bf16_over_fp32_inference": inf["ours-default"] / inf["ours-bf16"],
        "fused_of_roofline": roof_i["float32"] / inf["ours-fused"],
        "default_of_roofline": roof_i["float32"] / inf["ours-default"],
        "fused_bf16_of_bf16_roofline": roof_i["bfloat16"] / inf["ours-fused-bf16"],
        "train_vs_spconv_racy": sp2(tr) / tr["ours-default"],
        "train_vs_spconv1t": tr["spconv@1t"] / tr["ours-default"],
        "train_over_3x_inference": tr["ours-default"] / (3 * tr[f"ours-{SAME_ROUND_INFERENCE}"]),
        "train_over_3x_inference_across_phases": tr["ours-default"] / (3 * inf["ours-default"]),
        "train_of_roofline": roof_t["float32"] / tr["ours-default"],
        "bf16_over_fp32_training": tr["ours-default"] / tr["ours-bf16"],
    }
    for mode, t in (("inference", inf), ("training", tr)):
        if f"ours-tuned-{mode}" in t:
            s[f"tuned_vs_default_{mode}"] = t["ours-default"] / t[f"ours-tuned-{mode}"]
    return s


# --- kernel maps ---------------------------------------------------------------------------------

def minkunet_maps(coords: torch.Tensor, shape) -> List[dict]:
    """The maps of a MinkUNet forward: (name, coordinate set, geometry, kind, range), in order."""
    levels, shapes = [coords], [tuple(shape)]
    down = ConvGeometry.make(2, stride=2)
    for _ in range(4):
        k = strided_map(KernelMapCache(), levels[-1], down, "spconv", shapes[-1])
        levels.append(k.out_coords)
        shapes.append(k.out_range)
    maps = []
    for i, (c, s) in enumerate(zip(levels, shapes)):
        maps.append({"name": f"subm k3 s{2 ** i}", "coords": c, "range": s, "kind": "subm"})
        if i < 4:
            maps.append({"name": f"down k2s2 s{2 ** i}>{2 ** (i + 1)}", "coords": c, "range": s, "kind": "down"})
    return maps


def map_tasks(maps, threads: int):
    import spconv.pytorch.ops as spconv_ops
    from spconv.core import ConvAlgo
    subm, down = ConvGeometry.make(3), ConvGeometry.make(2, stride=2)
    tasks = {}
    for m in maps:
        c, rng = m["coords"], m["range"]
        batch = int(c[:, 0].max()) + 1

        def ours(m=m, c=c, rng=rng):
            cache = KernelMapCache()
            k = (submanifold_map(cache, c, subm, rng) if m["kind"] == "subm"
                 else strided_map(cache, c, down, "spconv", rng))
            k.pairs_sorted_by("out")

        def theirs(m=m, c=c, rng=rng, batch=batch):
            if m["kind"] == "subm":
                spconv_ops.get_indice_pairs(c, batch, list(rng), ConvAlgo.Native, [3, 3, 3], [1, 1, 1], [1, 1, 1],
                                            [1, 1, 1], [0, 0, 0], True, False)
            else:
                spconv_ops.get_indice_pairs(c, batch, list(rng), ConvAlgo.Native, [2, 2, 2], [2, 2, 2], [0, 0, 0],
                                            [1, 1, 1], [0, 0, 0], False, False)
        for t in sorted({1, threads}):
            tasks[f"{m['name']}|ours@{t}t"] = (lambda fn=ours, t=t: _in_threads(fn, t), None)
            tasks[f"{m['name']}|spconv@{t}t"] = (lambda fn=theirs, t=t: _in_threads(fn, t), None)
    return tasks


def _in_threads(fn, t):
    with num_threads(t):
        fn()


def run_maps(args, bar) -> dict:
    from common import lidar_batch
    coords, shape = lidar_batch(64, 0.05, [0])
    shape = [-(-s // 16) * 16 for s in shape]
    maps = minkunet_maps(coords, shape)
    bar.set_description("kernel maps")
    times = interleaved_times(map_tasks(maps, args.threads), args.map_repeats, args.warmup, on_round=bar.update)
    rows = []
    for m in maps:
        t = {k.split("|")[1]: v["median_s"] for k, v in times.items() if k.startswith(m["name"] + "|")}
        rows.append({"map": m["name"], "voxels": int(len(m["coords"])), "seconds": t,
                     f"vs_spconv@{args.threads}t": t[f"spconv@{args.threads}t"] / t[f"ours@{args.threads}t"],
                     "vs_spconv@1t": t["spconv@1t"] / t["ours@1t"]})
    total = {k: sum(r["seconds"][k] for r in rows) for k in rows[0]["seconds"]}
    return {"maps": rows, "total_seconds": total, "repeats": args.map_repeats,
            "total_vs_spconv": total[f"spconv@{args.threads}t"] / total[f"ours@{args.threads}t"]}


# --- main ----------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_round_arguments(parser)
    parser.add_argument("--models", default="minkunet0.5,minkunet1.0,centerpoint",
                        help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    parser.add_argument("--no-maps", action="store_true", help="skip the kernel-map comparison")
    parser.add_argument("--map-repeats", type=int, default=25,
                        help="timed rounds of the kernel-map comparison (default 25: a round takes well under a "
                             "second, and a map of a few thousand voxels needs many rounds for a steady median)")
    parser.add_argument("--quick", action="store_true", help="MinkUNet 0.5x only, 2 rounds")
    add_output_arguments(parser, "e2e_cpu")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.models = min(args.repeats, 2), "minkunet0.5"
        args.map_repeats = min(args.map_repeats, 2)
    keys = [k for k in args.models.split(",") if k]
    if not keys or any(k not in WORKLOADS for k in keys):
        parser.error(f"--models: choose from {', '.join(WORKLOADS)}")
    check_round_arguments(parser, args)
    if args.map_repeats < 1:
        parser.error("--map-repeats must be >= 1")
    out = output_dir(args, "e2e_cpu")
    patch_spconv_cpu_backward()
    started = time.perf_counter()
    report = {"benchmark": "e2e_cpu", "description": __doc__, "machine": machine_info(), "threads": args.threads,
              "repeats": args.repeats, "warmup": args.warmup, "cpu_bf16_dot": ops.cpu_bf16_dot(),
              "targets": TARGETS, "models": []}
    report["mm_rate_flops_at_start"] = mm_rates(args.threads)  # for reference; rooflines use the in-round rates
    report["onednn_bf16"] = cpu_bf16.ONEDNN_BF16
    report["cpu_kernels"] = tsp_backends.cpu_kernels
    rounds = len(keys) * 2 * (args.repeats + args.warmup) + (0 if args.no_maps else args.map_repeats + args.warmup)
    with tqdm(total=rounds, unit="round", file=sys.stderr) as bar:
        for key in keys:
            report["models"].append(run_model(key, args, bar))
            write_json(os.path.join(out, "e2e_cpu.json"), report)
        if not args.no_maps:
            report["kernel_maps"] = run_maps(args, bar)
    report["machine"]["loadavg_at_end"] = load_average()
    report["wall_seconds"] = time.perf_counter() - started
    write_json(os.path.join(out, "e2e_cpu.json"), report)
    print_report(report)
    plot(report, os.path.join(out, "e2e_cpu.png"))
    print(f"\nwrote {out}/e2e_cpu.json and .png ({report['wall_seconds']:.0f} s)")
    return 0


def print_report(report) -> None:
    m, t = report["machine"], report["threads"]
    print(f"\n{m['cpu_model']}, {t} threads, torch {m['torch']}, spconv {m['spconv']}, git {m['git_revision']}, "
          f"register kernels: {report['cpu_kernels']}, bf16 dot kernels: {report['cpu_bf16_dot']}; "
          f"load {m['loadavg_at_start']} -> {m['loadavg_at_end']}")
    bf16_note = "" if report["onednn_bf16"] else " (ATen's bf16 GEMM is emulated on this CPU: the float32 rate)"
    start = report["mm_rate_flops_at_start"]
    print(f"torch.mm 2048^2 at the start: float32 {start['float32'] / 1e9:.0f} GFLOP/s, bfloat16 "
          f"{start['bfloat16'] / 1e9:.0f} GFLOP/s{bf16_note} (rooflines: the rate in each model's rounds)")
    for row in report["models"]:
        print(f"\n{row['model']}: {row['voxels']} voxels, {row['conv_macs'] / 1e9:.2f} GMAC of convs; "
              + ", ".join(f"{k} {v:.1e}" for k, v in row["correctness"]["output_rel_err"].items())
              + (f"; bf16 argmax agreement {row['correctness']['bf16_argmax_agreement']:.4f} (random weights: "
                 "near-tied logits; a trained model's: tests/test_bf16_agreement.py)"
                 if "bf16_argmax_agreement" in row["correctness"] else ""))
        for mode, times in row["timings"].items():
            roof, rate = row["roofline_s"][mode], row["mm_rate_flops"][mode]
            print(f"  {mode:9s} ms: " + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in times.items())
                  + f"; roofline fp32 {roof['float32'] * 1e3:.0f}, bf16 {roof['bfloat16'] * 1e3:.0f} "
                  f"(torch.mm {rate['float32'] / 1e9:.0f} / {rate['bfloat16'] / 1e9:.0f} GFLOP/s in these rounds)")
        print("  " + ", ".join(f"{k} {v:.2f}" for k, v in row["summary"].items()))
    if "kernel_maps" in report:
        km = report["kernel_maps"]
        print(f"\nkernel maps (ms; vs spconv at {t}t and 1t):")
        for r in km["maps"]:
            s = r["seconds"]
            print(f"  {r['map']:<20s} {r['voxels']:>7d} voxels: ours {s[f'ours@{t}t'] * 1e3:6.2f} spconv "
                  f"{s[f'spconv@{t}t'] * 1e3:6.2f} -> {r[f'vs_spconv@{t}t']:.2f}x; 1t {r['vs_spconv@1t']:.2f}x")
        print(f"  all maps: {km['total_vs_spconv']:.2f}x")


def plot(report, path) -> None:
    plt = pyplot()
    if plt is None:
        return
    rows = report["models"]
    maps = report.get("kernel_maps")
    fig, axes = plt.subplots(1, 3 if maps else 2, figsize=(21 if maps else 14, 5))
    # One colour per series in every panel.
    series = sorted({k for r in rows for mode in ("inference", "training") for k in r["timings"][mode]},
                    key=lambda k: (k.startswith("spconv"), k))
    colours = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(series)}
    for ax, mode in zip(axes, ("inference", "training")):
        names = [n for n in series if any(n in r["timings"][mode] for r in rows)]
        x = np.arange(len(rows))
        width = 0.84 / (len(names) + 1)
        for i, n in enumerate(names):
            vals = [r["timings"][mode].get(n, np.nan) * 1e3 for r in rows]
            ax.bar(x + i * width, vals, width, label=n, color=colours[n],
                   hatch="//" if n.startswith("spconv@") and n != "spconv@1t" else None)
        ax.bar(x + len(names) * width, [r["roofline_s"][mode]["float32"] * 1e3 for r in rows], width,
               label="roofline fp32", color="black")
        ax.set_xticks(x + 0.42, [r["model"] for r in rows], fontsize=8)
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.set_title(f"{mode}, {report['threads']} threads (hatched: spconv racy)", fontsize=10)
        ax.legend(fontsize=6)
    if maps:
        ax, t = axes[2], report["threads"]
        x = np.arange(len(maps["maps"]))
        for i, (who, hatch) in enumerate(((f"ours@{t}t", None), (f"spconv@{t}t", "//"))):
            ax.bar(x + i * 0.4, [m["seconds"][who] * 1e3 for m in maps["maps"]], 0.4, label=who, hatch=hatch)
        for xi, m in zip(x, maps["maps"]):
            ax.annotate(f"{m[f'vs_spconv@{t}t']:.1f}x", (xi + 0.2, m["seconds"][f"spconv@{t}t"] * 1e3),
                        ha="center", va="bottom", fontsize=6)
        ax.set_xticks(x + 0.2, [m["map"] for m in maps["maps"]], fontsize=6, rotation=30, ha="right")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.set_title(f"MinkUNet kernel maps, {t} threads, median of {maps.get('repeats', report['repeats'])} "
                     f"rounds (labels: spconv / ours)", fontsize=10)
        ax.legend(fontsize=6)
    fig.suptitle(f"torchsparse_pp vs spconv end to end, {report['machine']['cpu_model']}, "
                 f"{report['machine']['date']}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
