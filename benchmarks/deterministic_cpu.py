"""What deterministic mode (torchsparse_pp.backends.deterministic = True) costs on the CPU.

Workload: the generated 64-beam scan of conv_cpu.py (seed 0, 0.05 m), float32, forward and
backward (dgrad + wgrad) of one conv per layer, the map cached. Layers: SubM 3^3 C=32 on the
full scan (stride 1) and SubM 3^3 C=64 at tensor stride 4 (the coarser sets come from k2 s2
downsamples, as in conv_cpu.py).

Per layer and thread count (1, 2), every dataflow runs with the flag off and on, round-robin,
median of --repeats rounds. fetch_on_demand and implicit_gemm are deterministic by construction
(the flag changes nothing for them); gather_scatter swaps its multi-threaded ATen GEMMs for fixed
single-threaded tiles and its weight gradient for fixed-order chunk sums. Reported: time with
the flag on / time with it off, per dataflow.

Usage: python benchmarks/deterministic_cpu.py [--repeats N] [--out DIR]
"""
import argparse
import os
import sys

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, interleaved_times, lidar_batch, machine_info, num_threads,  # noqa: E402
                    output_dir, save_figure, write_json)

from torchsparse_pp import SparseTensor, backends  # noqa: E402
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map  # noqa: E402
from torchsparse_pp.nn.functional import ConvConfig, conv3d  # noqa: E402

CONFIGS = {
    "gather_scatter": ConvConfig("gather_scatter"),
    "fetch_on_demand": ConvConfig("fetch_on_demand"),
    "implicit_gemm sorted1": ConvConfig("implicit_gemm", sorted=True, split_mask_num=1),
}
LAYERS = [("subm3 c32 s1", 0, 32), ("subm3 c64 s4", 2, 64)]
THREADS = (1, 2)


def coordinate_level(coords, shape, level):
    down = ConvGeometry.make(2, 2, 1, 0)
    for _ in range(level):
        kmap = strided_map(KernelMapCache(), coords, down, "spconv", tuple(shape))
        coords, shape = kmap.out_coords, kmap.out_range
    return coords, tuple(shape)


def step(x, weight, config, deterministic):
    """One forward + backward with the flag set as asked; restores the flag."""
    previous = backends.deterministic
    backends.deterministic = deterministic
    try:
        feats = x.F.detach().requires_grad_(True)
        w = weight.detach().requires_grad_(True)
        y = conv3d(x.replace_feats(feats), w, 3, config=config)
        y.F.backward(torch.ones_like(y.F))
    finally:
        backends.deterministic = previous


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    add_output_arguments(parser, "deterministic_cpu")
    args = parser.parse_args(argv)
    out = output_dir(args, "deterministic_cpu")

    coords, shape = lidar_batch(64, 0.05, [0])
    rows = []
    with tqdm(total=len(LAYERS) * len(THREADS) * (args.repeats + 1), desc="rounds", unit="round") as bar:
        for name, level, c in LAYERS:
            torch.manual_seed(level)
            lc, ls = coordinate_level(coords, shape, level)
            x = SparseTensor(torch.randn(len(lc), c), lc, stride=2 ** level, spatial_range=ls)
            weight = torch.randn(27, c, c) / (27 * c) ** 0.5
            row = {"layer": name, "voxels": len(lc), "channels": c, "seconds": {}, "cost": {}}
            for t in THREADS:
                with num_threads(t):
                    tasks = {f"{flow}|{det}": ((lambda cfg=cfg, det=det: step(x, weight, cfg, det)), None)
                             for flow, cfg in CONFIGS.items() for det in (False, True)}
                    for fn, _ in tasks.values():
                        fn()  # builds the map and every view before timing
                    bar.set_postfix_str(f"{name} {t}t")
                    tm = interleaved_times(tasks, args.repeats, 1, on_round=lambda: bar.update(1))
                key = f"{t}t"
                row["seconds"][key] = {k: v["median_s"] for k, v in tm.items()}
                row["cost"][key] = {flow: tm[f"{flow}|True"]["median_s"] / tm[f"{flow}|False"]["median_s"]
                                    for flow in CONFIGS}
            rows.append(row)

    report = {"benchmark": "deterministic_cpu", "description": __doc__, "machine": machine_info(),
              "repeats": args.repeats, "layers": rows}
    json_path = write_json(os.path.join(out, "deterministic_cpu.json"), report)

    print("\nforward + backward, ms (flag off / on) and cost = on / off:")
    for row in rows:
        for key in row["cost"]:
            s = row["seconds"][key]
            cells = "; ".join(f"{flow} {s[flow + '|False'] * 1e3:.1f} / {s[flow + '|True'] * 1e3:.1f} "
                              f"({row['cost'][key][flow]:.2f}x)" for flow in CONFIGS)
            print(f"  {row['layer']} {key}: {cells}")
    png_path = os.path.join(out, "deterministic_cpu.png")
    plot(report, png_path)
    print(f"\nwrote {json_path} and {png_path}")


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = report["layers"]
    groups = [(r["layer"], key) for r in rows for key in r["cost"]]
    x = np.arange(len(groups))
    width = 0.8 / len(CONFIGS)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, flow in enumerate(CONFIGS):
        vals = [next(r for r in rows if r["layer"] == layer)["cost"][key][flow] for layer, key in groups]
        bars = ax.bar(x + (i - (len(CONFIGS) - 1) / 2) * width, vals, width, label=flow)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, [f"{layer}, {key}" for layer, key in groups], fontsize=8)
    ax.set_ylabel("time with deterministic=True / without")
    m = report["machine"]
    ax.set_title(f"cost of deterministic mode, forward + backward — {m['cpu_model']}, torch {m['torch']}, "
                 f"{m['date']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
