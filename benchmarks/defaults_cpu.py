"""Which dataflow each pass (forward, dgrad, wgrad) should default to on the CPU: every dataflow
config timed per pass on every sparse conv layer of MinkUNet (0.5x) and CenterPoint's
VoxelResBackBone8x, on their real inputs, summed per model.

Workloads (float32, batch 1): MinkUNet(4, 19, cr=0.5) on the generated 64-beam scan (seed 0) at
0.05 m, and VoxelResBackBone8x on the same scan voxelised on CenterPoint's Waymo grid
(benchmarks/models.py builds both). One forward records every Conv3d's input and kernel map
(1x1x1 convs have no map and no dataflow, so they are left out); then for each layer and config
the pass runs through the dataflow module itself (nn.functional.dataflows) on the cached map
and its views: forward(feats, W), dgrad(grad_out, W), wgrad(feats, grad_out), with random
features and gradients of the layer's shapes.

Timing: per layer, all (config, pass) tasks run round-robin (benchmarks/common.py
interleaved_times), --warmup rounds then --repeats rounds, median kept; at --threads threads
(default 2, the machine's cores). Reported per model and pass: each config's total over the
layers, its ratio to the fastest, and the fastest (the per-device default this benchmark
recommends; torchsparse_pp.nn.functional.config.DEVICE_DEFAULTS records the choice, and
docs/benchmarks.md the numbers behind it).

Output: defaults_cpu.json and defaults_cpu.png in a new benchmarks/out/defaults_cpu-<time>/
(git-ignored), --out DIR, or benchmarks/results/ with --publish.

Usage: python benchmarks/defaults_cpu.py [--repeats N] [--warmup N] [--threads T] [--quick]
       [--out DIR | --publish]
"""
import argparse
import os
import sys
from typing import Dict, List

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, add_round_arguments, busy_processes, check_round_arguments,  # noqa: E402
                    interleaved_times, load_average, machine_info, num_threads, output_dir, pyplot, save_figure,
                    write_json)
from models import centerpoint_workload, minkunet_workload  # noqa: E402

from torchsparse_pp.nn import Conv3d  # noqa: E402
from torchsparse_pp.nn.functional import ConvConfig  # noqa: E402
from torchsparse_pp.nn.functional.dataflows import DATAFLOW_MODULES, OrientedMap  # noqa: E402

PASSES = ("forward", "dgrad", "wgrad")
CONFIGS = {
    "gather_scatter": ConvConfig("gather_scatter", backend="native"),
    "gather_scatter(eps=0.5, thresh=32768)": ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=32768,
                                                        backend="native"),
    "fetch_on_demand": ConvConfig("fetch_on_demand", backend="native"),
    "implicit_gemm(unsorted)": ConvConfig("implicit_gemm", sorted=False, split_mask_num=0, backend="native"),
    "implicit_gemm(sorted, split=1)": ConvConfig("implicit_gemm", sorted=True, split_mask_num=1, backend="native"),
    "implicit_gemm(sorted, split=2)": ConvConfig("implicit_gemm", sorted=True, split_mask_num=2, backend="native"),
}
QUICK_CONFIGS = ("gather_scatter", "fetch_on_demand", "implicit_gemm(sorted, split=1)")


def record_layers(model, x) -> List[dict]:
    """Every Conv3d with a kernel map: its name, weight and the map it read (by a forward with
    hooks; the map is the cache entry whose output coordinates are the conv's output's)."""
    seen = []

    def hook(module, inputs, output):
        seen.append((module, inputs[0], output))
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, Conv3d)]
    names = {m: n for n, m in model.named_modules()}
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    layers = []
    for module, inp, out in seen:
        if module.geometry.is_pointwise:
            continue
        kmap = next(k for key, k in inp.cache.maps() if k.geometry == module.geometry and (
            (not module.transposed and k.in_coords is inp.C and k.out_coords is out.C)
            or (module.transposed and k.out_coords is inp.C and k.in_coords is out.C)))
        layers.append({"name": names[module], "module": module, "view": OrientedMap(kmap, module.transposed),
                       "c_in": module.in_channels, "c_out": module.out_channels})
    return layers


def layer_tasks(layer: dict, configs: Dict[str, ConvConfig], gen: torch.Generator, dtype=torch.float32):
    """Tasks ``(config name, pass) -> (fn, None)`` for one layer, operands in ``dtype``."""
    view, w = layer["view"], layer["module"].kernel.detach().to(dtype)
    feats = torch.randn(view.num_src, layer["c_in"], generator=gen).to(dtype)
    grad = torch.randn(view.num_dst, layer["c_out"], generator=gen).to(dtype)
    tasks = {}
    for name, config in configs.items():
        flow = DATAFLOW_MODULES[config.dataflow]
        flow.forward(feats, w, view, config, False)  # builds the views this config reads, untimed
        flow.dgrad(grad, w, view, config, False)
        tasks[(name, "forward")] = (lambda f=flow, c=config: f.forward(feats, w, view, c, False), None)
        tasks[(name, "dgrad")] = (lambda f=flow, c=config: f.dgrad(grad, w, view, c, False), None)
        tasks[(name, "wgrad")] = (lambda f=flow, c=config: f.wgrad(feats, grad, view, c, False), None)
    return tasks


def run_model(workload, configs, args, bar) -> dict:
    model = workload.ours.eval()
    layers = record_layers(model, workload.ours_input("cpu"))
    gen = torch.Generator().manual_seed(7)
    rows = []
    totals = {p: {n: 0.0 for n in configs} for p in PASSES}
    for layer in layers:
        tasks = layer_tasks(layer, configs, gen)
        with num_threads(args.threads):
            times = interleaved_times({f"{n}|{p}": t for (n, p), t in tasks.items()}, args.repeats, args.warmup)
        row = {"layer": layer["name"], "c_in": layer["c_in"], "c_out": layer["c_out"],
               "pairs": int(layer["view"].kmap.pairs.offsets[-1]), "seconds": {}}
        for key, stats in times.items():
            name, p = key.split("|")
            row["seconds"].setdefault(p, {})[name] = stats["median_s"]
            totals[p][name] += stats["median_s"]
        rows.append(row)
        bar.update(1)
    best = {p: min(totals[p], key=totals[p].get) for p in PASSES}
    return {"model": workload.name, "layers": rows, "total_seconds": totals, "fastest": best}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_round_arguments(parser)
    parser.add_argument("--quick", action="store_true", help=f"3 configs ({', '.join(QUICK_CONFIGS)}), 3 repeats")
    add_output_arguments(parser, "defaults_cpu")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 3)
    check_round_arguments(parser, args)
    out = output_dir(args, "defaults_cpu")
    configs = {n: c for n, c in CONFIGS.items() if not args.quick or n in QUICK_CONFIGS}
    workloads = [minkunet_workload(0.5), centerpoint_workload()]
    total_layers = sum(len(record_layers(w.ours.eval(), w.ours_input("cpu"))) for w in workloads)
    report = {"benchmark": "defaults_cpu", "description": __doc__, "machine": machine_info(),
              "threads": args.threads, "repeats": args.repeats, "warmup": args.warmup,
              "configs": {n: {k: v for k, v in vars(c).items() if v is not None} for n, c in configs.items()},
              "load_before": load_average(), "busy_before": busy_processes(), "models": []}
    with tqdm(total=total_layers, desc="layers", unit="layer", file=sys.stderr) as bar:
        for w in workloads:
            report["models"].append(run_model(w, configs, args, bar))
    report["load_after"] = load_average()
    overall = {p: {n: sum(m["total_seconds"][p][n] for m in report["models"]) for n in configs} for p in PASSES}
    report["overall_seconds"] = overall
    report["recommended"] = {p: min(overall[p], key=overall[p].get) for p in PASSES}
    write_json(os.path.join(out, "defaults_cpu.json"), report)
    print_table(report)
    plot(report, os.path.join(out, "defaults_cpu.png"))
    print(f"\nwrote {out}/defaults_cpu.json and .png")
    return 0


def print_table(report) -> None:
    names = list(report["configs"])
    for m in report["models"] + [{"model": "both models", "total_seconds": report["overall_seconds"],
                                  "fastest": report["recommended"]}]:
        print(f"\n{m['model']}: total ms over its conv layers ({report['threads']} threads), x fastest")
        print(f"{'config':<40}" + "".join(f"{p:>18}" for p in PASSES))
        for n in names:
            cells = []
            for p in PASSES:
                t, best = m["total_seconds"][p][n], min(m["total_seconds"][p].values())
                cells.append(f"{t * 1e3:9.1f} ({t / best:4.2f}x)")
            print(f"{n:<40}" + "".join(f"{c:>18}" for c in cells))
        print("fastest: " + ", ".join(f"{p} {m['fastest'][p]}" for p in PASSES))


def plot(report, path) -> None:
    plt = pyplot()
    if plt is None:
        return
    names = list(report["configs"])
    fig, axes = plt.subplots(1, len(report["models"]), figsize=(6 * len(report["models"]), 4), squeeze=False)
    for ax, m in zip(axes[0], report["models"]):
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            ax.bar([j + i * width for j in range(len(PASSES))], [m["total_seconds"][p][n] * 1e3 for p in PASSES],
                   width, label=n)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(PASSES))], PASSES)
        ax.set_ylabel("ms, sum over conv layers")
        ax.set_title(f"{m['model']} ({report['threads']} threads)", fontsize=9)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
