"""End-to-end models, torchsparse_pp vs the same architectures in spconv 2.3.8: inference and a
training step of MinkUNet (0.5x, 1.0x) and CenterPoint's VoxelResBackBone8x.

Workloads (float32, batch 1):
- MinkUNet(in_channels=4, num_classes=19, cr=0.5 and 1.0) on the generated 64-beam scan (seed 0)
  voxelised at 0.05 m (benchmarks/common.py lidar_batch), features drawn from N(0, 1); the
  spatial shape is rounded up to a multiple of 16 so the four k2 s2 downsamples drop no voxel
  (both libraries get the same shape: ours as spatial_range, spconv as spatial_shape).
- VoxelResBackBone8x(in_channels=5) on the same scan voxelised by CenterPoint's mean VFE on the
  Waymo-like grid (CenterPointConfig.waymo(): 0.1 x 0.1 x 0.15 m in [-75.2, 75.2]^2 x [-2, 4]);
  the fifth point feature (Waymo's elongation) is drawn uniformly from [0, 1).

spconv models (benchmarks/spconv_twins.py): the same layer lists in the same order, built from
SubMConv3d / SparseConv3d / SparseInverseConv3d with indice_key (map reuse like our cache),
BatchNorm1d, ReLU and SparseSequential; equal parameter counts are asserted, and our weights
(random, BatchNorm statistics and affine parameters randomised too) are copied into them.

Correctness before timing, at 1 thread (spconv's only race-free CPU setting): inference outputs
(rows matched by coordinates) of ours (every config) vs spconv must agree to a relative error
||ours - spconv|| / ||spconv|| < 1e-4, else the run stops; one training-mode forward + backward
in float64 must give the same loss and conv-weight gradients (relative error < 1e-9; in float32
these deep random networks' gradients carry ~1e-2 of rounding in either library).
spconv's >1-thread output deviation from its 1-thread output is recorded ("race").

Timing: inference = forward under torch.no_grad() in eval mode; training step = zero_grad,
forward, loss (cross-entropy on random labels for MinkUNet, mean of squared outputs for the
backbone), backward, SGD step (lr 1e-3, momentum 0.9), in train mode. Every timed call gets a
fresh SparseTensor / SparseConvTensor (made untimed), so kernel-map building is included.
Contenders, round-robin per round (benchmarks/common.py interleaved_times), median of --repeats
rounds after --warmup: ours with the default config (no config set: the per-device default,
fetch_on_demand on the CPU) and with
ConvConfig("fetch_on_demand") for all passes, each at 1 and 2 threads; spconv at 1 thread and at
2 threads (RACY: its CPU path gives wrong results there; its fastest setting all the same).
spconv's CPU backward asks torch.cuda for a stream before branching to its CPU path, which raises
on a CPU-only torch; the stream is unused on the CPU path, so a dummy one stands in (as in
tests/test_spconv.py).

Reported: speedup = t_spconv / t_ours (> 1: ours faster) for ours 2t vs spconv 2t (racy), ours 2t
vs spconv 1t and ours 1t vs spconv 1t, per model, config and mode.

--device cuda runs the same on a GPU (ours default and implicit_gemm sorted, vs spconv built for
CUDA; no thread counts; torch.cuda.synchronize() ends each timed call; the float64 gradient check
runs on CPU copies): written, not yet run.
"""
import argparse
import copy
import os
import sys
import time
from typing import Callable, Dict, List

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, busy_processes, interleaved_times, lidar_batch, load_average,  # noqa: E402
                    machine_info, num_threads, output_dir, same_coord_set, save_figure, sorted_rows, write_json)

from torchsparse_pp import SparseTensor  # noqa: E402
from torchsparse_pp.data.synthetic import generate_scan  # noqa: E402
from torchsparse_pp.models import MinkUNet, VoxelResBackBone8x  # noqa: E402
from torchsparse_pp.models.centerpoint import CenterPointConfig  # noqa: E402
from torchsparse_pp.models.centerpoint.voxelize import voxelize  # noqa: E402
from torchsparse_pp.nn import BatchNorm, Conv3d  # noqa: E402
from torchsparse_pp.nn.functional import ConvConfig  # noqa: E402

BEAMS, VOXEL, SCAN_SEED = 64, 0.05, 0
NUM_CLASSES, IN_CHANNELS = 19, 4
TOLERANCE = 1e-4  # output, relative (norm) error vs spconv at 1 thread
GRAD_TOLERANCE = 1e-9  # float64 training gradients vs spconv's
LR, MOMENTUM = 1e-3, 0.9
CPU_CONFIGS = {"default": None, "fod": ConvConfig("fetch_on_demand")}
CUDA_CONFIGS = {"default": None, "igemm-sorted": ConvConfig("implicit_gemm", sorted=True)}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


# --- workloads ----------------------------------------------------------------------------------

class Workload:
    """One model on one input: both libraries' models, inputs and losses."""

    def __init__(self, name: str, ours: nn.Module, kind: str, twin_kwargs: dict, coords: torch.Tensor,
                 feats: torch.Tensor, shape: List[int], labels: torch.Tensor = None):
        from spconv_twins import build_spconv_twin
        self.name, self.kind = name, kind
        self.coords, self.feats, self.shape, self.labels = coords, feats, [int(s) for s in shape], labels
        randomise_batchnorm(ours, seed=1)
        self.ours = ours
        self.spconv, self.parameters = build_spconv_twin(ours, kind, **twin_kwargs)

    def ours_input(self, device, dtype=torch.float32) -> SparseTensor:
        return SparseTensor(self.feats.to(device, dtype), self.coords.to(device), spatial_range=self.shape)

    def spconv_input(self, device, dtype=torch.float32):
        import spconv.pytorch as spconv
        return spconv.SparseConvTensor(self.feats.to(device, dtype), self.coords.to(device), self.shape,
                                       int(self.coords[:, 0].max()) + 1)

    def ours_output(self, out):
        """(coords, features) of an output, coords None for per-input-row logits."""
        return (None, out) if self.kind == "minkunet" else (out.C, out.F)

    def spconv_output(self, out):
        return (None, out) if self.kind == "minkunet" else (out.indices, out.features)

    def loss(self, features: torch.Tensor) -> torch.Tensor:
        if self.kind == "minkunet":
            return nn.functional.cross_entropy(features, self.labels.to(features.device))
        return features.square().mean()  # independent of row order


def randomise_batchnorm(model: nn.Module, seed: int) -> None:
    """BatchNorm affine parameters and running statistics away from their identity defaults, so
    the correctness check exercises them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, BatchNorm):
                n = m.num_features
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(0.1 * torch.randn(n, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(n, generator=g))
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)


def minkunet_workload(cr: float) -> Workload:
    coords, shape = lidar_batch(BEAMS, VOXEL, [SCAN_SEED])
    shape = [-(-s // 16) * 16 for s in shape]  # four k2 s2 downsamples keep every voxel
    g = torch.Generator().manual_seed(100)
    feats = torch.randn(len(coords), IN_CHANNELS, generator=g)
    labels = torch.randint(0, NUM_CLASSES, (len(coords),), generator=g)
    torch.manual_seed(10)
    ours = MinkUNet(IN_CHANNELS, NUM_CLASSES, cr)
    return Workload(f"MinkUNet {cr}x", ours, "minkunet",
                    dict(in_channels=IN_CHANNELS, num_classes=NUM_CLASSES, cr=cr), coords, feats, shape, labels)


def centerpoint_workload() -> Workload:
    config = CenterPointConfig.waymo()
    points = generate_scan(BEAMS, seed=SCAN_SEED)["points"]
    extra = np.random.default_rng(200).uniform(0.0, 1.0, (len(points), config.point_features - points.shape[1]))
    x = voxelize([np.concatenate([points, extra.astype(np.float32)], 1)], config)
    torch.manual_seed(20)
    ours = VoxelResBackBone8x(config.point_features)
    return Workload("CenterPoint backbone (Waymo grid)", ours, "centerpoint_backbone",
                    dict(in_channels=config.point_features), x.C, x.F, list(config.sparse_shape))


WORKLOADS: Dict[str, Callable[[], Workload]] = {
    "minkunet0.5": lambda: minkunet_workload(0.5),
    "centerpoint": centerpoint_workload,
    "minkunet1.0": lambda: minkunet_workload(1.0),
}


# --- correctness --------------------------------------------------------------------------------

def patch_spconv_cpu_backward() -> bool:
    """spconv 2.3.8's backward calls get_current_stream() (torch.cuda) before its CPU branch; on a
    CPU-only torch that raises. The stream is unused on the CPU path: stand a dummy in."""
    import spconv.pytorch.ops as spconv_ops
    if torch.cuda.is_available():
        return False
    spconv_ops.get_current_stream = lambda: 0
    return True


def compare_outputs(w: Workload, a, b) -> float:
    """||a - b|| / ||b|| of two outputs given as (coords or None, features), rows matched by
    coordinates when there are any."""
    (ac, af), (bc, bf) = a, b
    if ac is None:
        return rel_err(af, bf)
    if not same_coord_set(ac.cpu().int(), bc.cpu().int()):
        raise AssertionError(f"{w.name}: output coordinate sets differ ({len(ac)} vs {len(bc)} rows)")
    return rel_err(sorted_rows(ac.cpu(), af.cpu()), sorted_rows(bc.cpu(), bf.cpu()))


def check(w: Workload, ours_models: Dict[str, nn.Module], device, cpu: bool) -> Dict[str, object]:
    """Inference outputs of every config vs spconv (1 thread, float32; raises above TOLERANCE),
    spconv's race at 2 threads, and one training-mode forward + backward of the default config vs
    spconv in float64: in float32 the gradients of these deep random networks carry ~1e-2 of
    rounding in either library (measured: both differ from their float64 gradients by that
    much), which would hide a real difference; in float64 equal work agrees to ~1e-13."""
    from spconv_twins import ours_kernel_to_spconv, SPCONV_CONVS
    result = {"output_rel_err": {}, "tolerance": TOLERANCE}
    with (num_threads(1) if cpu else _null()), torch.no_grad():
        w.spconv.eval()
        sp_out = w.spconv_output(w.spconv(w.spconv_input(device)))
        for name, model in ours_models.items():
            model.eval()
            err = compare_outputs(w, w.ours_output(model(w.ours_input(device))), sp_out)
            result["output_rel_err"][name] = err
            if not err < TOLERANCE:
                raise AssertionError(f"{w.name}, ours {name}: output relative error {err:.2e} vs spconv "
                                     f"(tolerance {TOLERANCE}); the timings would not compare equal work")
    if cpu:
        with num_threads(2), torch.no_grad():
            result["spconv_race_2t_rel_err"] = compare_outputs(
                w, w.spconv_output(w.spconv(w.spconv_input(device))), sp_out)

    # Training gradients on float64 CPU copies (the timed models keep their state; spconv's GPU
    # kernels have no float64, so with --device cuda this checks the architectures, the float32
    # outputs above the GPU kernels).
    cpu_device = torch.device("cpu")
    ours = copy.deepcopy(ours_models["default"]).to(cpu_device, torch.float64).train()
    theirs = copy.deepcopy(w.spconv).to(cpu_device, torch.float64).train()
    with num_threads(1):
        loss_ours = w.loss(w.ours_output(ours(w.ours_input(cpu_device, torch.float64)))[1])
        loss_ours.backward()
        loss_sp = w.loss(w.spconv_output(theirs(w.spconv_input(cpu_device, torch.float64)))[1])
        loss_sp.backward()
    a = [m for m in ours.modules() if isinstance(m, Conv3d)]
    b = [m for m in theirs.modules() if isinstance(m, SPCONV_CONVS)]
    errs = [rel_err(ours_kernel_to_spconv(x.kernel.grad, y), y.weight.grad) for x, y in zip(a, b)]
    result["train_float64"] = {
        "loss_ours": loss_ours.item(), "loss_spconv": loss_sp.item(),
        "loss_rel_err": abs(loss_ours.item() - loss_sp.item()) / abs(loss_sp.item()),
        "conv_weight_grad_rel_err_max": max(errs), "conv_weight_grad_rel_err_median": float(np.median(errs)),
        "conv_layers": len(errs), "tolerance": GRAD_TOLERANCE}
    if not max(errs) < GRAD_TOLERANCE:
        raise AssertionError(f"{w.name}: float64 conv weight gradients differ from spconv's by up to "
                             f"{max(errs):.1e} (tolerance {GRAD_TOLERANCE})")
    return result


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- timing -------------------------------------------------------------------------------------

def make_tasks(w: Workload, ours_models: Dict[str, nn.Module], optimizers: Dict[str, torch.optim.Optimizer],
               threads: List[int], device, training: bool) -> Dict[str, tuple]:
    """name -> (fn, setup) for interleaved_times; setup makes the fresh input (untimed)."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def runner(model, optimizer, to_features, t):
        def infer(x):
            with (num_threads(t) if t else _null()), torch.no_grad():
                to_features(model(x))
                sync()

        def train(x):
            with (num_threads(t) if t else _null()):
                optimizer.zero_grad(set_to_none=True)
                w.loss(to_features(model(x))).backward()
                optimizer.step()
                sync()
        return train if training else infer

    tasks = {}
    ours_features = lambda out: w.ours_output(out)[1]  # noqa: E731
    sp_features = lambda out: w.spconv_output(out)[1]  # noqa: E731
    for t in threads:
        tag = f"@{t}t" if t else ""
        for name, model in ours_models.items():
            tasks[f"ours-{name}{tag}"] = (runner(model, optimizers[name], ours_features, t),
                                          lambda: w.ours_input(device))
        tasks[f"spconv{tag}"] = (runner(w.spconv, optimizers["spconv"], sp_features, t),
                                 lambda: w.spconv_input(device))
    return tasks


def speedups(times: Dict[str, dict], configs, threads: List[int]) -> Dict[str, Dict[str, float]]:
    """t_spconv / t_ours per config: ours tt vs spconv tt (racy), ours tt vs spconv 1t, 1t vs 1t."""
    out = {}
    for name in configs:
        if threads == [None]:
            out[name] = {"ours_vs_spconv": times["spconv"]["median_s"] / times[f"ours-{name}"]["median_s"]}
            continue
        tt = max(threads)
        t_sp = lambda t: times[f"spconv@{t}t"]["median_s"]  # noqa: E731
        t_ours = lambda t: times[f"ours-{name}@{t}t"]["median_s"]  # noqa: E731
        row = {f"ours{tt}t_vs_spconv{tt}t" + ("_racy" if tt > 1 else ""): t_sp(tt) / t_ours(tt),
               f"ours{tt}t_vs_spconv1t": t_sp(1) / t_ours(tt)}
        if tt != 1:
            row["ours1t_vs_spconv1t"] = t_sp(1) / t_ours(1)
        out[name] = row
    return out


def run_workload(w: Workload, configs, threads, device, args, bar) -> Dict[str, object]:
    cpu = device.type == "cpu"
    w.ours.to(device)
    w.spconv.to(device)
    ours_models = {}
    for name, cfg in configs.items():
        model = copy.deepcopy(w.ours)
        for m in model.modules():
            if isinstance(m, Conv3d):
                m.config = cfg
        ours_models[name] = model
    bar.set_description(f"{w.name}: checking")
    correctness = check(w, ours_models, device, cpu)
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM) for name, m in ours_models.items()}
    optimizers["spconv"] = torch.optim.SGD(w.spconv.parameters(), lr=LR, momentum=MOMENTUM)

    row = {"model": w.name, "voxels": int(len(w.coords)), "spatial_shape": w.shape, "parameters": w.parameters,
           "correctness": correctness, "timings": {}, "speedup": {}}
    for mode in ("inference", "training"):
        training = mode == "training"
        for m in [*ours_models.values(), w.spconv]:
            m.train(training)
        bar.set_description(f"{w.name}: {mode}")
        tasks = make_tasks(w, ours_models, optimizers, threads, device, training)
        times = interleaved_times(tasks, args.repeats, args.warmup, on_round=bar.update)
        row["timings"][mode] = times
        row["speedup"][mode] = speedups(times, configs, threads)
    return row


# --- main ---------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 7; 2 with --quick)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default 1)")
    parser.add_argument("--threads", default="1,2", help="CPU thread counts, comma-separated (1 is always added)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--models", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    parser.add_argument("--quick", action="store_true", help="MinkUNet 0.5x and the backbone only, 2 rounds")
    add_output_arguments(parser, "models")
    args = parser.parse_args(argv)
    args.repeats = args.repeats if args.repeats is not None else (2 if args.quick else 7)
    args.warmup = args.warmup if args.warmup is not None else 1
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    try:
        import spconv_twins  # noqa: F401  (imports spconv.pytorch)
    except ImportError as e:
        sys.exit(f"spconv is required ({e}): pip install spconv==2.3.8 (spconv-cu126 for --device cuda)")
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda: torch sees no GPU here")
        threads, configs = [None], CUDA_CONFIGS
    else:
        threads, configs = sorted({1, *(int(t) for t in args.threads.split(","))}), CPU_CONFIGS
    patched = patch_spconv_cpu_backward() if device.type == "cpu" else False

    started = time.perf_counter()
    machine = machine_info()
    if machine["loadavg_at_start"] and machine["loadavg_at_start"][0] > 0.5:
        print(f"warning: load average {machine['loadavg_at_start']}: other work on this machine will "
              "skew the timings", file=sys.stderr)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(WORKLOADS)}")
    if args.quick:
        names = [n for n in names if n != "minkunet1.0"]
    builders: List[Callable[[], Workload]] = [WORKLOADS[n] for n in names]

    rows = []
    report = {
        "benchmark": f"models_{device.type}",
        "description": __doc__,
        "machine": machine,
        "device": device.type,
        "threads": threads,
        "spconv_racy_thread_counts": [t for t in threads if t and t > 1],
        "configs": {n: (vars(c).copy() if c is not None else "default (ConvConfig())") for n, c in configs.items()},
        "spconv_cpu_backward_stream_patched": patched,
        "workload": {"beams": BEAMS, "scan_seed": SCAN_SEED, "batch": 1, "dtype": "float32",
                     "minkunet_voxel_m": VOXEL, "centerpoint_config": "CenterPointConfig.waymo()",
                     "optimizer": f"SGD lr {LR} momentum {MOMENTUM}"},
        "models_requested": names, "quick": args.quick, "repeats": args.repeats, "warmup": args.warmup,
        "notes": ("Shared 2-vCPU VM: other tenants and other work in this repository load the machine, "
                  "so absolute times move by 10-20 % or more between runs; ratios come from contenders "
                  "interleaved round by round in one run. spconv at >1 thread is racy (wrong results)."
                  if device.type == "cpu" else "GPU run; not cross-checked on this machine."),
        "models": rows,
        "complete": False,
        "wall_seconds": None,
    }
    stem = os.path.join(output_dir(args, "models"), f"models_{device.type}")
    total = len(builders) * 2 * (args.repeats + args.warmup)
    with tqdm(total=total, desc="rounds", unit="round") as bar:
        for build in builders:
            w = build()
            rows.append(run_workload(w, configs, threads, device, args, bar))
            del w
            # Written after every model, so a run cut short keeps what it finished.
            report["machine"] = dict(machine, loadavg_at_end=load_average(), busy_processes_at_end=busy_processes(),
                                     cuda_device=torch.cuda.get_device_name() if device.type == "cuda" else None)
            report["complete"] = len(rows) == len(builders)
            report["wall_seconds"] = time.perf_counter() - started
            write_json(stem + ".json", report)
            plot(report, stem + ".png")
    print_table(report)
    print(f"\nwrote {stem}.json and {stem}.png ({report['wall_seconds']:.0f} s)")


def print_table(report):
    m = report["machine"]
    print(f"\n{m['cpu_model']} ({m['logical_cpus']} cpus), torch {m['torch']}, spconv {m['spconv']}, "
          f"git {m['git_revision']}; load avg start {m['loadavg_at_start']} end {m['loadavg_at_end']}")
    print(f"median of {report['repeats']} round-robin rounds; fresh inputs (map build included); "
          "speedup = t_spconv / t_ours (> 1: ours faster); spconv >1 thread is RACY")
    for row in report["models"]:
        c = row["correctness"]
        print(f"\n{row['model']}: {row['voxels']} voxels, {row['parameters']:,} parameters; output rel err vs "
              "spconv 1t: " + ", ".join(f"{k} {v:.1e}" for k, v in c["output_rel_err"].items())
              + f"; float64 train grad rel err max {c['train_float64']['conv_weight_grad_rel_err_max']:.1e}"
              + (f"; spconv 2t race {c['spconv_race_2t_rel_err']:.1e}" if "spconv_race_2t_rel_err" in c else ""))
        for mode, times in row["timings"].items():
            print(f"  {mode:9s} ms: " + ", ".join(f"{k} {v['median_s'] * 1e3:.0f}" for k, v in times.items()))
            for name, sp in row["speedup"][mode].items():
                print(f"  {'':9s} {name:>12s}: " + ", ".join(f"{k} {v:.2f}" for k, v in sp.items()))


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["models"]
    modes = ("inference", "training")
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    x = np.arange(len(rows))
    for ax, mode in zip(axes, modes):
        series = [(f"{name}: {tag}", [r["speedup"][mode][name][tag] for r in rows])
                  for name in rows[0]["speedup"][mode] for tag in rows[0]["speedup"][mode][name]]
        width = 0.84 / len(series)
        for i, (label, values) in enumerate(series):
            bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label,
                          edgecolor="black", linewidth=0.3, hatch="//" if "racy" in label else None)
            ax.bar_label(bars, fmt="%.2f", fontsize=6, rotation=90, padding=2)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")  # ratios from ~0.1 to ~30 under load
        ax.set_xticks(x, [f"{r['model']}\n{r['voxels']:,} voxels" for r in rows], fontsize=8)
        ax.set_ylabel("speedup t_spconv / t_ours")
        ax.set_title(f"{mode} ({'forward, no grad' if mode == 'inference' else 'forward + backward + SGD step'})",
                     fontsize=10)
        ax.legend(fontsize=6.5)
        ax.margins(y=0.2)
    m = report["machine"]
    where = m["cpu_model"] if report["device"] == "cpu" else m.get("cuda_device")
    fig.suptitle(f"torchsparse_pp vs spconv {m['spconv']} end to end ({report['device']}), fresh inputs, "
                 f"median of {report['repeats']} — {where}, torch {m['torch']}, {m['date']}, "
                 f"load avg {m['loadavg_at_start']} (hatched: spconv racy)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
