"""Sparse Autotuner end to end: default config vs each single global dataflow vs the tuned
configs, for MinkUNet 0.5x and CenterPoint's sparse backbone (VoxelResBackBone8x), inference and a
training step (forward + backward), on generated 64-beam scans.

Workloads (float32, batch 1, torch's thread count unless --threads):
- MinkUNet(4, 19, cr=0.5) on the generated 64-beam scan (seed 0) voxelised at --minkunet-voxel
  metres (default 0.25), features N(0, 1); spatial range rounded up to a multiple of 16.
  Training loss: cross entropy on random labels.
- VoxelResBackBone8x(5) on the same scan cropped to |x|, |y| < --crop metres (default 20),
  voxelised by CenterPoint's mean VFE on the Waymo-like grid (CenterPointConfig.waymo()); the
  fifth point feature drawn from U[0, 1). Training loss: mean of squared outputs.

Per (model, mode): torchsparse_pp.tune.tune(): every config timed uniformly, the fastest as the
start, then greedy per group (--repeats timed passes per trial, default 2, after --warmup 1; a
slot's choices round-robin; min_gain 5 %; a group's gain capped at its own time), then the final
check: the default config (the per-device default; fetch_on_demand on the CPU), every design-space config applied
uniformly and the greedy assignment, timed round-robin for --final-rounds rounds (default 5) in
one run, each timed pass on fresh tensors (kernel maps built inside). Reported: median and
[min, max] per contender, speedup vs default, tuned vs the best uniform config. Training mode
uses --binding (default workload).

--bindings-study: on a small MinkUNet workload (--study-voxel, default 0.5 m) tunes the training
step with each binding (workload, mapping, none) on the compact space (one config per dataflow;
none tries 4^3 triples per group) and reports trials, tuning time and the final latency of each.

--device cuda runs the same on a GPU (the design space then has gather_scatter and
implicit_gemm; the timer synchronises): written, not yet run (no GPU so far).

Writes autotune_<device>.json and .png and the tuned files <model>_<mode>_<device>.yaml to a new
benchmarks/out/autotune-<time>/ (or --out DIR); --publish writes them to benchmarks/results/ and
configs/tuned/ (--tuned-dir overrides where the tuned files go).
"""
import argparse
import os
import sys
import time
from typing import Dict, List

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, lidar_batch, load_average, machine_info, output_dir,  # noqa: E402
                    save_figure, write_json)

from torchsparse_pp import SparseTensor  # noqa: E402
from torchsparse_pp.data.synthetic import generate_scan  # noqa: E402
from torchsparse_pp.models import MinkUNet, VoxelResBackBone8x  # noqa: E402
from torchsparse_pp.models.centerpoint import CenterPointConfig  # noqa: E402
from torchsparse_pp.models.centerpoint.voxelize import voxelize  # noqa: E402
from torchsparse_pp.tune import tune  # noqa: E402
from torchsparse_pp.tune.tuner import candidate_labels  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEAMS, SCAN_SEED, NUM_CLASSES = 64, 0, 19


def minkunet(voxel: float, device: str):
    coords, shape = lidar_batch(BEAMS, voxel, [SCAN_SEED])
    shape = [-(-s // 16) * 16 for s in shape]
    g = torch.Generator().manual_seed(100)
    x = SparseTensor(torch.randn(len(coords), 4, generator=g), coords, spatial_range=shape).to(device)
    labels = torch.randint(0, NUM_CLASSES, (len(coords),), generator=g).to(device)
    torch.manual_seed(10)
    model = MinkUNet(4, NUM_CLASSES, 0.5).to(device)
    return model, x, lambda m, s: nn.functional.cross_entropy(m(s), labels)


def centerpoint(crop: float, device: str):
    config = CenterPointConfig.waymo()
    points = generate_scan(BEAMS, seed=SCAN_SEED)["points"]
    points = points[(np.abs(points[:, 0]) < crop) & (np.abs(points[:, 1]) < crop)]
    extra = np.random.default_rng(200).uniform(0.0, 1.0, (len(points), config.point_features - points.shape[1]))
    x = voxelize([np.concatenate([points, extra.astype(np.float32)], 1)], config)
    torch.manual_seed(20)
    return VoxelResBackBone8x(config.point_features).to(device), x.to(device), lambda m, s: m(s).F.square().mean()


def run_case(name: str, model, sample, loss, mode: str, args, device: str) -> Dict[str, object]:
    result = tune(model, [sample], mode=mode, binding=args.binding if mode == "training" else None,
                  repeats=args.repeats, warmup=args.warmup, final_rounds=args.final_rounds, loss=loss,
                  progress=not args.no_progress)
    print(result.table(), flush=True)
    path = os.path.join(args.tuned_dir, f"{name}_{mode}_{device}.yaml")
    result.save(path)
    uniforms = result.uniform_stats()
    best_uniform = min(uniforms, key=lambda k: uniforms[k]["median_s"])
    return {
        "model": name, "mode": mode, "voxels": int(sample.C.shape[0]), "binding": result.binding,
        "groups": [{"name": g.name, "map": g.describe(), "layers": g.layer_names, "pairs": g.pairs,
                    "build_seconds": g.build_seconds,
                    "forward_seconds_default": result.group_seconds_before[g.name],
                    "forward_seconds_tuned": result.group_seconds_after[g.name]} for g in result.groups],
        "search": [vars(s) for s in result.search.slots],
        "trials": len(result.search.trials), "tuning_seconds": result.tuning_seconds,
        "final": result.final, "selected": result.selected, "best_uniform": best_uniform,
        "default": result.final_stats("default"), "greedy": result.final_stats("greedy"),
        "speedup_vs_default": result.before_seconds / result.after_seconds,
        "tuned_vs_best_uniform": uniforms[best_uniform]["median_s"] / result.after_seconds,
        "greedy_vs_best_uniform": uniforms[best_uniform]["median_s"] / result.final_stats("greedy")["median_s"],
        "tuned_file": os.path.relpath(path, ROOT),
    }


def bindings_study(args) -> List[Dict[str, object]]:
    rows = []
    for binding in ("workload", "mapping", "none"):
        model, x, loss = minkunet(args.study_voxel, args.device)
        started = time.perf_counter()
        result = tune(model, [x], mode="training", binding=binding, space="compact", repeats=args.repeats,
                      warmup=args.warmup, final_rounds=args.final_rounds, loss=loss,
                      progress=not args.no_progress)
        print(f"binding {binding}:\n{result.table()}", flush=True)
        rows.append({"binding": binding, "voxels": int(x.C.shape[0]), "trials": len(result.search.trials),
                     "tuning_seconds": time.perf_counter() - started, "greedy": result.final_stats("greedy"),
                     "default": result.final_stats("default"),
                     "selected": result.selected, "selected_seconds": result.after_seconds,
                     "search": [vars(s) for s in result.search.slots]})
    return rows


def plot(cases: List[Dict[str, object]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 4.2), squeeze=False)
    for ax, case in zip(axes[0], cases):
        final = case["final"]
        default = case["default"]["median_s"]
        names = sorted(final, key=lambda k: final[k]["median_s"])
        speed = [default / final[n]["median_s"] for n in names]
        lo = [default / final[n]["max_s"] for n in names]
        hi = [default / final[n]["min_s"] for n in names]
        colors = ["tab:red" if "greedy" in candidate_labels(n) else "tab:green" if n == case["selected"]
                  else "tab:gray" for n in names]
        y = np.arange(len(names))
        ax.barh(y, speed, color=colors, xerr=[np.subtract(speed, lo), np.subtract(hi, speed)], capsize=2)
        ax.set_yticks(y, [n.replace("uniform ", "") for n in names], fontsize=6)
        ax.invert_yaxis()
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("speedup vs default (median; bars: min-max)")
        ax.set_title(f"{case['model']} {case['mode']}", fontsize=9)
    fig.suptitle("Sparse Autotuner, end to end (green: selected, red: greedy result)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="minkunet0.5,centerpoint")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--binding", default="workload", choices=("workload", "mapping", "none"))
    parser.add_argument("--minkunet-voxel", type=float, default=0.25)
    parser.add_argument("--crop", type=float, default=20.0, help="CenterPoint: keep points with |x|, |y| < crop m")
    parser.add_argument("--study-voxel", type=float, default=0.5)
    parser.add_argument("--bindings-study", action="store_true")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--final-rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    add_output_arguments(parser, "autotune")
    parser.add_argument("--tuned-dir", default=None,
                        help="directory for the tuned files (default: the output directory; configs/tuned/ "
                             "with --publish)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    out = output_dir(args, "autotune")
    args.tuned_dir = args.tuned_dir or (os.path.join(ROOT, "configs", "tuned") if args.publish else out)
    os.makedirs(args.tuned_dir, exist_ok=True)
    stem = os.path.join(out, f"autotune_{args.device}")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    load_before = load_average()
    cases = []
    builders = {"minkunet0.5": lambda: minkunet(args.minkunet_voxel, args.device),
                "centerpoint": lambda: centerpoint(args.crop, args.device)}
    for model_name in args.models.split(","):
        for mode in args.modes.split(","):
            model, x, loss = builders[model_name]()
            label = {"minkunet0.5": "minkunet_0.5x", "centerpoint": "centerpoint_backbone"}[model_name]
            cases.append(run_case(label, model, x, loss, mode, args, args.device))
    study = bindings_study(args) if args.bindings_study else None
    report = {"benchmark": "autotune", "description": __doc__, "machine": machine_info(), "device": args.device,
              "cuda_device": torch.cuda.get_device_name() if args.device == "cuda" else None,
              "threads": torch.get_num_threads(), "args": vars(args), "load_average_before": load_before,
              "load_average_after": load_average(), "cases": cases, "bindings_study": study,
              "wall_seconds": time.perf_counter() - started}
    write_json(stem + ".json", report, default=str)
    plot(cases, stem + ".png")
    for case in cases:
        print(f"{case['model']:>22} {case['mode']:<9}: tuned {case['speedup_vs_default']:.2f}x default, "
              f"{case['tuned_vs_best_uniform']:.2f}x best uniform ({case['best_uniform']}); greedy "
              f"{case['greedy_vs_best_uniform']:.2f}x best uniform; selected {case['selected']}")
    print(f"wrote {stem}.json / .png and the tuned files in {args.tuned_dir} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
