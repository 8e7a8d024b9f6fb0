"""CPU sparse convolution: torchsparse_pp vs spconv 2.3.8 (Native) vs the torch.mm ceiling.

One generated 64-beam scan (seed 0), shifted to non-negative coordinates and voxelised at
0.05 m (batch 1), float32, inference (torch.no_grad). Layers: SubM 3^3 at C = 16, 32, 64, 128
(C_in = C_out) and a k2 s2 downsample 32 -> 64 (spconv output set, clipped to the dense size).

What each timing includes (time.perf_counter; per layer and thread count all the timed tasks run
round-robin, one of each per round, --warmup rounds then --repeats rounds, and the median is
reported, so load from elsewhere on the machine hits ours, spconv and torch.mm alike):

- map build, ours: ``submanifold_map`` / ``strided_map`` on a fresh ``KernelMapCache`` plus the
  weight-stationary pairs view the gather-scatter dataflow runs on (``kmap.pairs``): hash-table
  build, output coordinates (strided), the ``out_in`` map and the per-offset pair lists. The
  JSON splits it into hash / out_in (+ output coords) / pairs.
- map build, spconv: ``spconv.pytorch.ops.get_indice_pairs`` (ConvAlgo.Native), the call its
  modules make when no indice_key entry exists: output indices, pair lists and per-offset counts.
  For SubM it stores pairs only for the offsets before the centre (the others are the same pairs
  with input and output swapped, the centre is the identity), so it searches half the offsets
  that ours does; "spconv_pairs_stored" vs "spconv_total_pairs" in the JSON shows this.
- conv forward with the map cached, ours: ``Conv3d.forward`` on a SparseTensor whose cache
  already holds the map (checks, cache lookup, gather-GEMM-scatter, output tensor).
- conv forward with the map cached, spconv: SubM: ``SubMConv3d.forward`` on a SparseConvTensor
  whose indice_dict already holds its indice_key (its own reuse path). Strided: spconv modules
  cannot reuse a non-submanifold map, so ``spconv.pytorch.ops.indice_conv`` with the pairs from
  ``get_indice_pairs``, which is the call its module makes after building them.
- first call (JSON only): the module on a fresh tensor, map build + forward, for both.
- ceiling: ``torch.mm`` of [total_pairs, C_in] x [C_in, C_out] into a preallocated output, i.e.
  the same MACs (total_pairs * C_in * C_out) as the sparse conv, in the same run and thread count.

Ratios are speedups t_peer / t_ours (> 1: ours is faster) and ours' share of the mm rate
(GFLOP/s ours / GFLOP/s torch.mm). spconv's CPU path races at more than one thread, so its
multi-thread figures are marked "racy"; the run also records how far its 2-thread output is from
its 1-thread output.

Usage: python benchmarks/conv_cpu.py [--repeats N] [--warmup N] [--threads 1,2] [--out DIR]
"""
import argparse
import json
import os
import sys
import time

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (busy_processes, gflops, interleaved_times, lidar_batch, load_average, machine_info,  # noqa: E402
                    num_threads)  # noqa: E402

import torchsparse_pp as tsp  # noqa: E402
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map, submanifold_map  # noqa: E402
from torchsparse_pp.nn import Conv3d  # noqa: E402

BEAMS, VOXEL, SCAN_SEED = 64, 0.05, 0
LAYERS = [
    {"name": "subm3 c16", "subm": True, "k": 3, "s": 1, "p": 1, "c_in": 16, "c_out": 16},
    {"name": "subm3 c32", "subm": True, "k": 3, "s": 1, "p": 1, "c_in": 32, "c_out": 32},
    {"name": "subm3 c64", "subm": True, "k": 3, "s": 1, "p": 1, "c_in": 64, "c_out": 64},
    {"name": "subm3 c128", "subm": True, "k": 3, "s": 1, "p": 1, "c_in": 128, "c_out": 128},
    {"name": "down k2s2 32->64", "subm": False, "k": 2, "s": 2, "p": 0, "c_in": 32, "c_out": 64},
]


def rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def sorted_rows(coords: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    c = coords.long()
    key = ((c[:, 0] * (1 << 20) + c[:, 1]) * (1 << 20) + c[:, 2]) * (1 << 20) + c[:, 3]
    return feats[torch.argsort(key)]


# --- ours -------------------------------------------------------------------------------------------

def ours_map_build(coords, shape, layer, geometry):
    """Builds the map on a fresh cache, plus its pairs view; returns (kmap, {part: seconds})."""
    start = time.perf_counter()
    cache = KernelMapCache()
    if layer["subm"]:
        kmap = submanifold_map(cache, coords, geometry, tuple(shape))
    else:
        kmap = strided_map(cache, coords, geometry, "spconv", tuple(shape))
    built = time.perf_counter()
    kmap.pairs
    end = time.perf_counter()
    return kmap, {"hash": cache.hash_seconds, "out_in": (built - start) - cache.hash_seconds,
                  "pairs": end - built}


# --- spconv -----------------------------------------------------------------------------------------

def spconv_pairs(spconv_ops, algo, coords, shape, layer):
    k, s, p = layer["k"], layer["s"], layer["p"]
    return spconv_ops.get_indice_pairs(coords, 1, list(shape), algo, [k] * 3, [s] * 3, [p] * 3,
                                       [1] * 3, [0] * 3, layer["subm"], False)


def spconv_module(spconv, layer, weight_ours):
    k, c_in, c_out = layer["k"], layer["c_in"], layer["c_out"]
    if layer["subm"]:
        m = spconv.SubMConv3d(c_in, c_out, k, bias=False, indice_key="bench")
    else:
        m = spconv.SparseConv3d(c_in, c_out, k, stride=layer["s"], padding=layer["p"], bias=False)
    with torch.no_grad():  # ours [K, C_in, C_out] -> spconv [C_out, kx, ky, kz, C_in]
        m.weight.copy_(weight_ours.reshape(k, k, k, c_in, c_out).permute(4, 0, 1, 2, 3))
    return m


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if 1 not in threads:
        threads = [1] + threads
    rep, warm = args.repeats, args.warmup

    try:
        import spconv.pytorch as spconv
        from spconv.core import ConvAlgo
        from spconv.pytorch import ops as spconv_ops
    except ImportError:
        sys.exit("spconv is required: pip install spconv==2.3.8")

    machine = machine_info()
    if machine["loadavg_at_start"] and machine["loadavg_at_start"][0] > 0.5:
        print(f"warning: load average {machine['loadavg_at_start']} - other work on this machine will "
              "skew the timings", file=sys.stderr)
    torch.manual_seed(0)
    coords, shape = lidar_batch(BEAMS, VOXEL, [SCAN_SEED])
    n = coords.shape[0]
    print(f"64-beam scan (seed {SCAN_SEED}) at {VOXEL} m: {n} voxels, spatial shape {shape}", file=sys.stderr)

    results = []
    for layer in tqdm(LAYERS, desc="layers", unit="layer"):
        k, s, p, c_in, c_out = layer["k"], layer["s"], layer["p"], layer["c_in"], layer["c_out"]
        geometry = ConvGeometry.make(k, s, 1, p)
        feats = torch.randn(n, c_in)
        conv = Conv3d(c_in, c_out, k, stride=s, padding=p, downsample_mode="spconv")
        conv.eval()
        m = spconv_module(spconv, layer, conv.kernel.detach())
        row = {"layer": layer["name"], "geometry": {"kernel": k, "stride": s, "padding": p},
               "c_in": c_in, "c_out": c_out, "n_in": n, "ours": {}, "spconv": {}, "mm": {}}

        with torch.no_grad():
            # Sizes, and a correctness check of both against each other at one thread.
            with num_threads(1):
                kmap = ours_map_build(coords, shape, layer, geometry)[0]
                outids, pairs, pair_num = spconv_pairs(spconv_ops, ConvAlgo.Native, coords, shape, layer)
                ref = m(spconv.SparseConvTensor(feats, coords, shape, 1))
                ours_out = conv(tsp.SparseTensor(feats, coords, spatial_range=shape))
            total_pairs = int(kmap.pairs.offsets[-1])
            row.update(n_out=kmap.num_out, total_pairs=total_pairs,
                       # spconv's SubM map stores only the offsets before the centre (the rest are
                       # the same pairs swapped; the centre is the identity): effective = N + 2 * stored
                       spconv_pairs_stored=int(pair_num.sum()),
                       spconv_total_pairs=(n + 2 * int(pair_num.sum())) if layer["subm"] else int(pair_num.sum()),
                       spconv_n_out=int(outids.shape[0]),
                       pairs_per_output=total_pairs / kmap.num_out,
                       pairs_per_offset=kmap.pairs.pairs_per_offset.tolist(),
                       macs=total_pairs * c_in * c_out)
            if row["spconv_total_pairs"] != total_pairs or row["spconv_n_out"] != kmap.num_out:
                print(f"warning: {layer['name']}: spconv has {row['spconv_total_pairs']} pairs / "
                      f"{row['spconv_n_out']} outputs, ours {total_pairs} / {kmap.num_out}", file=sys.stderr)
            same_set = ref.indices.shape == ours_out.C.shape
            row["agreement_vs_spconv_1t"] = {
                "same_output_count": bool(same_set),
                "max_abs_err_over_max_abs": rel_max(sorted_rows(ours_out.C, ours_out.F),
                                                    sorted_rows(ref.indices, ref.features)) if same_set else None}
            macs = row["macs"]

            for t in threads:
                with num_threads(t):
                    key = f"{t}t"
                    x = tsp.SparseTensor(feats, coords, spatial_range=shape)
                    conv(x)  # builds and caches the map
                    if layer["subm"]:
                        xs = spconv.SparseConvTensor(feats, coords, shape, 1)
                        xs.indice_dict = dict(m(xs).indice_dict)  # its own indice_key reuse path
                        sp_fwd_fn, sp_fwd_path = (lambda: m(xs)), "SubMConv3d.forward with indice_dict reuse"
                    else:
                        o, pr, pn = spconv_pairs(spconv_ops, ConvAlgo.Native, coords, shape, layer)
                        w = m.weight.detach()
                        sp_fwd_fn = lambda: spconv_ops.indice_conv(feats, w, pr, pn, o.shape[0], False, False)  # noqa: E731
                        sp_fwd_path = "ops.indice_conv with precomputed pairs"
                    # the ceiling: a dense GEMM of the same MACs, into a preallocated output
                    a = torch.randn(total_pairs, c_in)
                    b = torch.randn(c_in, c_out)
                    c = torch.empty(total_pairs, c_out)
                    tasks = {
                        "ours_map": (lambda: ours_map_build(coords, shape, layer, geometry)[1], None),
                        "sp_map": (lambda: spconv_pairs(spconv_ops, ConvAlgo.Native, coords, shape, layer), None),
                        "ours_fwd": (lambda: conv(x), None),
                        "sp_fwd": (sp_fwd_fn, None),
                        "ours_first": (lambda xt: conv(xt),
                                       lambda: tsp.SparseTensor(feats, coords, spatial_range=shape)),
                        "sp_first": (lambda xt: m(xt), lambda: spconv.SparseConvTensor(feats, coords, shape, 1)),
                        "mm": (lambda: torch.mm(a, b, out=c), None),
                    }
                    tm = interleaved_times(tasks, rep, warm)
                    del a, b, c, x
                    ours_map, sp_map, ours_fwd, sp_fwd = tm["ours_map"], tm["sp_map"], tm["ours_fwd"], tm["sp_fwd"]
                    ours_first, sp_first, mm = tm["ours_first"], tm["sp_first"], tm["mm"]
                    sp_fwd["path"] = sp_fwd_path

                    # --- spconv's race: its output at t threads vs at one thread
                    if t > 1:
                        outs = [m(spconv.SparseConvTensor(feats, coords, shape, 1)) for _ in range(3)]
                        race = max(rel_max(sorted_rows(o.indices, o.features),
                                           sorted_rows(ref.indices, ref.features)) for o in outs)
                    else:
                        race = None

                ours_fwd["gflops"] = gflops(macs, ours_fwd["median_s"])
                sp_fwd["gflops"] = gflops(macs, sp_fwd["median_s"])
                mm["gflops"] = gflops(macs, mm["median_s"])
                racy = t > 1
                row["ours"][key] = {"map_build": ours_map, "forward_cached": ours_fwd, "first_call": ours_first,
                                    "first_minus_cached_s": ours_first["median_s"] - ours_fwd["median_s"]}
                row["spconv"][key] = {"racy": racy, "map_build": sp_map, "forward_cached": sp_fwd,
                                      "first_call": sp_first,
                                      "first_minus_cached_s": sp_first["median_s"] - sp_fwd["median_s"],
                                      "max_abs_diff_vs_1t_over_max_abs": race}
                row["mm"][key] = mm

        # Ratios: t_spconv / t_ours (> 1: ours faster); ours' share of the torch.mm rate.
        ratios = {}
        for t in threads:
            for u in threads:
                if u > t:
                    continue  # ours at t threads against spconv at u <= t threads
                tag = f"ours{t}t_vs_spconv{u}t" + ("_racy" if u > 1 else "")
                ratios["fwd_" + tag] = (row["spconv"][f"{u}t"]["forward_cached"]["median_s"]
                                        / row["ours"][f"{t}t"]["forward_cached"]["median_s"])
                ratios["map_" + tag] = (row["spconv"][f"{u}t"]["map_build"]["median_s"]
                                        / row["ours"][f"{t}t"]["map_build"]["median_s"])
            ratios[f"fwd_ours{t}t_vs_mm"] = row["ours"][f"{t}t"]["forward_cached"]["gflops"] / row["mm"][f"{t}t"]["gflops"]
            ratios[f"fwd_spconv{t}t_vs_mm"] = (row["spconv"][f"{t}t"]["forward_cached"]["gflops"]
                                              / row["mm"][f"{t}t"]["gflops"])
        row["ratios"] = ratios
        results.append(row)

    report = {
        "benchmark": "conv_cpu",
        "description": __doc__,
        "machine": dict(machine, loadavg_at_end=load_average(), busy_processes_at_end=busy_processes()),
        "threads": threads,
        "spconv_racy_thread_counts": [t for t in threads if t > 1],
        "workload": {"beams": BEAMS, "voxel_m": VOXEL, "scan_seed": SCAN_SEED, "batch": 1, "dtype": "float32",
                     "num_voxels": n, "spatial_shape": shape, "grad": False},
        "repeats": rep, "warmup": warm,
        "layers": results,
    }
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "conv_cpu.json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
    print_table(report)
    png_path = os.path.join(args.out, "conv_cpu.png")
    plot(report, png_path)
    print(f"\nwrote {json_path} and {png_path}")


def print_table(report):
    threads = report["threads"]
    print(f"\n{report['machine']['cpu_model']}, torch {report['machine']['torch']}, "
          f"spconv {report['machine']['spconv']}; {report['workload']['num_voxels']} voxels; "
          f"median of {report['repeats']}")
    print("Speedups = t_spconv / t_ours (> 1: ours faster). 'mm' = ours GFLOP/s / torch.mm GFLOP/s "
          "(same MACs, same threads). spconv at >1 thread is RACY (wrong results).\n")
    cols = []
    for t in threads:
        cols.append((f"fwd o{t}/s1", f"fwd_ours{t}t_vs_spconv1t"))
    for t in threads:
        if t > 1:
            cols.append((f"fwd o{t}/s{t} RACY", f"fwd_ours{t}t_vs_spconv{t}t_racy"))
    for t in threads:
        cols.append((f"o{t}/mm", f"fwd_ours{t}t_vs_mm"))
    for t in threads:
        cols.append((f"map o{t}/s1", f"map_ours{t}t_vs_spconv1t"))
    for t in threads:
        if t > 1:
            cols.append((f"map o{t}/s{t} RACY", f"map_ours{t}t_vs_spconv{t}t_racy"))
    head = f"{'layer':18s} {'pairs':>9s} " + " ".join(f"{c[0]:>{max(9, len(c[0]))}s}" for c in cols)
    print(head)
    for row in report["layers"]:
        line = f"{row['layer']:18s} {row['total_pairs']:9d} "
        line += " ".join(f"{row['ratios'][c[1]]:>{max(9, len(c[0]))}.2f}" for c in cols)
        print(line)

    print("\nAbsolute medians in ms (fwd = forward with map cached; map = kernel-map build; "
          "first = fresh tensor, map + forward):")
    head = f"{'layer':18s}"
    for t in threads:
        r = " RACY" if t > 1 else ""
        head += (f" | {t}t: {'ours fwd':>8s} {'sp fwd' + r:>11s} {'mm':>7s} {'ours map':>8s} "
                 f"{'sp map' + r:>11s} {'ours 1st':>8s} {'sp 1st' + r:>11s} {'GF/s o':>6s} {'GF/s mm':>7s}")
    print(head)
    for row in report["layers"]:
        line = f"{row['layer']:18s}"
        for t in threads:
            o, sp, mm = row["ours"][f"{t}t"], row["spconv"][f"{t}t"], row["mm"][f"{t}t"]
            line += (f" | {'':4s}{o['forward_cached']['median_s'] * 1e3:8.2f} "
                     f"{sp['forward_cached']['median_s'] * 1e3:11.2f} {mm['median_s'] * 1e3:7.2f} "
                     f"{o['map_build']['median_s'] * 1e3:8.2f} {sp['map_build']['median_s'] * 1e3:11.2f} "
                     f"{o['first_call']['median_s'] * 1e3:8.2f} {sp['first_call']['median_s'] * 1e3:11.2f} "
                     f"{o['forward_cached']['gflops']:6.1f} {mm['gflops']:7.1f}")
        print(line)
    print("\nspconv output difference at >1 thread vs 1 thread (max abs / max abs, worst of 3 runs):")
    for row in report["layers"]:
        diffs = ", ".join(f"{t}t: {row['spconv'][f'{t}t']['max_abs_diff_vs_1t_over_max_abs']:.2e}"
                          for t in threads if t > 1)
        agree = row["agreement_vs_spconv_1t"]["max_abs_err_over_max_abs"]
        print(f"  {row['layer']:18s} {diffs}   (ours vs spconv 1t: {agree:.2e})")


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    threads = report["threads"]
    layers = [r["layer"] for r in report["layers"]]
    fwd_series, map_series = [], []
    for t in threads:
        fwd_series.append((f"ours {t}t / spconv 1t", f"fwd_ours{t}t_vs_spconv1t", None))
        map_series.append((f"ours {t}t / spconv 1t", f"map_ours{t}t_vs_spconv1t", None))
    for t in threads:
        if t > 1:
            fwd_series.append((f"ours {t}t / spconv {t}t (racy)", f"fwd_ours{t}t_vs_spconv{t}t_racy", "//"))
            map_series.append((f"ours {t}t / spconv {t}t (racy)", f"map_ours{t}t_vs_spconv{t}t_racy", "//"))
    for t in threads:
        fwd_series.append((f"ours {t}t / torch.mm {t}t (rate)", f"fwd_ours{t}t_vs_mm", ".."))

    fig, axes = plt.subplots(1, 2, figsize=(15, 5.5))
    for ax, series, title in ((axes[0], fwd_series, "conv forward, map cached"),
                              (axes[1], map_series, "kernel-map build")):
        x = np.arange(len(layers))
        width = 0.8 / len(series)
        for i, (label, key, hatch) in enumerate(series):
            vals = [r["ratios"][key] for r in report["layers"]]
            bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, label=label, hatch=hatch,
                          edgecolor="black", linewidth=0.4)
            ax.bar_label(bars, fmt="%.2f", fontsize=6, rotation=90, padding=2)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(x, layers, rotation=15)
        ax.set_ylabel("ratio (speedup t_spconv / t_ours; or share of mm rate)")
        ax.set_title(title)
        ax.legend(fontsize=7)
        ax.margins(y=0.15)
    m = report["machine"]
    fig.suptitle(f"torchsparse_pp vs spconv {m['spconv']} (CPU), {report['workload']['num_voxels']} voxels "
                 f"(64-beam, 0.05 m) — {m['cpu_model']}, torch {m['torch']}, {m['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
