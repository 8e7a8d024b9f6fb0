"""The seven end-to-end workloads of TorchSparse++ on generated scans, ours vs spconv 2.3.8 on the
CPU, inference and a training step, in one run: normalized speedups per workload (the shape of
the paper's end-to-end figure), JSON + PNG.

Workloads (each dataset's beams, range, voxel size and frame count; one sample, float32):
- SK-M 0.5x / 1x: MinkUNet (cr 0.5 / 1.0) on a 64-beam HDL-64E-like scan (SemanticKITTI), 0.05 m
  voxels, features x, y, z, intensity;
- NS-M 1f / 3f: MinkUNet 1x on a 32-beam nuScenes-like sweep and on it plus the 2 sweeps before
  it (20 Hz), 0.1 m voxels, features x, y, z, intensity, ring (+ time lag with 3 sweeps);
- NS-C 10f: CenterPoint's sparse backbone (VoxelResBackBone8x) on 10 nuScenes sweeps in the
  key frame, CenterPointConfig.nuscenes() (0.075 x 0.075 x 0.2 m in [-54, 54]^2 x [-5, 3]), mean
  VFE of x, y, z, intensity, time lag;
- WM-C 1f / 3f: the backbone on Waymo-like 64-beam frames (torchsparse_pp.data.synthetic's
  waymo64: +2.4 to -17.6 deg, 2650 azimuths, 75 m), 1 frame and 3 frames at 10 Hz,
  CenterPointConfig.waymo() (0.1 x 0.1 x 0.15 m in [-75.2, 75.2]^2 x [-2, 4]), x, y, z,
  intensity, elongation (+ time lag).
Multi-frame inputs are one generated sequence (torchsparse_pp.data.synthetic_sequence), every
sweep carried into the last sweep's frame by the sequence's true poses. For CenterPoint only the
sparse 3-D backbone is timed: its BEV network and head are the same dense torch layers in both
pipelines (and at 180 x 180 / 188 x 188 cells x 256 channels they would dominate a CPU run).

Contenders, timed round-robin (benchmarks/common.py interleaved_times), median of --repeats after
--warmup, fresh input tensors every call (kernel maps are built inside it):
- ours default: no config set (the CPU default dataflow), at --threads and at 1 thread (against
  spconv's only correct setting, thread for thread);
- ours tuned: the shipped tuned file of the model and mode (configs/tuned/*_cpu.yaml) where one
  exists for that exact structure and device (SK-M 0.5x; the backbone with 5 point features),
  at --threads;
- spconv 2.3.8 (ConvAlgo.Native) at 1 thread (its only correct CPU setting) and at --threads
  (RACY: wrong results, see docs/benchmarks.md; shown hatched).
Before timing, ours' inference output is checked against spconv's at 1 thread (relative error
< 1e-4, rows matched by coordinates), else the workload stops. Normalized speedup = t(spconv at
1 thread) / t(contender).

--quick: the points in a 6 m x 6 m window (QUICK_WINDOW) only, 1 round, no warmup (a test of the
script).

Usage: python benchmarks/workloads.py [--workloads SK-M0.5x,...] [--repeats N] [--warmup N]
       [--threads T] [--quick] [--out DIR | --publish]
"""
import argparse
import copy
import os
import sys
import time
from typing import Dict, List

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, add_round_arguments, check_round_arguments, interleaved_times,  # noqa: E402
                    load_average, machine_info, num_threads, output_dir, pyplot, save_figure, write_json)

from torchsparse_pp.data.synth_nuscenes import ring_index  # noqa: E402
from torchsparse_pp.data.synthetic import BEAM_PATTERNS  # noqa: E402
from torchsparse_pp.data.synthetic_sequence import generate_sequence  # noqa: E402
from torchsparse_pp.models import MinkUNet, VoxelResBackBone8x  # noqa: E402
from torchsparse_pp.models.centerpoint import CenterPointConfig  # noqa: E402
from torchsparse_pp.models.centerpoint.voxelize import voxelize  # noqa: E402
from torchsparse_pp.tune import apply as apply_tuned  # noqa: E402
from torchsparse_pp.tune.configfile import TunedFileError  # noqa: E402
from torchsparse_pp.utils import sparse_quantize  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 0
NUM_CLASSES = 19
# --quick keeps x in [6, 12) m, |y| < 3 m: past the lowest beam's ground ring of every pattern
# (3.2 m nuScenes, 3.7 m HDL-64E, 6.9 m Waymo), so every workload keeps ground and objects.
QUICK_WINDOW = ((6.0, 12.0), (-3.0, 3.0))
LR, MOMENTUM = 1e-3, 0.9
TOLERANCE = 1e-4

# name -> (model, channel ratio or CenterPoint preset, beam pattern, frames, frame interval s, voxel m)
WORKLOADS = {
    "SK-M0.5x": ("minkunet", 0.5, "hdl64", 1, 0.1, 0.05),
    "SK-M1x": ("minkunet", 1.0, "hdl64", 1, 0.1, 0.05),
    "NS-M1f": ("minkunet", 1.0, "nuscenes32", 1, 0.05, 0.1),
    "NS-M3f": ("minkunet", 1.0, "nuscenes32", 3, 0.05, 0.1),
    "NS-C10f": ("centerpoint", "nuscenes", "nuscenes32", 10, 0.05, None),
    "WM-C1f": ("centerpoint", "waymo", "waymo64", 1, 0.1, None),
    "WM-C3f": ("centerpoint", "waymo", "waymo64", 3, 0.1, None),
}
TUNED = {("minkunet", 0.5, "inference"): "configs/tuned/minkunet_0.5x_inference_cpu.yaml",
         ("minkunet", 0.5, "training"): "configs/tuned/minkunet_0.5x_training_cpu.yaml",
         ("centerpoint", "inference"): "configs/tuned/centerpoint_backbone_inference_cpu.yaml",
         ("centerpoint", "training"): "configs/tuned/centerpoint_backbone_training_cpu.yaml"}


def frames_in_last_frame(pattern: str, frames: int, interval: float, seed: int, window=None) -> np.ndarray:
    """float64 [N, 5 or 6]: x, y, z (the last sweep's sensor frame), intensity, the pattern's
    extra column (ring for nuscenes32, elongation for waymo64, none for hdl64) and, with several
    frames, the time lag. The last sweep's points come first."""
    times = -interval * np.arange(frames)[::-1]
    seq = generate_sequence(pattern, seed, times)
    last_from_scene = np.linalg.inv(seq.sensor_poses[-1])
    rng = np.random.default_rng(seed)
    parts = []
    for k in range(frames - 1, -1, -1):
        p = seq.points[k].astype(np.float64)
        move = last_from_scene @ seq.sensor_poses[k]
        columns = [p[:, :3] @ move[:3, :3].T + move[:3, 3], p[:, 3:4]]
        if pattern == "nuscenes32":
            columns.append(ring_index(p, BEAM_PATTERNS[pattern])[:, None].astype(np.float64))
        elif pattern == "waymo64":
            columns.append(rng.uniform(0.0, 0.3, (len(p), 1)))
        if frames > 1:
            columns.append(np.full((len(p), 1), -times[k]))
        parts.append(np.concatenate(columns, 1))
    points = np.concatenate(parts)
    if window is not None:
        (x0, x1), (y0, y1) = window
        x, y = points[:, 0], points[:, 1]
        points = points[(x >= x0) & (x < x1) & (y >= y0) & (y < y1)]
    return points


def minkunet_input(points: np.ndarray, voxel: float):
    """(coords [V, 4] (batch 0, non-negative, sorted), first-point features [V, F], shape rounded to 16)."""
    xyz = points[:, :3] - points[:, :3].min(0)
    coords, index = sparse_quantize(xyz, voxel, return_index=True)
    coords = torch.from_numpy(coords).int()
    feats = torch.from_numpy(points[index]).float()
    order = torch.argsort(((coords[:, 0].long() * 4096) + coords[:, 1]) * 4096 + coords[:, 2])
    coords, feats = coords[order], feats[order]
    shape = [-(-(int(s) + 1) // 16) * 16 for s in coords.amax(0)]
    return torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), coords], 1), feats, shape


def build(name: str, quick: bool):
    """(Workload of benchmarks/models.py, description) of a named workload."""
    from models import Workload
    kind, size, pattern, frames, interval, voxel = WORKLOADS[name]
    points = frames_in_last_frame(pattern, frames, interval, SEED, QUICK_WINDOW if quick else None)
    torch.manual_seed(10)
    if kind == "minkunet":
        coords, feats, shape = minkunet_input(points, voxel)
        labels = torch.randint(0, NUM_CLASSES, (len(coords),), generator=torch.Generator().manual_seed(100))
        ours = MinkUNet(feats.shape[1], NUM_CLASSES, size)
        w = Workload(name, ours, "minkunet", dict(in_channels=feats.shape[1], num_classes=NUM_CLASSES, cr=size),
                     coords, feats, shape, labels)
        grid = {"voxel_m": voxel}
    else:
        if pattern == "waymo64":
            points[:, 2] += BEAM_PATTERNS[pattern]["sensor_height"]  # Waymo's vehicle frame: the road near z = 0
        if name.startswith("NS-C"):
            points = points[:, [0, 1, 2, 3, 5]]  # x, y, z, intensity, time lag (no ring), as CenterPoint's nuScenes
        config = getattr(CenterPointConfig, size)(point_features=points.shape[1])
        x = voxelize([points.astype(np.float32)], config)
        ours = VoxelResBackBone8x(config.point_features)
        w = Workload(name, ours, "centerpoint_backbone", dict(in_channels=config.point_features), x.C, x.F,
                     list(config.sparse_shape))
        grid = {"voxel_m": list(config.voxel_size), "point_cloud_range": list(config.point_cloud_range)}
    info = {"model": "MinkUNet" if kind == "minkunet" else "VoxelResBackBone8x", "size": size, "pattern": pattern,
            "frames": frames, "frame_interval_s": interval, "points": int(len(points)), "voxels": int(len(w.coords)),
            "point_features": int(w.feats.shape[1]), "parameters": w.parameters, **grid}
    return w, info


def tuned_model(name: str, w, mode: str):
    """Our model with the tuned file of its structure applied, or (None, why not)."""
    kind, size = WORKLOADS[name][:2]
    path = TUNED.get((kind, size, mode) if kind == "minkunet" else (kind, mode))
    if path is None:
        return None, "no tuned file for this model"
    model = copy.deepcopy(w.ours)
    try:
        apply_tuned(model, os.path.join(ROOT, path))
    except TunedFileError as err:
        return None, f"{path}: {err}"
    return model, path


def check(w) -> float:
    """Ours' inference output vs spconv's at 1 thread (relative error; raises above TOLERANCE)."""
    from models import compare_outputs
    with num_threads(1), torch.no_grad():
        w.spconv.eval()
        w.ours.eval()
        err = compare_outputs(w, w.ours_output(w.ours(w.ours_input("cpu"))), w.spconv_output(w.spconv(w.spconv_input("cpu"))))
    if not err < TOLERANCE:
        raise AssertionError(f"{w.name}: ours vs spconv output relative error {err:.2e} (tolerance {TOLERANCE})")
    return err


def tasks(w, models: Dict[str, torch.nn.Module], threads: int, mode: str) -> dict:
    training = mode == "training"

    def runner(model, to_features, t):
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        model.train(training)

        def infer(x):
            with num_threads(t), torch.no_grad():
                to_features(model(x))

        def train(x):
            with num_threads(t):
                optimizer.zero_grad(set_to_none=True)
                w.loss(to_features(model(x))).backward()
                optimizer.step()
        return train if training else infer

    out = {f"ours-{n}@{threads}t": (runner(m, lambda o: w.ours_output(o)[1], threads), lambda: w.ours_input("cpu"))
           for n, m in models.items()}
    if threads > 1:
        single = copy.deepcopy(models["default"])
        out["ours-default@1t"] = (runner(single, lambda o: w.ours_output(o)[1], 1), lambda: w.ours_input("cpu"))
    for t in sorted({1, threads}):
        out[f"spconv@{t}t"] = (runner(w.spconv, lambda o: w.spconv_output(o)[1], t), lambda: w.spconv_input("cpu"))
    return out


def run_workload(name: str, args, bar) -> dict:
    w, info = build(name, args.quick)
    row = {"workload": name, **info, "output_rel_err_vs_spconv_1t": check(w), "timings_s": {}, "speedup": {},
           "tuned": {}}
    for mode in ("inference", "training"):
        models = {"default": copy.deepcopy(w.ours)}
        tuned, why = tuned_model(name, w, mode)
        row["tuned"][mode] = why
        if tuned is not None:
            models["tuned"] = tuned
        bar.set_description(f"{name} {mode}")
        times = interleaved_times(tasks(w, models, args.threads, mode), args.repeats, args.warmup, on_round=bar.update)
        medians = {k: v["median_s"] for k, v in times.items()}
        row["timings_s"][mode] = medians
        row["speedup"][mode] = {k: medians["spconv@1t"] / v for k, v in medians.items()}
    return row


def geomean(values: List[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_round_arguments(parser, repeats=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    parser.add_argument("--quick", action="store_true", help="the points in a 6 m x 6 m window only, 1 round, no warmup")
    add_output_arguments(parser, "workloads")
    args = parser.parse_args(argv)
    names = [n for n in args.workloads.split(",") if n]
    if not names or any(n not in WORKLOADS for n in names):
        parser.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    if args.quick:
        args.repeats, args.warmup = 1, 0
    check_round_arguments(parser, args)
    try:
        import spconv_twins  # noqa: F401  (imports spconv.pytorch)
    except ImportError as err:
        parser.error(f"spconv is required ({err}): pip install spconv==2.3.8")
    from models import patch_spconv_cpu_backward
    out = output_dir(args, "workloads")
    patch_spconv_cpu_backward()
    started = time.perf_counter()
    report = {"benchmark": "workloads", "description": __doc__, "machine": machine_info(), "threads": args.threads,
              "repeats": args.repeats, "warmup": args.warmup, "quick": args.quick, "seed": SEED,
              "racy": [f"spconv@{t}t" for t in sorted({1, args.threads}) if t > 1], "workloads": []}
    with tqdm(total=len(names) * 2 * (args.repeats + args.warmup), unit="round", file=sys.stderr) as bar:
        for name in names:
            report["workloads"].append(run_workload(name, args, bar))
            write_json(os.path.join(out, "workloads.json"), report)  # a run cut short keeps what it finished
    report["geomean_speedup"] = {mode: {k: geomean([r["speedup"][mode][k] for r in report["workloads"]])
                                        for k in report["workloads"][0]["speedup"][mode]
                                        if all(k in r["speedup"][mode] for r in report["workloads"])}
                                 for mode in ("inference", "training")}
    report["machine"]["loadavg_at_end"] = load_average()
    report["wall_seconds"] = time.perf_counter() - started
    write_json(os.path.join(out, "workloads.json"), report)
    print_table(report)
    plot(report, os.path.join(out, "workloads.png"))
    print(f"\nwrote {out}/workloads.json and .png ({report['wall_seconds']:.0f} s)")
    return 0


def print_table(report) -> None:
    m, t = report["machine"], report["threads"]
    print(f"\n{m['cpu_model']}, ours at {t} threads, torch {m['torch']}, spconv {m['spconv']}, git {m['git_revision']}, "
          f"load {m['loadavg_at_start']} -> {m['loadavg_at_end']}; median of {report['repeats']} rounds"
          + (" (--quick)" if report["quick"] else ""))
    print("speedup = t(spconv@1t) / t; spconv at more than 1 thread is RACY (wrong results)")
    for mode in ("inference", "training"):
        print(f"\n{mode}:")
        for r in report["workloads"]:
            times = ", ".join(f"{k} {v * 1e3:.0f} ms ({r['speedup'][mode][k]:.2f}x)" for k, v in r["timings_s"][mode].items())
            print(f"  {r['workload']:<9s} {r['voxels']:>7d} voxels: {times}")
        print("  geomean: " + ", ".join(f"{k} {v:.2f}x" for k, v in report["geomean_speedup"][mode].items()))


def plot(report, path) -> None:
    plt = pyplot()
    if plt is None:
        return
    rows = report["workloads"]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.2))
    for ax, mode in zip(axes, ("inference", "training")):
        series = sorted({k for r in rows for k in r["speedup"][mode]}, key=lambda k: (not k.startswith("spconv"), k))
        groups = [r["workload"] for r in rows] + ["geomean"]
        width = 0.8 / len(series)
        for i, name in enumerate(series):
            values = [r["speedup"][mode].get(name, np.nan) for r in rows]
            values.append(report["geomean_speedup"][mode].get(name, np.nan))
            bars = ax.bar(np.arange(len(groups)) + i * width, values, width, label=name,
                          hatch="//" if name in report["racy"] else None, edgecolor="black", linewidth=0.3)
            ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")  # racy spconv under load and ours span two decades
        ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, groups, fontsize=8)
        ax.set_ylabel("normalized speedup (spconv 2.3.8, 1 thread = 1)")
        ax.set_title(f"{mode} ({'forward' if mode == 'inference' else 'forward + backward + SGD step'}), "
                     f"ours at {report['threads']} threads; hatched: spconv racy", fontsize=9)
        ax.legend(fontsize=7, ncol=len(series), loc="upper center", bbox_to_anchor=(0.5, -0.08))
    m = report["machine"]
    fig.suptitle(f"TorchSparse++ workloads on generated scans, torchsparse_pp vs spconv {m['spconv']} (CPU) - "
                 f"{m['cpu_model']}, {m['date']}" + (" (--quick)" if report["quick"] else ""), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
