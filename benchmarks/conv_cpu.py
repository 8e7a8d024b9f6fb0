"""CPU sparse convolution, every dataflow of torchsparse_pp vs spconv 2.3.8 (Native) vs torch.mm.

Workload: one generated 64-beam scan (seed 0), shifted to non-negative coordinates, voxelised at
0.05 m, batch 1, float32, inference (torch.no_grad). The coarser coordinate sets (tensor stride 2,
4, 8, 16) come from applying k2 s2 downsamples (spconv mode, padding 0, clipped to the dense output
size through spatial_range) one after the other; the run checks that spconv's
``get_indice_pairs`` gives the same sets.

Layers (the MinkUNet layer shapes, each at the tensor stride where MinkUNet runs it):
SubM 3^3 32->32 at stride 1, 64->64 at stride 4, 128->128 at stride 8, 256->256 at stride 16;
the k2 s2 downsample 32->32 from stride 1 to 2 and its transposed conv 32->32 from stride 2 back
to stride 1 (it reuses the downsample's map; spconv: ``ops.indice_conv(inverse=True)`` on the
downsample's pairs). Extra rows: SubM 3^3 at C = 64 and 128 on the full stride-1 scan (wider channels at the
largest voxel count).

Contenders per layer and thread count (--threads, default 1 and 2):
- ours, every dataflow config (CONFIGS below): gather_scatter, gather_scatter with adaptive
  grouping, fetch_on_demand, implicit_gemm unsorted, implicit_gemm sorted with split_mask_num
  1..4. Timed call: ``nn.functional.conv3d(x, w, ..., config=cfg)`` on a SparseTensor whose cache
  already holds the map and every view / implicit-GEMM plan the config needs (one untimed call
  per config first), i.e. argument checks, cache lookup, the kernel and the output tensor.
- spconv 2.3.8 CPU (ConvAlgo.Native): SubM: ``SubMConv3d.forward`` on a SparseConvTensor whose
  indice_dict holds its indice_key (its own map reuse path). Downsample / transposed:
  ``spconv.pytorch.ops.indice_conv`` on the pairs from ``get_indice_pairs`` (inverse=True for the
  transposed layer), the call its modules make once they have the pairs. spconv's CPU path races
  at more than one thread: its >1-thread figures are marked RACY, and the run records how far
  its output (fresh map + conv) at those thread counts is from its 1-thread output.
- the ceiling: ``torch.mm`` of [total_pairs, C_in] x [C_in, C_out] into a preallocated output,
  the same MACs (total_pairs * C_in * C_out) as the sparse conv, same run, same thread count.
- the machine's compute peak per thread count: the faster of ``torch.mm`` on square 2048 x 2048
  float32 matrices and our GEMM micro-kernel run dense (see gemm_peak). A layer whose 2x-spconv rate would exceed it cannot meet
  target (a) on this machine; the summary prints that rate as a share of the peak.
- map build, ours: ``submanifold_map`` / ``strided_map`` on a fresh ``KernelMapCache`` plus the
  weight-stationary view gather_scatter and fetch_on_demand run on (``kmap.pairs``); separately
  the map plus the implicit-GEMM plan (``kmap.plan('out', split, TILE_ROWS, SORT_WINDOW)``) for
  each split count the configs use. The headline map figure of a layer is the map plus the view
  its fastest dataflow needs. The JSON splits each into map / view seconds.
- map build, spconv: ``spconv.pytorch.ops.get_indice_pairs`` (subm or strided), the call its
  modules make when no indice_key entry exists. For SubM it stores pairs only for the offsets
  before the centre (the rest are the same pairs swapped, the centre is the identity), so it
  searches half the offsets ours does ("spconv_pairs_stored" vs "spconv_total_pairs").
  The transposed layer builds no map (it reuses the downsample's): its map figures are null.
  Layers on the same coordinate set with the same geometry share one map measurement.

Timing (time.perf_counter): per layer and thread count, all timed tasks run round-robin, one of
each per round, --warmup rounds then --repeats rounds, and the median (also min / max) is kept, so
load from elsewhere on the machine hits ours, spconv and torch.mm alike.

Correctness: every dataflow's output at every thread count vs spconv's 1-thread output, rows
matched by sorting coordinates, as max |diff| / max |spconv|; a warning is printed above 1e-4.

Reported per layer: the best dataflow (by forward time at 2 threads) and its speedup t_spconv /
t_ours (> 1: ours faster) vs spconv at 2 threads (racy; its fastest setting) and at 1 thread;
ours' share of the torch.mm rate (GFLOP/s ours / GFLOP/s mm) at each thread count; map-build
speedups; and the performance targets as pass / fail lines at 2 threads.

Usage: python benchmarks/conv_cpu.py [--repeats N] [--warmup N] [--threads 1,2] [--out DIR] [--quick]
"""
import argparse
import os
import sys
import time

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, busy_processes, coord_sort_key, gflops, interleaved_times,  # noqa: E402
                    lidar_batch, load_average, machine_info, num_threads, output_dir, rel_max, same_coord_set,
                    save_figure, sorted_rows, write_json)

from torchsparse_pp import SparseTensor, ops  # noqa: E402
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map, submanifold_map  # noqa: E402
from torchsparse_pp.nn.functional import ConvConfig, conv3d  # noqa: E402
from torchsparse_pp.nn.functional.dataflows.implicit_gemm import CPU_SORT_WINDOW as SORT_WINDOW  # noqa: E402
from torchsparse_pp.nn.functional.dataflows.implicit_gemm import CPU_TILE_ROWS as TILE_ROWS  # noqa: E402

BEAMS, VOXEL, SCAN_SEED = 64, 0.05, 0
LEVELS = 5  # tensor strides 1, 2, 4, 8, 16
TOLERANCE = 1e-4  # max |ours - spconv 1t| / max |spconv 1t| above this prints a warning
ADAPTIVE = {"epsilon": 0.5, "mm_thresh": 20000}

# (short name, config, in --quick)
CONFIGS = [
    ("gs", ConvConfig("gather_scatter"), True),
    ("gs-adapt", ConvConfig("gather_scatter", **ADAPTIVE), True),
    ("fod", ConvConfig("fetch_on_demand"), True),
    ("ig-unsorted", ConvConfig("implicit_gemm", sorted=False, split_mask_num=0), True),
    ("ig-sorted1", ConvConfig("implicit_gemm", sorted=True, split_mask_num=1), True),
    ("ig-sorted2", ConvConfig("implicit_gemm", sorted=True, split_mask_num=2), False),
    ("ig-sorted3", ConvConfig("implicit_gemm", sorted=True, split_mask_num=3), False),
    ("ig-sorted4", ConvConfig("implicit_gemm", sorted=True, split_mask_num=4), False),
]

# level: the input's tensor stride is 2**level. kind: subm / down (k2 s2) / up (its transpose).
LAYERS = [
    {"name": "subm3 c32 s1", "kind": "subm", "level": 0, "c": 32, "extra": False},
    {"name": "subm3 c64 s4", "kind": "subm", "level": 2, "c": 64, "extra": False},
    {"name": "subm3 c128 s8", "kind": "subm", "level": 3, "c": 128, "extra": False},
    {"name": "subm3 c256 s16", "kind": "subm", "level": 4, "c": 256, "extra": False},
    {"name": "down k2s2 c32 s1>2", "kind": "down", "level": 0, "c": 32, "extra": False},
    {"name": "up k2s2T c32 s2>1", "kind": "up", "level": 0, "c": 32, "extra": False},
    {"name": "subm3 c64 s1 (extra)", "kind": "subm", "level": 0, "c": 64, "extra": True},
    {"name": "subm3 c128 s1 (extra)", "kind": "subm", "level": 0, "c": 128, "extra": True},
]
SUBM = ConvGeometry.make(3, 1, 1, 1)
DOWN = ConvGeometry.make(2, 2, 1, 0)


def geometry_of(layer):
    return SUBM if layer["kind"] == "subm" else DOWN


def needed_view(config):
    """The map view a forward (non-transposed) conv with this config reads: 'pairs' or 'plan<split>'."""
    if config.dataflow == "implicit_gemm":
        return f"plan{config.split_mask_num}"
    return "pairs"


# --- workload ---------------------------------------------------------------------------------------

def coordinate_levels(spconv_ops, algo, coords, shape):
    """Coordinate sets at tensor strides 1, 2, 4, ... by repeated k2 s2 spconv-mode downsamples
    (ours), each checked against spconv's output set of the same downsample."""
    levels = [(coords, tuple(shape))]
    for _ in range(LEVELS - 1):
        c, s = levels[-1]
        kmap = strided_map(KernelMapCache(), c, DOWN, "spconv", s)
        outids = spconv_pairs(spconv_ops, algo, c, s, "down")[0]
        if not same_coord_set(outids, kmap.out_coords):
            print(f"warning: downsample of {c.shape[0]} voxels: spconv's output set ({outids.shape[0]}) "
                  f"differs from ours ({kmap.num_out})", file=sys.stderr)
        levels.append((kmap.out_coords, tuple(kmap.out_range)))
    return levels


# --- ours -------------------------------------------------------------------------------------------

def ours_build(coords, shape, kind, view):
    """Map on a fresh cache, then one view: 'pairs' or 'plan<split>'. Returns {part: seconds}."""
    start = time.perf_counter()
    cache = KernelMapCache()
    if kind == "subm":
        kmap = submanifold_map(cache, coords, SUBM, shape)
    else:
        kmap = strided_map(cache, coords, DOWN, "spconv", shape)
    built = time.perf_counter()
    if view == "pairs":
        kmap.pairs
    else:
        kmap.plan("out", min(int(view[4:]), kmap.geometry.volume), TILE_ROWS, SORT_WINDOW)
    end = time.perf_counter()
    return {"map": built - start, "view": end - built}


def ours_forward(layer, x, weight, config):
    if layer["kind"] == "subm":
        return conv3d(x, weight, 3, config=config)
    return conv3d(x, weight, 2, stride=2, padding=0, transposed=layer["kind"] == "up",
                  downsample_mode="spconv", config=config)


# --- spconv -----------------------------------------------------------------------------------------

def spconv_pairs(spconv_ops, algo, coords, shape, kind):
    subm = kind == "subm"
    k, s, p = (3, 1, 1) if subm else (2, 2, 0)
    return spconv_ops.get_indice_pairs(coords, 1, list(shape), algo, [k] * 3, [s] * 3, [p] * 3,
                                       [1] * 3, [0] * 3, subm, False)


def spconv_weight(weight_ours, k):
    """ours [K, C_in, C_out] -> spconv [C_out, kx, ky, kz, C_in]."""
    c_in, c_out = weight_ours.shape[1:]
    return weight_ours.reshape(k, k, k, c_in, c_out).permute(4, 0, 1, 2, 3).contiguous()


def reorder_rows(feats, coords_from, coords_to):
    """``feats`` (rows on ``coords_from``) reordered to the rows of ``coords_to`` (the same set)."""
    src = torch.argsort(coord_sort_key(coords_from))
    dst = torch.argsort(coord_sort_key(coords_to))
    out = torch.empty_like(feats)
    out[dst] = feats[src]
    return out


class SpconvLayer:
    """spconv's side of one layer: the cached-map forward, and a fresh (map + conv) run.

    ``feats`` are rows on ``feat_coords`` (ours' order). For the transposed layer they sit on the
    coarse set, whose row order in spconv is that of its own downsample's ``outids``: they are
    reordered to it (untimed)."""

    def __init__(self, spconv, spconv_ops, algo, layer, weight_ours, levels, feats, feat_coords):
        self.layer, self.spconv, self.ops, self.algo = layer, spconv, spconv_ops, algo
        self.feats, self.feat_coords = feats, feat_coords
        c = layer["c"]
        if layer["kind"] == "subm":
            self.coords, self.shape = levels[layer["level"]]
            self.module = spconv.SubMConv3d(c, c, 3, bias=False, indice_key="bench")
            with torch.no_grad():
                self.module.weight.copy_(spconv_weight(weight_ours, 3))
            self.path = "SubMConv3d.forward with indice_dict reuse"
        else:
            self.coords, self.shape = levels[0]  # the fine set: input of down, output of up
            self.weight = spconv_weight(weight_ours, 2)
            self.path = "ops.indice_conv with precomputed pairs" + (", inverse=True" if layer["kind"] == "up" else "")
        self.cached = None

    def fresh(self):
        """Map + conv from scratch; returns (out coords, out feats)."""
        if self.layer["kind"] == "subm":
            out = self.module(self.spconv.SparseConvTensor(self.feats, self.coords, list(self.shape), 1))
            return out.indices, out.features
        outids, pairs, num = spconv_pairs(self.ops, self.algo, self.coords, self.shape, "down")
        if self.layer["kind"] == "down":
            return outids, self.ops.indice_conv(self.feats, self.weight, pairs, num, outids.shape[0], False, False)
        feats = reorder_rows(self.feats, self.feat_coords, outids)
        return self.coords, self.ops.indice_conv(feats, self.weight, pairs, num, self.coords.shape[0], True, False)

    def prepare(self):
        """Builds the map once (at the current thread count) for ``forward``."""
        if self.layer["kind"] == "subm":
            xs = self.spconv.SparseConvTensor(self.feats, self.coords, list(self.shape), 1)
            xs.indice_dict = dict(self.module(xs).indice_dict)  # its own indice_key reuse path
            self.cached = xs
        else:
            self.cached = spconv_pairs(self.ops, self.algo, self.coords, self.shape, "down")
            if self.layer["kind"] == "up":
                self.up_feats = reorder_rows(self.feats, self.feat_coords, self.cached[0])

    def forward(self):
        if self.layer["kind"] == "subm":
            return self.module(self.cached)
        outids, pairs, num = self.cached
        if self.layer["kind"] == "down":
            return self.ops.indice_conv(self.feats, self.weight, pairs, num, outids.shape[0], False, False)
        return self.ops.indice_conv(self.up_feats, self.weight, pairs, num, self.coords.shape[0], True, False)


# --- one layer --------------------------------------------------------------------------------------

def map_key(layer):
    return None if layer["kind"] == "up" else (layer["kind"], layer["level"])


def run_layer(layer, levels, configs, threads, args, modules, map_results, bar):
    spconv, spconv_ops, algo = modules
    kind, level, c = layer["kind"], layer["level"], layer["c"]
    torch.manual_seed(1000 + LAYERS.index(layer))
    fine_coords, fine_shape = levels[level]
    weight = torch.randn(DOWN.volume if kind != "subm" else SUBM.volume, c, c) / (c * 8) ** 0.5

    # ours: the input tensor, its cache holding the map
    if kind == "up":
        # the downsample first makes the coarse tensor and the map in the shared cache
        x_fine = SparseTensor(torch.randn(fine_coords.shape[0], c), fine_coords, spatial_range=fine_shape)
        coarse = conv3d(x_fine, torch.randn(DOWN.volume, c, c), 2, stride=2, padding=0, downsample_mode="spconv")
        feats = torch.randn(coarse.C.shape[0], c)
        x = coarse.replace_feats(feats)
        kmap = next(k for _, k in x.cache.maps())
        in_coords, n_in = coarse.C, coarse.C.shape[0]
    else:
        feats = torch.randn(fine_coords.shape[0], c)
        x = SparseTensor(feats, fine_coords, stride=2 ** level, spatial_range=fine_shape)
        cache = KernelMapCache()
        kmap = (submanifold_map(cache, fine_coords, SUBM, fine_shape) if kind == "subm"
                else strided_map(cache, fine_coords, DOWN, "spconv", fine_shape))
        in_coords, n_in = fine_coords, fine_coords.shape[0]
    total_pairs = int(kmap.pairs.offsets[-1])
    macs = total_pairs * c * c
    sp = SpconvLayer(spconv, spconv_ops, algo, layer, weight, levels, feats, x.C)

    with num_threads(1):
        ref_coords, ref_feats = sp.fresh()  # spconv at 1 thread: the reference
        ref = sorted_rows(ref_coords, ref_feats)
        sp_pairs = spconv_pairs(spconv_ops, algo, *levels[level], "subm" if kind == "subm" else "down")
    stored = int(sp_pairs[2].sum())
    row = {
        "layer": layer["name"], "kind": kind, "extra": layer["extra"],
        "kernel_size": 3 if kind == "subm" else 2, "stride": 1 if kind == "subm" else 2,
        "padding": 1 if kind == "subm" else 0,
        "tensor_stride_in": 2 ** (level + 1) if kind == "up" else 2 ** level,
        "tensor_stride_out": 2 ** (level + 1) if kind == "down" else 2 ** level,
        "c_in": c, "c_out": c, "n_in": n_in, "n_out": ref_feats.shape[0],
        "total_pairs": total_pairs, "pairs_per_output": total_pairs / ref_feats.shape[0],
        "pairs_per_offset": kmap.pairs.pairs_per_offset.tolist(),
        "spconv_pairs_stored": stored,
        "spconv_total_pairs": (n_in + 2 * stored) if kind == "subm" else stored,
        "macs": macs, "spconv_forward_path": sp.path,
        "forward": {}, "mm": {}, "correctness": {}, "spconv_race": {},
        "loadavg_at_start": load_average(),
    }
    if row["spconv_total_pairs"] != total_pairs:
        print(f"warning: {layer['name']}: spconv has {row['spconv_total_pairs']} pairs, ours {total_pairs}",
              file=sys.stderr)

    mkey = map_key(layer)
    time_maps = mkey is not None and mkey not in map_results
    views = sorted({needed_view(cfg) for _, cfg in configs})
    map_timings = {}

    for t in threads:
        key = f"{t}t"
        with num_threads(t):
            # untimed first call per config: builds every view / plan it needs; checks it vs spconv 1t
            errs = {}
            for name, cfg in configs:
                out = ours_forward(layer, x, weight, cfg)
                same = same_coord_set(out.C, ref_coords)
                errs[name] = rel_max(sorted_rows(out.C, out.F), ref) if same else float("inf")
            row["correctness"][key] = errs
            sp.prepare()
            a, b, cm = torch.randn(total_pairs, c), torch.randn(c, c), torch.empty(total_pairs, c)

            tasks = {f"ours:{name}": ((lambda cfg=cfg: ours_forward(layer, x, weight, cfg)), None)
                     for name, cfg in configs}
            tasks["spconv"] = (sp.forward, None)
            tasks["mm"] = ((lambda: torch.mm(a, b, out=cm)), None)
            if time_maps:
                for view in views:
                    tasks[f"map:ours+{view}"] = ((lambda v=view: ours_build(fine_coords, fine_shape, kind, v)), None)
                tasks["map:spconv"] = ((lambda: spconv_pairs(spconv_ops, algo, fine_coords, fine_shape, kind)), None)
            bar.set_postfix_str(f"{layer['name']} {key}")
            tm = interleaved_times(tasks, args.repeats, args.warmup, on_round=lambda: bar.update(1))
            del a, b, cm

            fwd = {name: tm[f"ours:{name}"] for name, _ in configs}
            fwd["spconv"] = dict(tm["spconv"], racy=t > 1)
            for v in fwd.values():
                v["gflops"] = gflops(macs, v["median_s"])
            row["forward"][key] = fwd
            row["mm"][key] = dict(tm["mm"], gflops=gflops(macs, tm["mm"]["median_s"]))
            if time_maps:
                map_timings[key] = {name[4:]: tm[name] for name in tm if name.startswith("map:")}
                map_timings[key]["spconv"]["racy"] = t > 1

            # spconv's race: its fresh (map + conv) output at t > 1 threads vs at one thread
            if t > 1:
                row["spconv_race"][key] = max(rel_max(sorted_rows(*sp.fresh()), ref) for _ in range(3))

    if time_maps:
        map_results[mkey] = {"timed_with": layer["name"], "timings": map_timings}
    if mkey is None:
        row["map_build"] = None
    else:
        row["map_build"] = {"timed_with": map_results[mkey]["timed_with"],
                            "timings": map_results[mkey]["timings"]}
    row["loadavg_at_end"] = load_average()
    return row


# --- summary ----------------------------------------------------------------------------------------

def summarize(row, configs, threads, tt):
    """Best dataflow, speedups and shares of one layer. ``tt``: the headline thread count (2)."""
    names = [n for n, _ in configs]
    cfg_of = dict(configs)
    fwd = row["forward"]
    s = {"headline_threads": tt, "best": {}, "fwd_speedup": {}, "mm_share": {}, "spconv_mm_share": {},
         "map_view": {}, "map_speedup": {}, "map_speedup_pairs": {}}
    for t in threads:
        key = f"{t}t"
        best = min(names, key=lambda n: fwd[key][n]["median_s"])
        s["best"][key] = best
        mm_rate = row["mm"][key]["gflops"]
        s["mm_share"][key] = fwd[key][best]["gflops"] / mm_rate
        s["spconv_mm_share"][key] = fwd[key]["spconv"]["gflops"] / mm_rate
    best = s["best"][f"{tt}t"]
    s["best_dataflow"] = best
    s["best_config"] = vars(cfg_of[best]).copy()
    # forward: ours (its best at that thread count) vs spconv at u <= t threads
    for t in threads:
        for u in threads:
            if u <= t:
                tag = f"ours{t}t_vs_spconv{u}t" + ("_racy" if u > 1 else "")
                s["fwd_speedup"][tag] = (fwd[f"{u}t"]["spconv"]["median_s"]
                                         / fwd[f"{t}t"][s["best"][f"{t}t"]]["median_s"])
    s["fwd_speedup_per_dataflow_vs_spconv_same_t"] = {
        f"{t}t": {n: fwd[f"{t}t"]["spconv"]["median_s"] / fwd[f"{t}t"][n]["median_s"] for n in names}
        for t in threads}
    if row["map_build"] is not None:
        mt = row["map_build"]["timings"]
        for t in threads:
            view = needed_view(cfg_of[s["best"][f"{t}t"]])
            s["map_view"][f"{t}t"] = view
            for u in threads:
                if u <= t:
                    tag = f"ours{t}t_vs_spconv{u}t" + ("_racy" if u > 1 else "")
                    sp_t = mt[f"{u}t"]["spconv"]["median_s"]
                    s["map_speedup"][tag] = sp_t / mt[f"{t}t"][f"ours+{view}"]["median_s"]
                    s["map_speedup_pairs"][tag] = sp_t / mt[f"{t}t"]["ours+pairs"]["median_s"]
    else:
        s["map_view"] = s["map_speedup"] = s["map_speedup_pairs"] = None
    return s


def targets(rows, tt):
    key = f"{tt}t"
    racy = f"_racy" if tt > 1 else ""
    tag = f"ours{tt}t_vs_spconv{tt}t{racy}"
    out = []
    a = [(r["layer"], r["summary"]["fwd_speedup"][tag]) for r in rows
         if (r["kind"] == "subm" and r["c_in"] >= 32) or r["kind"] == "down"]
    out.append({"target": f"(a) best dataflow >= 2.0x faster than spconv ({tt}t{', racy' if tt > 1 else ''}) "
                          "on every SubM layer with C >= 32 and on the downsample",
                "threshold": 2.0, "values": dict(a), "pass": all(v >= 2.0 for _, v in a)})
    b = [(r["layer"], r["summary"]["map_speedup"][tag]) for r in rows if r["map_build"] is not None]
    out.append({"target": f"(b) map build (map + the view the best dataflow needs) >= 2.0x faster than "
                          f"spconv get_indice_pairs ({tt}t{', racy' if tt > 1 else ''}) for the same layer",
                "threshold": 2.0, "values": dict(b), "pass": all(v >= 2.0 for _, v in b)})
    c = [(r["layer"], r["summary"]["mm_share"][key]) for r in rows if r["c_in"] >= 64]
    out.append({"target": f"(c) best dataflow >= 60% of the torch.mm rate ({tt}t) for C >= 64",
                "threshold": 0.6, "values": dict(c), "pass": all(v >= 0.6 for _, v in c)})
    return out


# --- main -------------------------------------------------------------------------------------------

def gemm_peak(threads, repeats, n=2048, c=128, offsets=27):
    """The compute ceiling per thread count, the faster of two dense GEMMs:
    - "mm": torch.mm on square n x n float32 matrices (MKL, which on AMD CPUs may not take its
      fastest path);
    - "brgemm": the micro-kernel our tiled dataflows use (ATen's cpublas::brgemm), as
      fetch_on_demand runs it when nothing misses the cache: an identity map (every offset pairs
      row i with row i) over one output block per thread, C = c channels, so the inputs, the
      outputs and the tiles stay in L2 and only the GEMMs, the copies and the adds remain."""
    a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    tasks, macs = {"mm": ((lambda: torch.mm(a, b, out=out)), None)}, {"mm": n ** 3}
    block = (1 << 17) // c  # fetch_on_demand's output block rows (pair_block_rows)
    result = {}
    for t in threads:
        rows = block * t
        x, w = torch.randn(rows, c), torch.randn(offsets, c, c)
        idx = torch.arange(rows, dtype=torch.int32).repeat(offsets)
        offs = torch.arange(offsets + 1) * rows
        identity = torch.arange(offsets) == offsets // 2
        tasks["brgemm"] = ((lambda: ops.fetch_on_demand_forward(x, w, idx, idx, offs, identity, rows, False)), None)
        macs["brgemm"] = offsets * rows * c * c
        with num_threads(t):
            tm = interleaved_times(tasks, max(3, repeats // 3), 1)
        rates = {k: gflops(macs[k], v["median_s"]) for k, v in tm.items()}
        result[f"{t}t"] = {"gflops": max(rates.values()), "mm_gflops": rates["mm"], "brgemm_gflops": rates["brgemm"],
                           "mm_n": n, "brgemm_rows": rows, "brgemm_channels": c, "brgemm_offsets": offsets}
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 15; 3 with --quick)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default 2; 1 with --quick)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (1 is always added)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and dataflow configs (development)")
    add_output_arguments(parser, "conv_cpu")
    args = parser.parse_args(argv)
    out = output_dir(args, "conv_cpu")
    args.repeats = args.repeats if args.repeats is not None else (3 if args.quick else 15)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    threads = sorted({1, *(int(t) for t in args.threads.split(","))})
    tt = 2 if 2 in threads else max(threads)
    configs = [(n, c) for n, c, in_quick in CONFIGS if in_quick or not args.quick]

    try:
        import spconv.pytorch as spconv
        from spconv.core import ConvAlgo
        from spconv.pytorch import ops as spconv_ops
    except ImportError:
        sys.exit("spconv is required: pip install spconv==2.3.8")

    started = time.perf_counter()
    machine = machine_info()
    if machine["loadavg_at_start"] and machine["loadavg_at_start"][0] > 0.5:
        print(f"warning: load average {machine['loadavg_at_start']}: other work on this machine will "
              "skew the timings", file=sys.stderr)
    torch.manual_seed(0)
    coords, shape = lidar_batch(BEAMS, VOXEL, [SCAN_SEED])
    with torch.no_grad(), num_threads(1):
        levels = coordinate_levels(spconv_ops, ConvAlgo.Native, coords, shape)
    print(f"64-beam scan (seed {SCAN_SEED}) at {VOXEL} m: voxels per tensor stride "
          + ", ".join(f"s{2 ** i}: {c.shape[0]}" for i, (c, _) in enumerate(levels)), file=sys.stderr)

    peak = gemm_peak(threads, args.repeats)
    print("dense GEMM peak: " + ", ".join(f"{k} {v['gflops']:.0f} GFLOP/s (torch.mm {v['mm_gflops']:.0f}, "
                                          f"brgemm {v['brgemm_gflops']:.0f})" for k, v in peak.items()), file=sys.stderr)
    rows, map_results = [], {}
    total_rounds = len(LAYERS) * len(threads) * (args.repeats + args.warmup)
    with torch.no_grad(), tqdm(total=total_rounds, desc="rounds", unit="round") as bar:
        for layer in LAYERS:
            rows.append(run_layer(layer, levels, configs, threads, args,
                                  (spconv, spconv_ops, ConvAlgo.Native), map_results, bar))
    for row in rows:
        row["summary"] = summarize(row, configs, threads, tt)
        row["summary"]["peak_share"] = {f"{t}t": row["forward"][f"{t}t"][row["summary"]["best"][f"{t}t"]]["gflops"]
                                        / peak[f"{t}t"]["gflops"] for t in threads}
        row["summary"]["twice_spconv_peak_share"] = 2 * row["forward"][f"{tt}t"]["spconv"]["gflops"] / peak[f"{tt}t"]["gflops"]

    report = {
        "benchmark": "conv_cpu",
        "description": __doc__,
        "machine": dict(machine, loadavg_at_end=load_average(), busy_processes_at_end=busy_processes()),
        "threads": threads,
        "headline_threads": tt,
        "spconv_racy_thread_counts": [t for t in threads if t > 1],
        "workload": {"beams": BEAMS, "voxel_m": VOXEL, "scan_seed": SCAN_SEED, "batch": 1, "dtype": "float32",
                     "grad": False, "downsample": "k2 s2 p0, spconv mode, clipped by spatial_range",
                     "voxels_per_tensor_stride": {str(2 ** i): c.shape[0] for i, (c, _) in enumerate(levels)},
                     "spatial_shape_per_tensor_stride": {str(2 ** i): list(s) for i, (_, s) in enumerate(levels)}},
        "configs": {n: vars(c).copy() for n, c in configs},
        "implicit_gemm_constants": {"TILE_ROWS": TILE_ROWS, "SORT_WINDOW": SORT_WINDOW},
        "quick": args.quick, "repeats": args.repeats, "warmup": args.warmup,
        "tolerance_vs_spconv_1t": TOLERANCE,
        "gemm_peak": peak,
        "layers": rows,
        "targets": targets(rows, tt),
        "wall_seconds": None,
    }
    report["wall_seconds"] = time.perf_counter() - started
    json_path = write_json(os.path.join(out, "conv_cpu.json"), report)
    print_table(report)
    png_path = os.path.join(out, "conv_cpu.png")
    plot(report, png_path)
    print(f"\nwrote {json_path} and {png_path} ({report['wall_seconds']:.0f} s)")


# --- printing ---------------------------------------------------------------------------------------

def print_table(report):
    threads, tt = report["threads"], report["headline_threads"]
    rows = report["layers"]
    names = list(report["configs"])
    m = report["machine"]
    print(f"\n{m['cpu_model']} ({m['logical_cpus']} cpus), torch {m['torch']}, spconv {m['spconv']}, "
          f"git {m['git_revision']}; load avg start {m['loadavg_at_start']} end {m['loadavg_at_end']}")
    print("voxels per tensor stride: " + ", ".join(f"s{k}: {v}" for k, v in
                                                  report["workload"]["voxels_per_tensor_stride"].items())
          + f"; median of {report['repeats']} round-robin rounds; float32 forward")
    print(f"adaptive gather_scatter = {report['configs'].get('gs-adapt')}; spconv at >1 thread is RACY.")

    w = max(len(r["layer"]) for r in rows)
    for t in threads:
        key = f"{t}t"
        print(f"\nForward with the map cached, ms, {key} ('*' = best of ours):")
        head = f"{'layer':{w}s} {'pairs':>8s} " + " ".join(f"{n:>11s}" for n in names)
        head += f" {'spconv' + (' RACY' if t > 1 else ''):>11s} {'torch.mm':>9s}"
        print(head)
        for r in rows:
            f = r["forward"][key]
            best = r["summary"]["best"][key]
            line = f"{r['layer']:{w}s} {r['total_pairs']:8d} "
            line += " ".join(f"{f[n]['median_s'] * 1e3:10.2f}{'*' if n == best else ' '}" for n in names)
            line += f" {f['spconv']['median_s'] * 1e3:11.2f} {r['mm'][key]['median_s'] * 1e3:9.2f}"
            print(line)

    rt = "_racy" if tt > 1 else ""
    print(f"\nSummary (speedup = t_spconv / t_ours, > 1: ours faster; best = fastest of ours at {tt}t; "
          "mm share = GFLOP/s ours-best / GFLOP/s torch.mm):")
    head = (f"{'layer':{w}s} {'best ' + str(tt) + 't':>12s} {'x sp' + str(tt) + 't' + ('R' if tt > 1 else ''):>8s} "
            f"{'x sp1t':>7s} {'best 1t':>12s} {'1t x sp1t':>9s} "
            + " ".join(f"{'mm ' + str(t) + 't':>7s}" for t in threads)
            + f" {'sp mm' + str(tt) + 't':>8s} | {'map view':>9s} {'map ' + str(tt) + 't ms':>10s} "
            f"{'x sp' + str(tt) + 't':>7s} {'x sp1t':>7s} {'1t/1t':>6s} {'pairs x':>7s}")
    print(head)
    for r in rows:
        s = r["summary"]
        fs = s["fwd_speedup"]
        line = (f"{r['layer']:{w}s} {s['best'][f'{tt}t']:>12s} {fs[f'ours{tt}t_vs_spconv{tt}t{rt}']:8.2f} "
                f"{fs[f'ours{tt}t_vs_spconv1t']:7.2f} {s['best']['1t']:>12s} {fs['ours1t_vs_spconv1t']:9.2f} "
                + " ".join(f"{s['mm_share'][f'{t}t']:7.2f}" for t in threads)
                + f" {s['spconv_mm_share'][f'{tt}t']:8.2f} | ")
        if r["map_build"] is None:
            line += f"{'(reuses the downsample map)':>42s}"
        else:
            view = s["map_view"][f"{tt}t"]
            ms = r["map_build"]["timings"][f"{tt}t"][f"ours+{view}"]["median_s"] * 1e3
            ms_sp = s["map_speedup"]
            line += (f"{view:>9s} {ms:10.2f} {ms_sp[f'ours{tt}t_vs_spconv{tt}t{rt}']:7.2f} "
                     f"{ms_sp[f'ours{tt}t_vs_spconv1t']:7.2f} {ms_sp['ours1t_vs_spconv1t']:6.2f} "
                     f"{s['map_speedup_pairs'][f'ours{tt}t_vs_spconv{tt}t{rt}']:7.2f}")
        print(line)
    print("('pairs x' = map + kmap.pairs only, vs spconv at the headline thread count)")

    print("\nKernel-map build, ms (median; ours = map on a fresh cache + view; spconv = get_indice_pairs):")
    for r in rows:
        if r["map_build"] is None or r["map_build"]["timed_with"] != r["layer"]:
            continue
        for t in threads:
            mt = r["map_build"]["timings"][f"{t}t"]
            parts = ", ".join(f"{k} {v['median_s'] * 1e3:.2f}" for k, v in mt.items())
            print(f"  {r['layer']:{w}s} {t}t: {parts}")

    print("\nCorrectness: max |ours - spconv 1t| / max |spconv 1t| (worst over thread counts); "
          "spconv's own >1-thread deviation from its 1-thread output:")
    for r in rows:
        worst = {n: max(r["correctness"][f"{t}t"][n] for t in threads) for n in names}
        bad = [n for n, v in worst.items() if v > report["tolerance_vs_spconv_1t"]]
        race = ", ".join(f"{k} {v:.1e}" for k, v in r["spconv_race"].items())
        print(f"  {r['layer']:{w}s} max {max(worst.values()):.1e}" + (f"  BAD: {bad}" if bad else "")
              + f"   spconv race: {race or '-'}")

    peak = report["gemm_peak"]
    print("\nCompute ceiling: dense GEMM peak " + ", ".join(f"{k} {v['gflops']:.0f} GFLOP/s" for k, v in peak.items())
          + f". Best of ours as a share of it, and the rate 2x spconv ({tt}t) would need as a share of it:")
    for r in rows:
        s = r["summary"]
        print(f"  {r['layer']:{w}s} ours " + ", ".join(f"{k} {v:.2f}" for k, v in s["peak_share"].items())
              + f";  2x spconv needs {s['twice_spconv_peak_share']:.2f}")
    print(f"\nTargets at {tt} threads:")
    for tg in report["targets"]:
        print(f"  [{'PASS' if tg['pass'] else 'FAIL'}] {tg['target']}")
        print("         " + "; ".join(f"{k}: {v:.2f}{'' if v >= tg['threshold'] else ' (miss)'}"
                                     for k, v in tg["values"].items()))


def grouped_bars(ax, x, series, label_size=5.5):
    """One bar per series per x position, side by side. ``series``: (label, values, hatched, colour)."""
    width = 0.84 / len(series)
    for i, (label, values, hatched, colour) in enumerate(series):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label, color=colour,
                      edgecolor="black", linewidth=0.3, hatch="//" if hatched else None)
        ax.bar_label(bars, fmt="%.2f", fontsize=label_size, rotation=90, padding=2)


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    threads, tt = report["threads"], report["headline_threads"]
    rows = report["layers"]
    names = list(report["configs"])
    labels = [r["layer"] for r in rows]
    x = np.arange(len(rows))
    rt = "_racy" if tt > 1 else ""
    fig = plt.figure(figsize=(17, 10.5))
    grid = fig.add_gridspec(2, 2, height_ratios=[1.15, 1])
    ax = fig.add_subplot(grid[0, :])
    cmap = plt.get_cmap("tab10")
    grouped_bars(ax, x, [(n, [r["summary"]["fwd_speedup_per_dataflow_vs_spconv_same_t"][f"{tt}t"][n] for r in rows],
                          False, cmap(i % 10)) for i, n in enumerate(names)])
    for y, style in ((1.0, "--"), (2.0, ":")):
        ax.axhline(y, color="black", linewidth=0.8, linestyle=style)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel(f"speedup vs spconv {tt}t{' (racy)' if tt > 1 else ''}")
    ax.set_title(f"conv forward, map cached, {tt} threads: t_spconv / t_ours per dataflow (> 1: ours faster)")
    ax.legend(fontsize=7, ncol=len(names))
    ax.margins(y=0.18)

    ax = fig.add_subplot(grid[1, 0])
    mrows = [r for r in rows if r["map_build"] is not None and r["map_build"]["timed_with"] == r["layer"]]
    series = [(f"ours {tt}t / spconv {tt}t" + (" (racy)" if tt > 1 else ""), f"ours{tt}t_vs_spconv{tt}t{rt}", "map_speedup"),
              (f"ours {tt}t / spconv 1t", f"ours{tt}t_vs_spconv1t", "map_speedup"),
              ("ours 1t / spconv 1t", "ours1t_vs_spconv1t", "map_speedup"),
              (f"map + pairs only, {tt}t / {tt}t", f"ours{tt}t_vs_spconv{tt}t{rt}", "map_speedup_pairs")]
    xm = np.arange(len(mrows))
    grouped_bars(ax, xm, [(label, [r["summary"][field][tag] for r in mrows], field == "map_speedup_pairs", None)
                          for label, tag, field in series])
    for y, style in ((1.0, "--"), (2.0, ":")):
        ax.axhline(y, color="black", linewidth=0.8, linestyle=style)
    ax.set_xticks(xm, [r["layer"] for r in mrows], fontsize=7, rotation=15)
    ax.set_ylabel("speedup t_spconv / t_ours")
    ax.set_title("kernel-map build (ours: map + the view the best dataflow needs; "
                 "the extra s1 rows share the first row's map)", fontsize=9)
    ax.legend(fontsize=7)
    ax.margins(y=0.18)

    ax = fig.add_subplot(grid[1, 1])
    series = [(f"ours best {t}t", "mm_share", f"{t}t") for t in threads]
    series += [(f"spconv {t}t" + (" (racy)" if t > 1 else ""), "spconv_mm_share", f"{t}t") for t in threads]
    grouped_bars(ax, x, [(label, [r["summary"][field][key] for r in rows], field == "spconv_mm_share", None)
                         for label, field, key in series])
    ax.axhline(0.6, color="black", linewidth=0.8, linestyle=":")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, labels, fontsize=7, rotation=15)
    ax.set_ylabel("GFLOP/s / torch.mm GFLOP/s (same MACs)")
    ax.set_title("share of the torch.mm rate (target line 0.6 for C >= 64)", fontsize=9)
    ax.legend(fontsize=7)
    ax.margins(y=0.18)

    m = report["machine"]
    vox = report["workload"]["voxels_per_tensor_stride"]
    fig.suptitle(f"torchsparse_pp dataflows vs spconv {m['spconv']} (CPU, Native) — 64-beam scan at 0.05 m, "
                 f"{vox['1']} voxels at s1 — {m['cpu_model']}, torch {m['torch']}, {m['date']}, "
                 f"load avg {m['loadavg_at_start']}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
