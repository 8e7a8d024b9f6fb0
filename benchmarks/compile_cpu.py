"""torch.compile(fullgraph=True) vs eager on the CPU benchmark scan: MinkUNet 0.5x (and 1.0x) and
CenterPoint's VoxelResBackBone8x, inference and a training step, in one run.

Workloads: those of benchmarks/models.py (the generated 64-beam scan, seed 0; MinkUNet at 0.05 m
with random features and labels; the backbone on CenterPoint's Waymo grid; BatchNorm statistics
randomised), without the spconv twins.

Contenders, each at --threads (default 2):
- eager: the model as it is (default config: fetch_on_demand on the CPU);
- compiled: torch.compile(..., fullgraph=True, backend=--backend (default inductor)). Inference
  compiles the model; the training step compiles forward + loss (backward runs the compiled
  backward graph; zero_grad and the SGD step stay eager in both contenders).
Every timed call gets a fresh SparseTensor (made untimed), so kernel maps are built inside it, in
the graph for the compiled contender. The first compiled call (tracing + code generation) is
timed separately as "compile_s"; inductor's on-disk caches (FX graph / C++ code caches) shorten
it once warm: a cold first run on a 2-core machine takes minutes for a training graph.

Before timing: compiled vs eager outputs (inference, eval mode) must agree to a relative error
< 1e-4, and the training-step losses to < 1e-4, else the run stops.

Timing: round-robin rounds (benchmarks/common.py interleaved_times), median of --repeats after
--warmup. Reported per model and mode: eager and compiled medians and ratio = compiled / eager
(< 1: compiled faster). Output: compile_cpu.json + compile_cpu.png in a new
benchmarks/out/compile_cpu-<time>/, --out DIR, or benchmarks/results/ with --publish.

Usage: python benchmarks/compile_cpu.py [--models minkunet0.5 centerpoint minkunet1.0]
       [--modes inference training] [--repeats N] [--warmup N] [--threads T] [--backend B] [--quick]
       [--out DIR | --publish]
"""
import argparse
import copy
import os
import sys
import time
from typing import Dict

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, interleaved_times, lidar_batch, load_average, machine_info,  # noqa: E402
                    num_threads, output_dir, save_figure, write_json)
from models import BEAMS, IN_CHANNELS, NUM_CLASSES, SCAN_SEED, VOXEL, randomise_batchnorm  # noqa: E402

from torchsparse_pp import SparseTensor  # noqa: E402
from torchsparse_pp.data.synthetic import generate_scan  # noqa: E402
from torchsparse_pp.models import MinkUNet, VoxelResBackBone8x  # noqa: E402
from torchsparse_pp.models.centerpoint import CenterPointConfig  # noqa: E402
from torchsparse_pp.models.centerpoint.voxelize import voxelize  # noqa: E402

TOLERANCE = 1e-4
LR, MOMENTUM = 1e-3, 0.9


class Workload:
    def __init__(self, name, model, coords, feats, shape, loss):
        self.name, self.model, self.coords, self.feats, self.shape, self.loss = name, model, coords, feats, shape, loss

    def input(self) -> SparseTensor:
        return SparseTensor(self.feats.clone(), self.coords.clone(), spatial_range=self.shape)


def minkunet(cr: float) -> Workload:
    coords, shape = lidar_batch(BEAMS, VOXEL, [SCAN_SEED])
    shape = [-(-s // 16) * 16 for s in shape]
    g = torch.Generator().manual_seed(100)
    feats = torch.randn(len(coords), IN_CHANNELS, generator=g)
    labels = torch.randint(0, NUM_CLASSES, (len(coords),), generator=g)
    torch.manual_seed(10)
    model = MinkUNet(IN_CHANNELS, NUM_CLASSES, cr)
    randomise_batchnorm(model, seed=1)
    return Workload(f"MinkUNet {cr}x", model, coords, feats, shape,
                    lambda out: nn.functional.cross_entropy(out, labels))


def centerpoint() -> Workload:
    config = CenterPointConfig.waymo()
    points = generate_scan(BEAMS, seed=SCAN_SEED)["points"]
    extra = np.random.default_rng(200).uniform(0.0, 1.0, (len(points), config.point_features - points.shape[1]))
    x = voxelize([np.concatenate([points, extra.astype(np.float32)], 1)], config)
    torch.manual_seed(20)
    model = VoxelResBackBone8x(config.point_features)
    randomise_batchnorm(model, seed=1)
    return Workload("CenterPoint backbone (Waymo grid)", model, x.C, x.F, list(config.sparse_shape),
                    lambda out: out.square().mean())


WORKLOADS = {"minkunet0.5": lambda: minkunet(0.5), "centerpoint": centerpoint, "minkunet1.0": lambda: minkunet(1.0)}


def _features(out):
    return out.F if isinstance(out, SparseTensor) else out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def run_mode(w: Workload, mode: str, backend: str, repeats: int, warmup: int) -> Dict[str, object]:
    torch._dynamo.reset()
    eager_model, compiled_model = copy.deepcopy(w.model), copy.deepcopy(w.model)
    result: Dict[str, object] = {}
    if mode == "inference":
        eager_model.eval()
        compiled_model.eval()
        compiled = torch.compile(compiled_model, fullgraph=True, backend=backend)

        def eager_fn(x):
            with torch.no_grad():
                return _features(eager_model(x))

        def compiled_fn(x):
            with torch.no_grad():
                return _features(compiled(x))
        start = time.perf_counter()
        got = compiled_fn(w.input())
        result["compile_s"] = time.perf_counter() - start
        expected = eager_fn(w.input())
        err = rel_err(got, expected)
    else:
        eager_model.train()
        compiled_model.train()

        def forward_loss(model, x):
            return w.loss(_features(model(x)))
        compiled_loss = torch.compile(forward_loss, fullgraph=True, backend=backend)
        opt_eager = torch.optim.SGD(eager_model.parameters(), lr=LR, momentum=MOMENTUM)
        opt_compiled = torch.optim.SGD(compiled_model.parameters(), lr=LR, momentum=MOMENTUM)

        def step(model, opt, loss_fn, x):
            opt.zero_grad()
            loss = loss_fn(model, x)
            loss.backward()
            opt.step()
            return loss.detach()

        def eager_fn(x):
            return step(eager_model, opt_eager, forward_loss, x)

        def compiled_fn(x):
            return step(compiled_model, opt_compiled, compiled_loss, x)
        start = time.perf_counter()
        got = compiled_fn(w.input())
        result["compile_s"] = time.perf_counter() - start
        expected = eager_fn(w.input())
        err = rel_err(got, expected)
    result["rel_err"] = err
    if not err < TOLERANCE:
        raise SystemExit(f"{w.name} {mode}: compiled vs eager relative error {err:.3g} >= {TOLERANCE}")
    times = interleaved_times({"eager": (eager_fn, w.input), "compiled": (compiled_fn, w.input)}, repeats, warmup)
    result.update(times)
    result["ratio_compiled_over_eager"] = times["compiled"]["median_s"] / times["eager"]["median_s"]
    return result


def plot(results: Dict[str, Dict[str, dict]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels, eager, compiled, ratios = [], [], [], []
    for name, modes in results.items():
        for mode, r in modes.items():
            labels.append(f"{name.replace(' (', chr(10) + '(')}\n{mode}")
            eager.append(r["eager"]["median_s"] * 1e3)
            compiled.append(r["compiled"]["median_s"] * 1e3)
            ratios.append(r["ratio_compiled_over_eager"])
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(labels)), 4.5))
    xs = np.arange(len(labels))
    ax.bar(xs - 0.2, eager, 0.4, label="eager")
    ax.bar(xs + 0.2, compiled, 0.4, label="torch.compile(fullgraph=True)")
    for x, c, r in zip(xs, compiled, ratios):
        ax.text(x + 0.2, c, f"{r:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("median time per call (ms)")
    ax.set_title("torch.compile vs eager on the CPU (labels: compiled / eager)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["minkunet0.5", "centerpoint"], choices=sorted(WORKLOADS))
    parser.add_argument("--modes", nargs="+", default=["inference", "training"], choices=["inference", "training"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--quick", action="store_true", help="MinkUNet 0.5x inference, 2 repeats")
    add_output_arguments(parser, "compile_cpu")
    args = parser.parse_args()
    if args.quick:
        args.models, args.modes, args.repeats = ["minkunet0.5"], ["inference"], 2
    out_dir = output_dir(args, "compile_cpu")
    data = {"machine": machine_info(), "load_average_before": load_average(), "threads": args.threads,
            "backend": args.backend, "repeats": args.repeats, "warmup": args.warmup, "torch": torch.__version__,
            "tolerance": TOLERANCE, "results": {}}
    with num_threads(args.threads):
        for key in args.models:
            w = WORKLOADS[key]()
            data["results"][w.name] = {"points": int(len(w.coords))}
            for mode in args.modes:
                r = run_mode(w, mode, args.backend, args.repeats, args.warmup)
                data["results"][w.name][mode] = r
                print(f"{w.name:36s} {mode:9s} eager {r['eager']['median_s'] * 1e3:8.1f} ms  compiled "
                      f"{r['compiled']['median_s'] * 1e3:8.1f} ms  ratio {r['ratio_compiled_over_eager']:.3f}  "
                      f"(compile {r['compile_s']:.0f} s, rel err {r['rel_err']:.1e})", flush=True)
    data["load_average_after"] = load_average()
    write_json(os.path.join(out_dir, "compile_cpu.json"), data)
    plot({name: {m: r for m, r in modes.items() if m in ("inference", "training")}
          for name, modes in data["results"].items()}, os.path.join(out_dir, "compile_cpu.png"))
    print(f"wrote {out_dir}/compile_cpu.json and compile_cpu.png")


if __name__ == "__main__":
    main()
