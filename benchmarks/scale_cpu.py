"""Scale: MinkUNet 1.0x inference on a 1,000,000-voxel scan on the CPU, its peak memory and time,
and how both grow with the voxel count (a quadratic intermediate would show as bytes per voxel
growing with the size).

Workload: generated 64-beam scans (seeds 0, 1, ...) voxelised at 0.05 m, tiled on a grid of
4000-voxel cells (4 per row) into one batch entry, sorted by coordinate and cut to the first N
voxels (so the cut keeps whole regions); 4 float32 input channels, random features (the
convolutions cost the same whatever the values). MinkUNet(4, 19, cr=1.0) in eval mode under
torch.no_grad, the default CPU dataflow (fetch_on_demand).

Each size runs in a fresh subprocess, so its peak resident memory (getrusage ru_maxrss, read in
that process) is its own: reported as the peak, the resident memory just before the forward (the
interpreter, torch, the model, the input and an untimed warm-up forward on the first 2000 voxels,
which takes one-time costs out of the timing), and their difference per voxel. Time: one forward
(maps built inside it, as in real inference), wall clock.

Usage: python benchmarks/scale_cpu.py [--sizes 125000,250000,500000,1000000] [--threads N]
                                      [--out DIR | --publish]
Writes scale_cpu.json and scale_cpu.png (peak memory and bytes per voxel against the voxel count).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_output_arguments, machine_info, output_dir, save_figure, write_json  # noqa: E402

WARMUP = 2000  # voxels of the untimed warm-up forward
CELL = 4000  # voxels between tiled scans (a 0.05 m scan spans ~3300 in x and y)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def tiled_scan(voxels: int):
    """int32 (0, x, y, z) coordinates of ``voxels`` distinct voxels from tiled generated scans."""
    import numpy as np
    import torch

    from torchsparse_pp.data.synthetic import generate_scan
    from torchsparse_pp.utils.quantize import sparse_quantize

    parts, total, seed = [], 0, 0
    while total < voxels:
        xyz = generate_scan(64, seed=seed)["points"][:, :3].astype(np.float64)
        cell = sparse_quantize(xyz - xyz.min(0), 0.05).astype(np.int64)
        cell[:, 0] += (seed % 4) * CELL
        cell[:, 1] += (seed // 4) * CELL
        parts.append(cell)
        total += len(cell)
        seed += 1
    coords = np.concatenate(parts)
    coords = coords[np.lexsort(coords.T[::-1])][:voxels]
    batch = np.zeros((len(coords), 1), dtype=np.int64)
    return torch.from_numpy(np.concatenate([batch, coords], 1).astype(np.int32)), seed


def child(voxels: int, threads: int) -> dict:
    """One size, in this (fresh) process."""
    import torch

    from torchsparse_pp import SparseTensor
    from torchsparse_pp.models import MinkUNet

    torch.set_num_threads(threads)
    coords, scans = tiled_scan(voxels)
    feats = torch.randn(len(coords), 4, generator=torch.Generator().manual_seed(0))
    model = MinkUNet(4, 19, cr=1.0).eval()
    with torch.no_grad():  # one-time costs (thread pools, lazy imports) out of the timing
        model(SparseTensor(feats[:WARMUP], coords[:WARMUP]))
    before = peak_rss_mib()
    start = time.perf_counter()
    with torch.no_grad():
        out = model(SparseTensor(feats, coords))
    seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    assert out.shape == (voxels, 19) and bool(torch.isfinite(out).all())
    return {"voxels": voxels, "scans_tiled": scans, "threads": threads, "forward_s": round(seconds, 2),
            "rss_before_forward_mib": round(before, 1), "peak_rss_mib": round(peak, 1),
            "forward_peak_bytes_per_voxel": round((peak - before) * 2 ** 20 / voxels, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="125000,250000,500000,1000000",
                        help="voxel counts, comma-separated (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    add_output_arguments(parser, "scale_cpu")
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.threads)), flush=True)
        return
    sizes = [int(v) for v in args.sizes.split(",")]
    if not sizes or min(sizes) < 1:
        parser.error(f"--sizes must be positive voxel counts, got {args.sizes!r}")
    out = output_dir(args, "scale_cpu")
    info = machine_info()
    rows = []
    for voxels in sizes:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(voxels), "--threads",
                               str(args.threads)], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"the {voxels}-voxel run failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    per_voxel = [r["forward_peak_bytes_per_voxel"] for r in rows]
    summary = {"largest_over_smallest_bytes_per_voxel": round(per_voxel[-1] / per_voxel[0], 3),
               "marginal_bytes_per_voxel": marginal_bytes_per_voxel(rows)}
    report = {"benchmark": "scale_cpu", "description": __doc__, "machine": info,
              "model": "MinkUNet(4, 19, cr=1.0) eval", "dataflow": "fetch_on_demand (the CPU default)",
              "runs": rows, "summary": summary}
    json_path = write_json(os.path.join(out, "scale_cpu.json"), report)
    png_path = os.path.join(out, "scale_cpu.png")
    plot(report, png_path)
    print(json.dumps(summary))
    print(f"wrote {json_path} and {png_path}")


def marginal_bytes_per_voxel(rows: list) -> list:
    """Growth of the peak between neighbouring sizes per added voxel: constant when the memory is
    linear in the voxel count (the per-voxel average also carries the fixed part)."""
    return [round((b["peak_rss_mib"] - a["peak_rss_mib"]) * 2 ** 20 / (b["voxels"] - a["voxels"]), 1)
            for a, b in zip(rows, rows[1:])]


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["runs"]
    n = [r["voxels"] / 1e6 for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.plot(n, [r["peak_rss_mib"] / 1024 for r in rows], "o-", label="peak resident memory")
    left.plot(n, [r["rss_before_forward_mib"] / 1024 for r in rows], "s--",
              label="before the forward (torch, model, input)")
    for r, x in zip(rows, n):
        left.annotate(f"{r['peak_rss_mib'] / 1024:.2f} GiB\n{r['forward_s']:.0f} s", (x, r["peak_rss_mib"] / 1024),
                      textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    left.set_xlabel("voxels (millions)")
    left.set_ylabel("GiB")
    left.set_ylim(bottom=0)
    left.set_title("peak memory of one inference forward", fontsize=9)
    left.legend(fontsize=8)
    right.plot(n, [r["forward_peak_bytes_per_voxel"] for r in rows], "o-", label="(peak - before) / voxels")
    marginal = marginal_bytes_per_voxel(rows)
    if marginal:
        right.plot([(a + b) / 2 for a, b in zip(n, n[1:])], marginal, "s--",
                   label="marginal: growth of the peak / added voxels,\nbetween neighbouring sizes")
    right.set_xlabel("voxels (millions)")
    right.set_ylabel("bytes per voxel")
    right.set_ylim(bottom=0)
    right.set_title("forward memory per voxel\n(a quadratic intermediate would make the marginal grow)", fontsize=9)
    right.legend(fontsize=8)
    m = report["machine"]
    fig.suptitle(f"MinkUNet 1.0x inference on CPU — {m['cpu_model']}, {rows[0]['threads']} threads, "
                 f"torch {m['torch']}, {m['date']}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
