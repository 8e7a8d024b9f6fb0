"""GPU sparse convolution: torchsparse_pp's GPU dataflows (native CUDA and Triton) vs spconv-cu126
2.3.8 vs cuBLAS.

Workloads (inference, torch.no_grad, batch --batch scans, default 1):
- MinkUNet: generated 64-beam scans (benchmarks/common.py lidar_batch) voxelised at 0.05 m; the
  coarser sets (tensor stride 2, 4, 8, 16) by k2 s2 downsamples (spconv output set, padding 0,
  clipped through spatial_range), as benchmarks/conv_cpu.py. Layers: SubM 3^3 32->32 at stride 1,
  64 at 4, 128 at 8, 256 at 16; the k2 s2 downsample 32->32 (1 -> 2) and its transposed conv
  (2 -> 1, reusing the downsample's map); extra rows SubM 3^3 at C = 64 and 128 at stride 1.
- CenterPoint VoxelResBackBone8x on a Waymo-like grid: generated 64-beam scans moved to a ground
  level frame (z + sensor height), cropped to [-75.2, 75.2]^2 x [-2, 4] m and voxelised at
  (0.1, 0.1, 0.15) m: grid 1504 x 1504 x 41 (x, y, z; OpenPCDet's extra z cell). Layers: SubM 3^3
  16, 32, 64, 128 at tensor strides 1, 2, 4, 8; the k3 s2 downsamples 16->32 (padding 1),
  32->64 (padding 1), 64->128 (padding (1, 1, 0) in x, y, z); conv_out k(1,1,3) s(1,1,2) 128->128.
  The strided layers' outputs are the next level's coordinate sets.

Precision modes (--dtypes): fp16 (float16 features and weights), bf16 (bfloat16) and tf32 (float32
with torchsparse_pp.backends.allow_tf32, torch.backends.cuda.matmul.allow_tf32 and spconv's
SPCONV_ALLOW_TF32 all True); fp32 (exact float32, all three False) on request.

Contenders per layer and mode, all on the same input features and weights:
- ours, through the public API: nn.functional.conv3d(SparseTensor on cuda, weight, ...,
  config=ConvConfig(..., backend=...)) on each backend of --backends: native CUDA (gather_scatter,
  implicit_gemm unsorted and sorted with split_mask_num 1..4) and Triton (the same, plus
  fetch_on_demand), each row named "<config>[<backend>]" (each reported, and the best);
- spconv 2.3.8: SubMConv3d / SparseConv3d / SparseInverseConv3d with ConvAlgo.MaskImplicitGemm,
  MaskSplitImplicitGemm, and its default algorithm when that is neither (skipped with a note when
  spconv cannot be imported);
- cuBLAS: torch.mm on the dense GEMM an implicit GEMM computes, M = N_out, K = kernel volume *
  C_in, N = C_out, same dtype and TF32 setting.

Two timings per contender:
- kernel only: the maps are built and cached first. Ours: conv3d on a SparseTensor whose cache
  holds the map and every view / plan the config needs. spconv SubM and transposed: the module on a
  SparseConvTensor whose indice_dict holds its indice_key. spconv strided convs never reuse pairs
  in their module, so their kernel-only figure calls spconv.pytorch.ops.implicit_gemm (or
  indice_conv for Native) on the pairs the module stored, the call the module makes after building;
- with map construction: a fresh SparseTensor / SparseConvTensor each repeat (empty cache) made
  untimed, then the timed conv builds the map, its views and runs. The transposed layer reuses
  the downsample's map, so it has no such figure.

Timing: CUDA events around each call (the device synchronised before it), so host-side work that
stalls the GPU counts; every contender of a layer and mode runs once per round, rounds rotate the
order, --warmup rounds are dropped and the median (p10, p90, min, max) of --repeats rounds is kept.
Inputs rotate among several random feature sets when one set would stay in L2 (see
rotation_count); nothing is ever timed on zeros.

Correctness: every contender's output vs a float64 CPU reference (our CPU gather_scatter in
float64, itself checked against dense conv3d by the test suite) on the same values (fp16 inputs
upcast), rows matched by coordinates, as ||out - ref|| / ||ref||. Above TOLERANCE the row is
flagged; an error or a flagged result of ours makes the exit status 2.

Ratios (per layer and mode):
- ours / cuBLAS rate = t_cuBLAS / t_ours(best): rates on equal, dense-equivalent MACs
  (N_out * K * C_out); target >= 0.8 in fp16 for C_in >= 64. The rate on useful MACs
  (pairs * C_in * C_out) is reported too.
- spconv / ours speedup = t_spconv(fastest algorithm) / t_ours(best); target >= 1.2 on the
  MinkUNet SubM 3^3 layers (kernel only). Figures against MaskImplicitGemm and spconv's default
  algorithm are in the JSON.

Output: conv_gpu.json (device, versions, date, git commit, every number; rewritten after every
layer with "complete": false until the end) and conv_gpu.png (skipped with a warning without
matplotlib), in a new benchmarks/out/conv_gpu-<time>/ (git-ignored), in --out DIR, or in
benchmarks/results with --publish. --cpu-dry-run runs the same pipeline on the CPU to check the
script itself on a machine without a GPU: native CPU rows and the Triton rows under the Triton
interpreter (TRITON_INTERPRET=1, set by the script), fp32 and bf16, on scans cropped to
--max-voxels (default 1500 there) voxels; its numbers say nothing about a GPU and it is never
published.

Usage: python benchmarks/conv_gpu.py [--quick] [--dtypes fp16,bf16,tf32] [--backends native,triton]
       [--repeats N] [--warmup N] [--batch B] [--layers SUBSTR,...] [--list-layers] [--no-spconv]
       [--max-voxels N] [--time-budget S] [--out DIR | --publish] [--cpu-dry-run]
"""
import argparse
import contextlib
import datetime
import itertools
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, cpu_model, git_revision, lidar_batch, output_dir,  # noqa: E402
                    same_coord_set, save_figure, sorted_rows)
from common import write_json as write_json_atomic  # noqa: E402

import torchsparse_pp  # noqa: E402
from torchsparse_pp import SparseTensor, backends  # noqa: E402
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map, submanifold_map  # noqa: E402
from torchsparse_pp.nn.functional import ConvConfig, conv3d  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")

BEAMS = 64
MINKUNET_VOXEL = 0.05
WAYMO_VOXEL = (0.1, 0.1, 0.15)
WAYMO_LOW, WAYMO_HIGH = (-75.2, -75.2, -2.0), (75.2, 75.2, 4.0)
MINKUNET_SEED, CENTERPOINT_SEED = 0, 1  # scan b of a batch uses seed + b

# ||out - ref|| / ||ref|| above this flags a result (fp16 and tf32 round their operands).
TOLERANCE = {"fp16": 1e-2, "bf16": 1e-2, "tf32": 1e-3, "fp32": 1e-5}
# name -> (dtype, TF32 allowed)
MODES = {"fp16": (torch.float16, False), "bf16": (torch.bfloat16, False), "tf32": (torch.float32, True),
         "fp32": (torch.float32, False)}

TARGET_CUBLAS_RATE = 0.8  # ours / cuBLAS rate, fp16, C_in >= 64
TARGET_CUBLAS_MIN_CHANNELS = 64
TARGET_SPCONV_SPEEDUP = 1.2  # t_spconv / t_ours on MinkUNet SubM 3^3 layers

# (short name, config, in --quick); each runs on every backend of --backends that has its dataflow
BASE_CONFIGS = [
    ("gs", ConvConfig("gather_scatter"), True),
    ("fod", ConvConfig("fetch_on_demand"), True),
    ("ig-unsorted", ConvConfig("implicit_gemm", sorted=False, split_mask_num=0), True),
    ("ig-sorted1", ConvConfig("implicit_gemm", sorted=True, split_mask_num=1), True),
    ("ig-sorted2", ConvConfig("implicit_gemm", sorted=True, split_mask_num=2), False),
    ("ig-sorted3", ConvConfig("implicit_gemm", sorted=True, split_mask_num=3), False),
    ("ig-sorted4", ConvConfig("implicit_gemm", sorted=True, split_mask_num=4), False),
]
BACKENDS = ("native", "triton")
DRY_RUN_MAX_VOXELS = 1500  # the Triton interpreter runs every program on the host


def backend_configs(backends_: Sequence[str], device_type: str, quick: bool):
    """(name, config) of every base config on every requested backend that has its dataflow."""
    from torchsparse_pp.nn.functional.config import available_dataflows
    return [(f"{name}[{b}]", replace(config, backend=b)) for b in backends_ for name, config, in_quick in BASE_CONFIGS
            if (in_quick or not quick) and config.dataflow in available_dataflows(device_type, b)]
SPCONV_ALGOS = ("MaskImplicitGemm", "MaskSplitImplicitGemm")  # --quick: the first only
ROTATION_CAP, ROTATION_MEMORY_CAP = 32, 1 << 30


# --- layers -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layer:
    """One conv. ``level``: the input's coordinate level (tensor stride 2**level); for 'up' the
    level of its output, the fine set whose downsample made its input."""
    name: str
    model: str  # 'minkunet' or 'centerpoint'
    kind: str  # 'subm', 'down' (strided) or 'up' (transposed of a down with the same geometry)
    level: int
    c_in: int
    c_out: int
    kernel_size: Tuple[int, int, int]
    stride: Tuple[int, int, int] = (1, 1, 1)
    padding: Tuple[int, int, int] = (1, 1, 1)
    quick: bool = False
    extra: bool = False

    @property
    def geometry(self) -> ConvGeometry:
        return ConvGeometry.make(self.kernel_size, self.stride, 1, self.padding)

    @property
    def volume(self) -> int:
        return self.geometry.volume

    @property
    def spconv_target(self) -> bool:
        return self.model == "minkunet" and self.kind == "subm" and self.kernel_size == (3, 3, 3)

    def tensor_strides(self) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        fine = (2 ** self.level,) * 3
        coarse = tuple(f * s for f, s in zip(fine, self.stride))
        if self.kind == "up":
            return coarse, fine
        return fine, (fine if self.kind == "subm" else coarse)


K3, K2 = (3, 3, 3), (2, 2, 2)
S2 = (2, 2, 2)
LAYERS = [
    Layer("mk subm3 c32 s1", "minkunet", "subm", 0, 32, 32, K3, quick=True),
    Layer("mk subm3 c64 s4", "minkunet", "subm", 2, 64, 64, K3),
    Layer("mk subm3 c128 s8", "minkunet", "subm", 3, 128, 128, K3, quick=True),
    Layer("mk subm3 c256 s16", "minkunet", "subm", 4, 256, 256, K3),
    Layer("mk down k2s2 c32 s1>2", "minkunet", "down", 0, 32, 32, K2, S2, (0, 0, 0), quick=True),
    Layer("mk up k2s2T c32 s2>1", "minkunet", "up", 0, 32, 32, K2, S2, (0, 0, 0), quick=True),
    Layer("mk subm3 c64 s1 (extra)", "minkunet", "subm", 0, 64, 64, K3, extra=True),
    Layer("mk subm3 c128 s1 (extra)", "minkunet", "subm", 0, 128, 128, K3, extra=True),
    Layer("cp subm3 c16 s1", "centerpoint", "subm", 0, 16, 16, K3),
    Layer("cp down k3s2 c16>32 s1>2", "centerpoint", "down", 0, 16, 32, K3, S2, (1, 1, 1), quick=True),
    Layer("cp subm3 c32 s2", "centerpoint", "subm", 1, 32, 32, K3),
    Layer("cp down k3s2 c32>64 s2>4", "centerpoint", "down", 1, 32, 64, K3, S2, (1, 1, 1)),
    Layer("cp subm3 c64 s4", "centerpoint", "subm", 2, 64, 64, K3, quick=True),
    Layer("cp down k3s2p110 c64>128 s4>8", "centerpoint", "down", 2, 64, 128, K3, S2, (1, 1, 0)),
    Layer("cp subm3 c128 s8", "centerpoint", "subm", 3, 128, 128, K3),
    Layer("cp conv_out k113s112 c128 s8", "centerpoint", "down", 3, 128, 128, (1, 1, 3), (1, 1, 2),
          (0, 0, 0), quick=True),
]
# The downsamples that make each model's coordinate levels 1, 2, ... from level 0.
LEVEL_GEOMETRIES = {
    "minkunet": [ConvGeometry.make(2, 2, 1, 0)] * 4,
    "centerpoint": [ConvGeometry.make(3, 2, 1, 1), ConvGeometry.make(3, 2, 1, 1),
                    ConvGeometry.make(3, 2, 1, (1, 1, 0))],
}


def select_layers(quick: bool, patterns: Optional[str]) -> List[Layer]:
    layers = [layer for layer in LAYERS if layer.quick or not quick]
    if patterns:
        wanted = [p.strip() for p in patterns.split(",") if p.strip()]
        layers = [layer for layer in layers if any(p in layer.name for p in wanted)]
        if not layers:
            raise SystemExit(f"--layers {patterns!r} matches no layer; --list-layers shows them")
    return layers


def layer_table(layers: Sequence[Layer]) -> str:
    lines = [f"{'layer':32s} {'model':11s} {'kind':4s} {'lvl':>3s} {'C_in':>5s} {'C_out':>5s} "
             f"{'kernel':9s} {'stride':9s} {'padding':9s} {'quick':5s}"]
    for layer in layers:
        lines.append(f"{layer.name:32s} {layer.model:11s} {layer.kind:4s} {layer.level:3d} {layer.c_in:5d} "
                     f"{layer.c_out:5d} {str(layer.kernel_size):9s} {str(layer.stride):9s} "
                     f"{str(layer.padding):9s} {'yes' if layer.quick else '':5s}")
    return "\n".join(lines)


# --- workloads --------------------------------------------------------------------------------------

def waymo_grid() -> Tuple[int, int, int]:
    """Cells per axis of the Waymo-like range, plus OpenPCDet's extra cell on z."""
    cells = [int(round((hi - lo) / v)) for lo, hi, v in zip(WAYMO_LOW, WAYMO_HIGH, WAYMO_VOXEL)]
    return cells[0], cells[1], cells[2] + 1


def waymo_like_batch(seeds: Sequence[int]) -> Tuple[torch.Tensor, Tuple[int, int, int]]:
    """Generated 64-beam scans in a ground-level frame, cropped and voxelised like CenterPoint's
    Waymo config. Returns (int32 coords [N, 4] (batch, x, y, z), grid (x, y, z))."""
    from torchsparse_pp.data.synthetic import BEAM_PATTERNS, generate_scan
    from torchsparse_pp.utils.quantize import sparse_quantize

    low, high = np.array(WAYMO_LOW), np.array(WAYMO_HIGH)
    cells = torch.tensor([int(round((hi - lo) / v)) for lo, hi, v in zip(WAYMO_LOW, WAYMO_HIGH, WAYMO_VOXEL)])
    rows = []
    for b, seed in enumerate(seeds):
        xyz = generate_scan(BEAMS, seed=seed)["points"][:, :3].astype(np.float64)
        xyz[:, 2] += BEAM_PATTERNS["hdl64"]["sensor_height"]  # road near z = 0, as Waymo's frame
        xyz = xyz[((xyz >= low) & (xyz < high)).all(1)]
        voxels = torch.from_numpy(sparse_quantize(xyz - low, WAYMO_VOXEL))
        voxels = voxels[(voxels < cells).all(1)]  # a point just below the upper bound may round up
        rows.append(torch.cat([torch.full((len(voxels), 1), b, dtype=torch.int32), voxels], 1))
    return torch.cat(rows), waymo_grid()


def build_levels(coords: torch.Tensor, shape, geometries) -> List[Tuple[torch.Tensor, Tuple[int, ...]]]:
    """Coordinate sets (CPU) per level: level i+1 is the spconv-mode output of geometries[i]."""
    levels = [(coords, tuple(int(s) for s in shape))]
    for geometry in geometries:
        c, s = levels[-1]
        kmap = strided_map(KernelMapCache(), c, geometry, "spconv", s)
        levels.append((kmap.out_coords, tuple(kmap.out_range)))
    return levels


# --- helpers ----------------------------------------------------------------------------------------

def rotation_count(set_bytes: int, l2_bytes: int, cap: int = ROTATION_CAP,
                   memory_cap: int = ROTATION_MEMORY_CAP) -> int:
    """How many input sets to cycle through so consecutive runs of one contender do not find the
    previous run's inputs in L2: enough sets for 3x the L2 size, none when one set is already 2x
    it, at most ``cap`` sets and ``memory_cap`` bytes."""
    if set_bytes <= 0:
        raise ValueError(f"set_bytes must be positive, got {set_bytes}")
    if set_bytes >= 2 * l2_bytes:
        return 1
    return max(1, min(cap, math.ceil(3 * l2_bytes / set_bytes), memory_cap // set_bytes))


def order_index(coords_from: torch.Tensor, coords_to: torch.Tensor) -> torch.Tensor:
    """``idx`` with ``coords_from[idx] == coords_to`` row by row (the two hold the same set)."""
    from common import coord_sort_key
    a, b = coords_from.cpu(), coords_to.cpu()
    if not same_coord_set(a, b):
        raise ValueError(f"coordinate sets differ ({a.shape[0]} vs {b.shape[0]} rows)")
    src = torch.argsort(coord_sort_key(a))
    dst = torch.argsort(coord_sort_key(b))
    idx = torch.empty_like(src)
    idx[dst] = src
    return idx.to(coords_from.device)


def compare(coords: torch.Tensor, feats: torch.Tensor, ref_coords: torch.Tensor,
            ref_sorted: torch.Tensor) -> Dict[str, Any]:
    """Relative L2 and max errors of (coords, feats) vs the reference, rows matched by coordinates."""
    coords = coords.cpu()
    if not same_coord_set(coords, ref_coords):
        return {"error": f"output coordinate set differs from the reference ({coords.shape[0]} vs "
                         f"{ref_coords.shape[0]} rows)"}
    out = sorted_rows(coords, feats.detach().cpu().double())
    if not bool(torch.isfinite(out).all()):
        return {"error": f"{int((~torch.isfinite(out)).sum())} non-finite output values"}
    diff = out - ref_sorted
    ref_norm = ref_sorted.norm().clamp(min=1e-30)
    return {"rel_l2": (diff.norm() / ref_norm).item(),
            "rel_max": (diff.abs().max() / ref_sorted.abs().max().clamp(min=1e-30)).item()}


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


def short_error(text: str) -> str:
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= 160 else first[:157] + "..."


class DeviceLost(RuntimeError):
    """The CUDA context no longer works (e.g. after an illegal memory access)."""


def device_alive(device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        return torch.ones(1, device=device).add_(1).item() == 2.0
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return False


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- timing -----------------------------------------------------------------------------------------

@dataclass
class Task:
    """``fn(arg)`` is timed; ``setup()`` (untimed, optional) makes ``arg`` for each run."""
    fn: Callable[[Any], Any]
    setup: Optional[Callable[[], Any]] = None


def summarize_times(ms: List[float], wall_ms: List[float]) -> Dict[str, float]:
    q = statistics.quantiles(ms, n=10, method="inclusive") if len(ms) >= 2 else [ms[0]] * 9
    return {"median_ms": statistics.median(ms), "p10_ms": q[0], "p90_ms": q[-1], "min_ms": min(ms),
            "max_ms": max(ms), "wall_median_ms": statistics.median(wall_ms), "repeats": len(ms)}


def time_tasks(tasks: Dict[str, Task], repeats: int, warmup: int, device: torch.device
               ) -> Tuple[Dict[str, Dict[str, float]], Dict[str, str]]:
    """Round-robin timing: each round runs every task once (the order rotates by one each round),
    the device synchronised before each run. Returns (stats per task, errors per failed task)."""
    names = list(tasks)
    cuda = device.type == "cuda"
    events = {n: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for n in names} \
        if cuda else {}
    ms: Dict[str, List[float]] = {n: [] for n in names}
    wall: Dict[str, List[float]] = {n: [] for n in names}
    errors: Dict[str, str] = {}
    for i in range(warmup + repeats):
        shift = i % max(1, len(names))
        for name in names[shift:] + names[:shift]:
            if name in errors:
                continue
            task = tasks[name]
            try:
                arg = task.setup() if task.setup is not None else None
                synchronize(device)
                t0 = time.perf_counter()
                if cuda:
                    start, end = events[name]
                    start.record()
                    task.fn(arg)
                    end.record()
                    end.synchronize()
                    elapsed = start.elapsed_time(end)
                else:
                    task.fn(arg)
                    elapsed = (time.perf_counter() - t0) * 1e3
                wall_ms = (time.perf_counter() - t0) * 1e3
            except Exception as exc:  # noqa: BLE001 - recorded, the other contenders go on
                errors[name] = error_text(exc)
                if not device_alive(device):
                    raise DeviceLost(f"{name}: {errors[name]}") from exc
                continue
            if i >= warmup:
                ms[name].append(elapsed)
                wall[name].append(wall_ms)
    return {n: summarize_times(ms[n], wall[n]) for n in names if n not in errors and ms[n]}, errors


@contextlib.contextmanager
def precision(mode: str, spconv_constants=None):
    """TF32 switches of ours, torch.mm and spconv for one mode, restored afterwards."""
    tf32 = MODES[mode][1]
    saved = (backends.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             getattr(spconv_constants, "SPCONV_ALLOW_TF32", None))
    backends.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    if spconv_constants is not None:
        spconv_constants.SPCONV_ALLOW_TF32 = tf32
    try:
        yield
    finally:
        backends.allow_tf32 = saved[0]
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        if spconv_constants is not None:
            spconv_constants.SPCONV_ALLOW_TF32 = saved[2]


# --- ours -------------------------------------------------------------------------------------------

def ours_conv(layer: Layer, x: SparseTensor, weight: torch.Tensor, config: ConvConfig) -> SparseTensor:
    if layer.kind == "subm":
        return conv3d(x, weight, layer.kernel_size, config=config)
    return conv3d(x, weight, layer.kernel_size, stride=layer.stride, padding=layer.padding,
                  transposed=layer.kind == "up", downsample_mode="spconv", config=config)


def ours_coarse(layer: Layer, fine: SparseTensor, configs) -> SparseTensor:
    """The downsample that made an 'up' layer's input (its map lands in the shared cache). Any
    working config will do: the map does not depend on it."""
    down = Layer(layer.name + " (its downsample)", layer.model, "down", layer.level, layer.c_in, layer.c_in,
                 layer.kernel_size, layer.stride, layer.padding)
    weight = torch.randn(layer.volume, layer.c_in, layer.c_in, device=fine.device).to(fine.dtype)
    failures = []
    for name, config in configs:
        try:
            return ours_conv(down, fine, weight, config)
        except Exception as exc:  # noqa: BLE001 - try the next config
            failures.append(f"{name}: {short_error(error_text(exc))}")
    raise RuntimeError("no config could run the downsample of the transposed layer: " + "; ".join(failures))


# --- spconv -----------------------------------------------------------------------------------------

def spconv_weight(weight: torch.Tensor, kernel_size) -> torch.Tensor:
    """ours [K, C_in, C_out] (offset (i*ky + j)*kz + l) -> spconv [C_out, kx, ky, kz, C_in]."""
    kx, ky, kz = kernel_size
    return weight.reshape(kx, ky, kz, weight.shape[1], weight.shape[2]).permute(4, 0, 1, 2, 3).contiguous()


class SpconvContender:
    """spconv's side of one layer, one algorithm and one dtype.

    ``feats_sets`` are rows on ``in_coords`` in ours' row order. For 'up' they sit on the coarse
    set; spconv orders that set as its own downsample's output, so they are reordered (untimed)."""

    def __init__(self, sp, layer: Layer, algo, weight, feats_sets, in_coords, in_shape, batch,
                 fine=None):
        self.sp, self.layer, self.algo = sp, layer, algo
        mod, ops = sp["module"], sp["ops"]
        self.ops = ops
        ks, dtype, device = list(layer.kernel_size), weight.dtype, weight.device
        common_args = dict(bias=False, indice_key="bench", algo=algo)
        if layer.kind == "subm":
            self.module = mod.SubMConv3d(layer.c_in, layer.c_out, ks, **common_args)
        elif layer.kind == "down":
            self.module = mod.SparseConv3d(layer.c_in, layer.c_out, ks, stride=list(layer.stride),
                                           padding=list(layer.padding), **common_args)
        else:
            self.module = mod.SparseInverseConv3d(layer.c_in, layer.c_out, ks, **common_args)
        self.module = self.module.to(device=device, dtype=dtype).eval()
        converted = spconv_weight(weight, layer.kernel_size)
        if tuple(self.module.weight.shape) != tuple(converted.shape):
            raise RuntimeError(f"spconv weight shape {tuple(self.module.weight.shape)} is not the expected "
                               f"[C_out, kx, ky, kz, C_in] {tuple(converted.shape)}")
        with torch.no_grad():
            self.module.weight.copy_(converted)
        self.batch = batch
        if layer.kind == "up":
            fine_coords, fine_shape = fine
            down = mod.SparseConv3d(layer.c_in, layer.c_in, ks, stride=list(layer.stride),
                                    padding=list(layer.padding), **common_args).to(device=device, dtype=dtype).eval()
            fine_feats = torch.randn(fine_coords.shape[0], layer.c_in, device=device).to(dtype)
            self.coarse = down(mod.SparseConvTensor(fine_feats, fine_coords, list(fine_shape), batch))
            idx = order_index(in_coords, self.coarse.indices)
            self.feats_sets = [f[idx] for f in feats_sets]
            self.cached = [self.coarse.replace_feature(f) for f in self.feats_sets]
            self.path = "SparseInverseConv3d on its downsample's indice_dict entry"
            self.fresh_path = None
        else:
            self.feats_sets = feats_sets
            self.in_coords, self.in_shape = in_coords, list(in_shape)
            first = self.module(mod.SparseConvTensor(feats_sets[0], in_coords, self.in_shape, batch))
            self.data = first.indice_dict["bench"]
            if layer.kind == "subm":
                base = mod.SparseConvTensor(feats_sets[0], in_coords, self.in_shape, batch)
                base.indice_dict = dict(first.indice_dict)  # its own indice_key reuse path
                self.cached = [base.replace_feature(f) for f in feats_sets]
                self.path = "SubMConv3d on a tensor whose indice_dict holds its key"
            else:
                self.cached = list(feats_sets)
                self.path = ("ops.indice_conv on the stored pairs" if algo.name == "Native"
                             else "ops.implicit_gemm on the stored pairs (the module's call after building)")
            self.fresh_path = ("SubMConv3d" if layer.kind == "subm" else "SparseConv3d") + " on a fresh SparseConvTensor"

    def forward_cached(self, arg):
        """Kernel-only forward; returns (out coords, out feats)."""
        if self.layer.kind != "down":
            out = self.module(arg)
            return out.indices, out.features
        d, w = self.data, self.module.weight
        n_out = d.out_indices.shape[0]
        if self.algo.name == "Native":
            return d.out_indices, self.ops.indice_conv(arg, w, d.indice_pairs, d.indice_pair_num, n_out, False, False)
        feats, _, _ = self.ops.implicit_gemm(arg, w, d.pair_fwd, d.pair_mask_fwd_splits, d.mask_argsort_fwd_splits,
                                             n_out, d.masks, False, False, output_dtype=w.dtype)
        return d.out_indices, feats

    def fresh_tensor(self, feats):
        return self.sp["module"].SparseConvTensor(feats, self.in_coords, self.in_shape, self.batch)

    def forward_fresh(self, xs):
        return self.module(xs)


def import_spconv():
    """spconv's modules, ops, algorithms and constants, or (None, reason)."""
    try:
        import spconv
        import spconv.pytorch as spconv_module
        from spconv import constants as spconv_constants
        from spconv.pytorch import ConvAlgo
        from spconv.pytorch import ops as spconv_ops
    except Exception as exc:  # noqa: BLE001 - ImportError, or a missing CUDA runtime library
        return None, error_text(exc)
    info = {"module": spconv_module, "ops": spconv_ops, "algo": ConvAlgo, "constants": spconv_constants,
            "version": getattr(spconv, "__version__", None)}
    try:
        import cumm
        info["cumm_version"] = getattr(cumm, "__version__", None)
    except Exception:  # noqa: BLE001
        info["cumm_version"] = None
    return info, None


def spconv_default_algo(sp, layer: Layer):
    """The algorithm spconv picks when none is given, for this layer's kernel."""
    mod = sp["module"]
    ks = list(layer.kernel_size)
    if layer.kind == "subm":
        m = mod.SubMConv3d(layer.c_in, layer.c_out, ks, bias=False)
    elif layer.kind == "down":
        m = mod.SparseConv3d(layer.c_in, layer.c_out, ks, stride=list(layer.stride), bias=False)
    else:
        m = mod.SparseInverseConv3d(layer.c_in, layer.c_out, ks, indice_key="bench", bias=False)
    return m.algo


# --- one layer --------------------------------------------------------------------------------------

def layer_shape(layer: Layer, levels) -> Dict[str, Any]:
    """Sizes of one layer from its CPU map: rows, pairs, MACs, the equivalent GEMM."""
    coords, shape = levels[layer.model][layer.level]
    geometry = layer.geometry
    cache = KernelMapCache()
    kmap = (submanifold_map(cache, coords, geometry, shape) if layer.kind == "subm"
            else strided_map(cache, coords, geometry, "spconv", shape))
    pairs = int(kmap.pairs.offsets[-1])
    n_in, n_out = (kmap.num_out, kmap.num_in) if layer.kind == "up" else (kmap.num_in, kmap.num_out)
    ts_in, ts_out = layer.tensor_strides()
    return {
        "n_in": n_in, "n_out": n_out, "total_pairs": pairs, "pairs_per_output": pairs / n_out,
        "kernel_volume": layer.volume, "tensor_stride_in": list(ts_in), "tensor_stride_out": list(ts_out),
        "macs_useful": pairs * layer.c_in * layer.c_out,
        "gemm": {"m": n_out, "k": layer.volume * layer.c_in, "n": layer.c_out},
        "macs_dense_equivalent": n_out * layer.volume * layer.c_in * layer.c_out,
        "spatial_range_in": list(shape) if layer.kind != "up" else list(levels[layer.model][layer.level + 1][1]),
    }


def reference(layer: Layer, levels, feats0: torch.Tensor, weight: torch.Tensor, in_coords_dev: torch.Tensor):
    """float64 CPU output of the layer on the same values: (out coords, rows sorted by coords)."""
    fine_coords, fine_shape = levels[layer.model][layer.level]
    ts_in, _ = layer.tensor_strides()
    w = weight.detach().cpu().double()
    cfg = ConvConfig("gather_scatter")
    if layer.kind == "up":
        fine = SparseTensor(torch.randn(fine_coords.shape[0], layer.c_in, dtype=torch.float64), fine_coords,
                            stride=2 ** layer.level, spatial_range=fine_shape)
        down = Layer("ref down", layer.model, "down", layer.level, layer.c_in, layer.c_in, layer.kernel_size,
                     layer.stride, layer.padding)
        coarse = ours_conv(down, fine, torch.randn(layer.volume, layer.c_in, layer.c_in, dtype=torch.float64), cfg)
        feats = feats0.detach().cpu().double()[order_index(in_coords_dev, coarse.C).cpu()]
        x = coarse.replace_feats(feats)
    else:
        x = SparseTensor(feats0.detach().cpu().double(), fine_coords, stride=ts_in, spatial_range=fine_shape)
    out = ours_conv(layer, x, w, cfg)
    return out.C, sorted_rows(out.C, out.F)


def run_mode(layer: Layer, mode: str, levels, shape: Dict[str, Any], ctx) -> Dict[str, Any]:
    """Every contender of one layer in one precision mode: correctness, then timing."""
    args, device, sp = ctx["args"], ctx["device"], ctx["spconv"]
    dtype = MODES[mode][0]
    elem = torch.finfo(dtype).bits // 8
    fine_coords, fine_shape = levels[layer.model][layer.level]
    ts_in, _ = layer.tensor_strides()
    n_in, n_out = shape["n_in"], shape["n_out"]
    result: Dict[str, Any] = {"correctness": {}, "kernel": {}, "with_map": {}, "errors": {}, "paths": {}}

    set_bytes = (n_in * layer.c_in + n_out * layer.c_out) * elem
    rotations = rotation_count(set_bytes, ctx["l2_bytes"])
    a_bytes = shape["gemm"]["m"] * shape["gemm"]["k"] * elem
    a_rotations = rotation_count(a_bytes + n_out * layer.c_out * elem, ctx["l2_bytes"])
    result["rotations"] = {"feature_sets": rotations, "feature_set_bytes": set_bytes, "cublas_a_sets": a_rotations}

    gen = torch.Generator(device=device).manual_seed(args.seed * 1000 + LAYERS.index(layer) * 10 + list(MODES).index(mode))
    scale = 1.0 / math.sqrt(layer.c_in * max(1.0, shape["pairs_per_output"]))
    weight = (torch.randn(layer.volume, layer.c_in, layer.c_out, generator=gen, device=device) * scale).to(dtype)
    fine_dev = fine_coords.to(device).contiguous()  # spconv wants contiguous indices

    tasks: Dict[str, Task] = {}
    with precision(mode, sp["constants"] if sp else None):
        # ours: the input tensors share one cache, so maps / views / plans are built once
        if layer.kind == "up":
            fine = SparseTensor(torch.randn(fine_coords.shape[0], layer.c_in, generator=gen, device=device).to(dtype),
                                fine_dev, stride=2 ** layer.level, spatial_range=fine_shape)
            try:
                coarse = ours_coarse(layer, fine, ctx["configs"])
            except Exception as exc:  # noqa: BLE001
                if not device_alive(device):
                    raise DeviceLost(error_text(exc)) from exc
                coarse, result["errors"]["ours:setup"] = None, error_text(exc)
            in_coords = coarse.C if coarse is not None else levels[layer.model][layer.level + 1][0].to(device)
        else:
            in_coords = fine_dev
        feats_sets = [torch.randn(n_in, layer.c_in, generator=gen, device=device).to(dtype) for _ in range(rotations)]
        ref_coords, ref_sorted = reference(layer, levels, feats_sets[0], weight, in_coords)

        if layer.kind == "up":
            xs = [coarse.replace_feats(f) for f in feats_sets] if coarse is not None else []
        else:
            base = SparseTensor(feats_sets[0], in_coords, stride=ts_in, spatial_range=fine_shape)
            xs = [base.replace_feats(f) for f in feats_sets]
        for name, config in (ctx["configs"] if xs else []):
            try:
                out = ours_conv(layer, xs[0], weight, config)  # builds what the config needs
                synchronize(device)
                result["correctness"][f"ours:{name}"] = compare(out.C, out.F, ref_coords, ref_sorted)
                del out
            except Exception as exc:  # noqa: BLE001 - recorded; the other contenders go on
                result["errors"][f"ours:{name}"] = error_text(exc)
                if not device_alive(device):
                    raise DeviceLost(f"ours:{name}: {error_text(exc)}") from exc
                continue
            cycle = itertools.cycle(xs)
            tasks[f"ours:{name}"] = Task(lambda _, c=config, it=cycle: ours_conv(layer, next(it), weight, c))
            if layer.kind != "up":
                fresh_feats = itertools.cycle(feats_sets)
                tasks[f"ours+map:{name}"] = Task(
                    lambda x, c=config: ours_conv(layer, x, weight, c),
                    setup=lambda it=fresh_feats: SparseTensor(next(it), in_coords, stride=ts_in,
                                                              spatial_range=fine_shape))

        # spconv
        if sp is not None:
            batch = int(fine_coords[:, 0].max()) + 1
            for algo in ctx["spconv_algos"](layer):
                key = f"spconv:{algo.name}"
                try:
                    contender = SpconvContender(sp, layer, algo, weight, feats_sets, in_coords,
                                                fine_shape, batch, fine=(fine_dev, fine_shape))
                    out_c, out_f = contender.forward_cached(contender.cached[0])
                    synchronize(device)
                    result["correctness"][key] = compare(out_c, out_f, ref_coords, ref_sorted)
                    result["paths"][key] = contender.path
                    if contender.fresh_path is not None:
                        fresh = contender.forward_fresh(contender.fresh_tensor(contender.feats_sets[0]))
                        synchronize(device)
                        result["correctness"][f"spconv+map:{algo.name}"] = compare(
                            fresh.indices, fresh.features, ref_coords, ref_sorted)
                        result["paths"][f"spconv+map:{algo.name}"] = contender.fresh_path
                        del fresh
                except Exception as exc:  # noqa: BLE001
                    result["errors"][key] = error_text(exc)
                    if not device_alive(device):
                        raise DeviceLost(f"{key}: {error_text(exc)}") from exc
                    continue
                cycle = itertools.cycle(contender.cached)
                tasks[key] = Task(lambda _, c=contender, it=cycle: c.forward_cached(next(it)))
                if contender.fresh_path is not None:
                    fresh_feats = itertools.cycle(contender.feats_sets)
                    tasks[f"spconv+map:{algo.name}"] = Task(
                        lambda xs_, c=contender: c.forward_fresh(xs_),
                        setup=lambda c=contender, it=fresh_feats: c.fresh_tensor(next(it)))

        # cuBLAS on the equivalent dense GEMM
        g = shape["gemm"]
        a_sets = [torch.randn(g["m"], g["k"], generator=gen, device=device).to(dtype) for _ in range(a_rotations)]
        b = (torch.randn(g["k"], g["n"], generator=gen, device=device) / math.sqrt(g["k"])).to(dtype)
        mm_out = torch.empty(g["m"], g["n"], device=device, dtype=dtype)
        a_cycle = itertools.cycle(a_sets)
        tasks["cublas"] = Task(lambda _: torch.mm(next(a_cycle), b, out=mm_out))

        timings, errors = time_tasks(tasks, args.repeats, args.warmup, device)
    result["errors"].update(errors)
    for name, stats in timings.items():
        (result["with_map"] if "+map:" in name else result["kernel"])[name] = stats
    if sp is not None:
        try:  # which algorithm spconv itself would pick for this layer
            result["spconv_default_algo"] = spconv_default_algo(sp, layer).name
        except Exception as exc:  # noqa: BLE001
            result["errors"]["spconv:default"] = error_text(exc)
    result["summary"] = summarize_mode(result, shape, ctx["config_names"], mode)
    return result


# --- summary ----------------------------------------------------------------------------------------

def _best(times: Dict[str, Dict[str, float]], prefix: str, only: Optional[Sequence[str]] = None):
    names = [n for n in times if n.startswith(prefix) and (only is None or n[len(prefix):] in only)]
    if not names:
        return None, None
    name = min(names, key=lambda n: times[n]["median_ms"])
    return name[len(prefix):], times[name]["median_ms"]


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return None if num is None or den is None or den <= 0 else num / den


def tflops(macs: float, ms: Optional[float]) -> Optional[float]:
    return None if ms is None or ms <= 0 else 2.0 * macs / (ms * 1e-3) / 1e12


def summarize_mode(result: Dict[str, Any], shape: Dict[str, Any], config_names: Sequence[str],
                   mode: str) -> Dict[str, Any]:
    """Best of ours, best implicit GEMM, fastest spconv, the ratios and the correctness verdict."""
    kernel, with_map = result["kernel"], result["with_map"]
    best, best_ms = _best(kernel, "ours:")
    ig, ig_ms = _best(kernel, "ours:", [n for n in config_names if n.startswith("ig-")])
    sp, sp_ms = _best(kernel, "spconv:")
    cublas_ms = kernel.get("cublas", {}).get("median_ms")
    default = result.get("spconv_default_algo")
    s = {
        "ours_best": best, "ours_best_ms": best_ms,
        "implicit_gemm_best": ig, "implicit_gemm_best_ms": ig_ms,
        "spconv_best": sp, "spconv_best_ms": sp_ms, "cublas_ms": cublas_ms,
        # equal dense-equivalent MACs, so the rate ratio is a time ratio
        "ours_vs_cublas_rate": _ratio(cublas_ms, best_ms),
        "implicit_gemm_vs_cublas_rate": _ratio(cublas_ms, ig_ms),
        "ours_useful_vs_cublas_rate": _ratio(tflops(shape["macs_useful"], best_ms),
                                             tflops(shape["macs_dense_equivalent"], cublas_ms)),
        "ours_useful_tflops": tflops(shape["macs_useful"], best_ms),
        "ours_dense_equivalent_tflops": tflops(shape["macs_dense_equivalent"], best_ms),
        "cublas_tflops": tflops(shape["macs_dense_equivalent"], cublas_ms),
        "spconv_over_ours": _ratio(sp_ms, best_ms),
        "spconv_mask_over_ours": _ratio(kernel.get("spconv:MaskImplicitGemm", {}).get("median_ms"), best_ms),
        "spconv_default_over_ours": _ratio(kernel.get(f"spconv:{default}", {}).get("median_ms"), best_ms)
        if default else None,
    }
    wbest, wbest_ms = _best(with_map, "ours+map:")
    wsp, wsp_ms = _best(with_map, "spconv+map:")
    s["with_map"] = {
        "ours_best": wbest, "ours_best_ms": wbest_ms, "spconv_best": wsp, "spconv_best_ms": wsp_ms,
        "spconv_over_ours": _ratio(wsp_ms, wbest_ms),
        # map + views / plan of each config: with-map time minus kernel-only time
        "ours_map_ms": {n[len("ours+map:"):]: with_map[n]["median_ms"] - kernel[f"ours:{n[len('ours+map:'):]}"]["median_ms"]
                        for n in with_map if n.startswith("ours+map:") and f"ours:{n[len('ours+map:'):]}" in kernel},
        "spconv_map_ms": {n[len("spconv+map:"):]: with_map[n]["median_ms"] - kernel[f"spconv:{n[len('spconv+map:'):]}"]["median_ms"]
                          for n in with_map if n.startswith("spconv+map:") and f"spconv:{n[len('spconv+map:'):]}" in kernel},
    }
    tol = TOLERANCE[mode]
    bad = {}
    for name, c in result["correctness"].items():
        if "error" in c:
            bad[name] = c["error"]
        elif not c["rel_l2"] <= tol:
            bad[name] = f"rel_l2 {c['rel_l2']:.2e} > {tol:.0e}"
    for name, text in result["errors"].items():
        bad.setdefault(name, short_error(text))
    s["problems"] = bad
    s["ours_ok"] = not any(n.startswith("ours") for n in bad) and best is not None
    errs = [c["rel_l2"] for n, c in result["correctness"].items() if n.startswith("ours") and "rel_l2" in c]
    s["ours_worst_rel_l2"] = max(errs) if errs else None
    return s


def targets(rows: List[Dict[str, Any]], modes: Sequence[str], spconv_note: Optional[str]) -> List[Dict[str, Any]]:
    """The performance targets as PASS / FAIL / SKIP entries (a missing value on a counted layer fails)."""
    out = []

    def entry(text, mode, threshold, values, skip_reason=None):
        if skip_reason:
            status = "SKIP"
        elif not values:
            status, skip_reason = "SKIP", "no layer of this kind was run"
        else:
            status = "PASS" if all(v is not None and v >= threshold for v in values.values()) else "FAIL"
        out.append({"target": text, "mode": mode, "threshold": threshold, "values": values,
                    "status": status, "note": skip_reason})

    def value(row, mode, field):
        r = row["modes"].get(mode)
        return None if r is None or "summary" not in r else r["summary"][field]

    counted = rows  # a skipped layer has no value, so its target cannot pass
    if "fp16" in modes:
        vals = {r["layer"]: value(r, "fp16", "ours_vs_cublas_rate") for r in counted
                if r["c_in"] >= TARGET_CUBLAS_MIN_CHANNELS}
        entry(f"fp16: best of ours >= {TARGET_CUBLAS_RATE}x the cuBLAS rate (t_cuBLAS / t_ours on the "
              f"equivalent GEMM) on every layer with C_in >= {TARGET_CUBLAS_MIN_CHANNELS}",
              "fp16", TARGET_CUBLAS_RATE, vals)
    for mode in modes:
        vals = {r["layer"]: value(r, mode, "spconv_over_ours") for r in counted if r["spconv_target"]}
        entry(f"{mode}: t_spconv (fastest algorithm) / t_ours (best config) >= {TARGET_SPCONV_SPEEDUP} on every "
              "MinkUNet SubM 3^3 layer, maps cached", mode, TARGET_SPCONV_SPEEDUP, vals,
              skip_reason=spconv_note)
    return out


# --- device, versions -------------------------------------------------------------------------------

def nvidia_smi() -> Dict[str, str]:
    fields = ["name", "driver_version", "pstate", "clocks.sm", "clocks.max.sm", "clocks.mem",
              "power.limit", "temperature.gpu", "utilization.gpu"]
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.splitlines()[0]
        return dict(zip(fields, (v.strip() for v in out.split(","))))
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}


def machine_info(device: torch.device, sp, sp_error) -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(ROOT), "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "torchsparse_pp": getattr(torchsparse_pp, "__version__", None),
        "torchsparse_pp_path": os.path.dirname(torchsparse_pp.__file__),
        "torchsparse_pp_cuda_built": bool(torch.ops.torchsparse_pp.cuda_built()),
        "cpu_model": cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "spconv": sp["version"] if sp else None, "cumm": sp.get("cumm_version") if sp else None,
        "spconv_unavailable_reason": sp_error,
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update({"device_name": p.name, "compute_capability": f"{p.major}.{p.minor}",
                     "multiprocessors": p.multi_processor_count, "memory_gib": round(p.total_memory / 2 ** 30, 1),
                     "l2_cache_bytes": getattr(p, "L2_cache_size", None), "nvidia_smi_at_start": nvidia_smi()})
    else:
        info["device_name"] = f"CPU dry run: {cpu_model()}"
    return info


def ceilings(device: torch.device, modes: Sequence[str], n: int = 8192) -> Dict[str, Any]:
    """Measured ceilings: a large torch.mm per mode (TFLOP/s) and a device copy (TB/s, read + write)."""
    out: Dict[str, Any] = {}
    size = n if device.type == "cuda" else 512
    for mode in modes:
        dtype = MODES[mode][0]
        with precision(mode):
            a = torch.randn(size, size, device=device).to(dtype)
            b = torch.randn(size, size, device=device).to(dtype)
            c = torch.empty(size, size, device=device, dtype=dtype)
            stats, errors = time_tasks({"mm": Task(lambda _: torch.mm(a, b, out=c))}, 10, 3, device)
        out[f"mm_{mode}"] = {"n": size, "tflops": tflops(size ** 3, stats["mm"]["median_ms"]) if "mm" in stats else None,
                             "error": errors.get("mm")}
        del a, b, c
    nbytes = (1 << 30) if device.type == "cuda" else (1 << 24)
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    stats, errors = time_tasks({"copy": Task(lambda _: dst.copy_(src))}, 10, 3, device)
    out["copy"] = {"bytes": nbytes, "tb_per_s": (2 * nbytes / (stats["copy"]["median_ms"] * 1e-3) / 1e12)
                   if "copy" in stats else None, "error": errors.get("copy")}
    return out


def require_cuda(backends_: Sequence[str]) -> None:
    """Exits with a clear message when there is no GPU, no CUDA build of torchsparse_pp (for the
    native rows) or no triton (for the Triton rows)."""
    if not torch.cuda.is_available():
        sys.exit(f"conv_gpu.py needs a CUDA GPU: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none. "
                 "Run it on a GPU machine (see docs/gpu.md), or use --cpu-dry-run to check the script itself.")
    if "triton" in backends_:
        from torchsparse_pp.ops.triton import runtime
        if not runtime.installed():
            sys.exit("conv_gpu.py --backends triton needs the triton package (pip install 'torchsparse-pp[triton]')")
    if "native" in backends_ and not torch.ops.torchsparse_pp.cuda_built():
        sys.exit("conv_gpu.py needs the CUDA build of torchsparse_pp, but torch.ops.torchsparse_pp.cuda_built() "
                 f"is False ({os.path.dirname(torchsparse_pp.__file__)}). Rebuild it with CUDA: "
                 "FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 pip install -e . --no-build-isolation --no-deps "
                 "(see docs/gpu.md), or run --backends triton.")


# --- main -------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Layers:\n" + layer_table(LAYERS))
    parser.add_argument("--quick", action="store_true",
                        help="the layers marked quick, configs gs / fod / ig-unsorted / ig-sorted1, spconv "
                             "MaskImplicitGemm (+ its default), fewer repeats")
    parser.add_argument("--dtypes", default=None, help=f"comma-separated modes from {list(MODES)} "
                                                       "(default fp16,bf16,tf32; fp32,bf16 with --cpu-dry-run)")
    parser.add_argument("--backends", default="native,triton",
                        help="comma-separated backends of ours (default native,triton)")
    parser.add_argument("--max-voxels", type=int, default=None,
                        help=f"crop each scan to its N voxels nearest the sensor (default: whole scans; "
                             f"{DRY_RUN_MAX_VOXELS} with --cpu-dry-run)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 30; 10 with --quick)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default 3; 2 with --quick)")
    parser.add_argument("--batch", type=int, default=1, help="scans per batch (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random features and weights")
    parser.add_argument("--layers", default=None, help="comma-separated substrings: run the layers whose "
                                                       "names contain one of them")
    parser.add_argument("--list-layers", action="store_true", help="print the layer table and exit")
    parser.add_argument("--no-spconv", action="store_true", help="do not import or time spconv")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds from the start; later layers are skipped (and listed as skipped) once "
                             "it is spent; the first layer always runs")
    add_output_arguments(parser, "conv_gpu")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="check this script on the CPU (native CPU rows, Triton rows under the interpreter, "
                             "fp32 and bf16, cropped scans, spconv Native, host timers); never published")
    args = parser.parse_args(argv)
    args.repeats = args.repeats if args.repeats is not None else (10 if args.quick else 30)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    if args.repeats < 1 or args.warmup < 0 or args.batch < 1:
        parser.error("--repeats and --batch must be >= 1 and --warmup >= 0")
    dtypes = args.dtypes or ("fp32,bf16" if args.cpu_dry_run else "fp16,bf16,tf32")
    args.modes = [m.strip() for m in dtypes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not args.modes:
        parser.error(f"--dtypes: unknown mode(s) {unknown}; choose from {list(MODES)}")
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not args.backend_list or any(b not in BACKENDS for b in args.backend_list):
        parser.error(f"--backends: choose from {list(BACKENDS)}, got {args.backends!r}")
    if args.cpu_dry_run:
        if args.publish or (args.out and os.path.abspath(args.out) == os.path.abspath(RESULTS)):
            parser.error("--cpu-dry-run is never published into benchmarks/results")
        if {"fp16", "tf32"} & set(args.modes):
            parser.error("--cpu-dry-run runs fp32 and bf16 (the CPU kernels have no float16; TF32 is GPU-only)")
        if args.max_voxels is None:
            args.max_voxels = DRY_RUN_MAX_VOXELS
    if args.max_voxels is not None and args.max_voxels < 1:
        parser.error("--max-voxels must be >= 1")
    return args


def write_json(report: Dict[str, Any], path: str) -> None:
    write_json_atomic(path, report)


def crop_nearest(coords: torch.Tensor, max_voxels: Optional[int]) -> torch.Tensor:
    """The ``max_voxels`` voxels of each batch entry nearest the scan's sensor column (its
    x-y centre), sorted as before; all of them when None."""
    if max_voxels is None:
        return coords
    keep = []
    for b in coords[:, 0].unique():
        rows = (coords[:, 0] == b).nonzero().squeeze(1)
        xy = coords[rows, 1:3].double()
        centre = (xy.amin(0) + xy.amax(0)) / 2
        nearest = (xy - centre).square().sum(1).argsort()[:max_voxels]
        keep.append(rows[nearest])
    return coords[torch.cat(keep).sort().values]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list_layers:
        print(layer_table(select_layers(args.quick, args.layers)))
        return 0
    layers = select_layers(args.quick, args.layers)
    if args.cpu_dry_run:
        # The Triton rows run interpreted on CPU tensors; triton reads this when a kernel is defined.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = torch.device("cpu")
    else:
        require_cuda(args.backend_list)
        device = torch.device("cuda", torch.cuda.current_device())
    out_dir = output_dir(args, "conv_gpu")
    started = time.perf_counter()

    sp, sp_error = (None, "--no-spconv") if args.no_spconv else import_spconv()
    if sp is None:
        print(f"note: spconv is not timed ({short_error(sp_error)}); its columns and target are skipped",
              file=sys.stderr)
    configs = backend_configs(args.backend_list, device.type, args.quick)

    def spconv_algos(layer):
        if args.cpu_dry_run:
            return [sp["algo"].Native]
        names = SPCONV_ALGOS[:1] if args.quick else SPCONV_ALGOS
        algos = [sp["algo"][n] for n in names]
        default = spconv_default_algo(sp, layer)
        return algos + ([default] if default not in algos else [])

    machine = machine_info(device, sp, sp_error)
    l2 = machine.get("l2_cache_bytes") or (50 << 20)
    print(f"device: {machine['device_name']}, torch {machine['torch']} (CUDA {machine['torch_cuda']}), "
          f"spconv {machine['spconv']}, git {machine['git_revision']}", file=sys.stderr)

    from tqdm import tqdm
    with torch.no_grad():
        mk_coords, mk_shape = lidar_batch(BEAMS, MINKUNET_VOXEL, [MINKUNET_SEED + b for b in range(args.batch)])
        cp_coords, cp_shape = waymo_like_batch([CENTERPOINT_SEED + b for b in range(args.batch)])
        mk_coords, cp_coords = crop_nearest(mk_coords, args.max_voxels), crop_nearest(cp_coords, args.max_voxels)
        levels = {"minkunet": build_levels(mk_coords, mk_shape, LEVEL_GEOMETRIES["minkunet"]),
                  "centerpoint": build_levels(cp_coords, cp_shape, LEVEL_GEOMETRIES["centerpoint"])}
        print("voxels per level: " + "; ".join(
            f"{m}: " + ", ".join(f"s{2 ** i} {c.shape[0]}" for i, (c, _) in enumerate(lv)) for m, lv in levels.items()),
            file=sys.stderr)
        ceiling = ceilings(device, args.modes)

    report: Dict[str, Any] = {
        "benchmark": "conv_gpu", "description": __doc__, "complete": False, "dry_run": args.cpu_dry_run,
        "aborted": None, "machine": machine,
        "args": {k: v for k, v in vars(args).items() if k not in ("modes", "backend_list")}, "modes": args.modes,
        "backends": args.backend_list, "max_voxels": args.max_voxels,
        "tolerance_rel_l2": {m: TOLERANCE[m] for m in args.modes},
        "workload": {
            "batch": args.batch, "beams": BEAMS, "grad": False,
            "minkunet": {"voxel_m": MINKUNET_VOXEL, "seeds": [MINKUNET_SEED + b for b in range(args.batch)],
                         "downsample": "k2 s2 p0, spconv output set, clipped by spatial_range"},
            "centerpoint": {"voxel_m": WAYMO_VOXEL, "range_low_m": WAYMO_LOW, "range_high_m": WAYMO_HIGH,
                            "grid_xyz": waymo_grid(), "seeds": [CENTERPOINT_SEED + b for b in range(args.batch)],
                            "downsample": "k3 s2, padding 1, 1, (1, 1, 0); spconv output set"},
            "levels": {m: [{"tensor_stride": 2 ** i, "voxels": c.shape[0], "spatial_range": list(s)}
                           for i, (c, s) in enumerate(lv)] for m, lv in levels.items()},
        },
        "configs": {n: vars(c).copy() for n, c in configs},
        "ceilings": ceiling, "layers": [], "targets": [], "wall_seconds": None,
    }
    json_path, png_path = os.path.join(out_dir, "conv_gpu.json"), os.path.join(out_dir, "conv_gpu.png")
    ctx = {"args": args, "device": device, "spconv": sp, "configs": configs, "config_names": [n for n, _ in configs],
           "spconv_algos": spconv_algos, "l2_bytes": l2}

    with torch.no_grad(), tqdm(layers, desc="layers", unit="layer", file=sys.stderr) as bar:
        for layer in bar:
            row = {"layer": layer.name, "model": layer.model, "kind": layer.kind, "extra": layer.extra,
                   "c_in": layer.c_in, "c_out": layer.c_out, "kernel_size": list(layer.kernel_size),
                   "stride": list(layer.stride), "padding": list(layer.padding),
                   "spconv_target": layer.spconv_target, "modes": {}}
            report["layers"].append(row)
            if report["aborted"]:
                row["skipped"] = "aborted: " + report["aborted"]
                continue
            started_layers = sum(1 for r in report["layers"] if r.get("modes"))
            if (args.time_budget is not None and started_layers > 0
                    and time.perf_counter() - started > args.time_budget):
                row["skipped"] = f"time budget of {args.time_budget:.0f} s spent"
                continue
            row.update(layer_shape(layer, levels))
            for mode in args.modes:
                bar.set_postfix_str(f"{layer.name} {mode}")
                try:
                    row["modes"][mode] = run_mode(layer, mode, levels, row, ctx)
                except Exception as exc:  # noqa: BLE001 - recorded; the next layer or mode goes on
                    row["modes"][mode] = {"error": error_text(exc)}
                    print(f"\nerror: {layer.name} {mode}: {short_error(error_text(exc))}", file=sys.stderr)
                    if isinstance(exc, DeviceLost) or not device_alive(device):
                        report["aborted"] = f"CUDA context lost in {layer.name} {mode}: {short_error(error_text(exc))}"
                        break
            if device.type == "cuda" and not report["aborted"]:
                torch.cuda.empty_cache()
            report["wall_seconds"] = time.perf_counter() - started
            write_json(report, json_path)

    spconv_note = None if sp is not None else f"spconv not available: {short_error(sp_error)}"
    report["targets"] = targets(report["layers"], args.modes, spconv_note)
    if device.type == "cuda" and not report["aborted"]:
        report["machine"]["nvidia_smi_at_end"] = nvidia_smi()
    report["complete"] = report["aborted"] is None
    report["wall_seconds"] = time.perf_counter() - started
    write_json(report, json_path)
    print_report(report)
    if plot(report, png_path):
        print(f"\nwrote {json_path} and {png_path} ({report['wall_seconds']:.0f} s)")
    else:
        print(f"\nwrote {json_path} ({report['wall_seconds']:.0f} s); no plot")
    if report["aborted"]:
        return 3
    if any("summary" not in r or not r["summary"]["ours_ok"] for row in report["layers"] for r in row["modes"].values()):
        print("exit status 2: some of ours failed or exceeded the tolerance (see 'Problems' above)")
        return 2
    return 0


# --- printing ---------------------------------------------------------------------------------------

def _fmt(v: Optional[float], spec: str = "8.3f") -> str:
    width = int(spec.split(".")[0]) if spec[0].isdigit() else 8
    return f"{v:{spec}}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>{width}s}"


def print_report(report: Dict[str, Any]) -> None:
    m = report["machine"]
    rows = [r for r in report["layers"] if not r.get("skipped")]
    names = list(report["configs"])
    print(f"\n{m['device_name']}, torch {m['torch']} (CUDA {m['torch_cuda']}), spconv {m['spconv']}, "
          f"git {m['git_revision']}, {m['date']}" + ("  [CPU DRY RUN: not GPU numbers]" if report["dry_run"] else ""))
    ceil = report["ceilings"]
    print("ceilings: " + ", ".join(f"{k} {v['tflops']:.1f} TFLOP/s" for k, v in ceil.items()
                                   if k.startswith("mm_") and v.get("tflops"))
          + (f", copy {ceil['copy']['tb_per_s']:.2f} TB/s" if ceil.get("copy", {}).get("tb_per_s") else ""))
    w = max([len(r["layer"]) for r in rows] + [5])
    sp_names = sorted({n for r in rows for md in r["modes"].values() for n in md.get("kernel", {})
                       if n.startswith("spconv:")})
    for mode in report["modes"]:
        print(f"\n{mode}: kernel only (maps cached), median ms ('*' = best of ours); "
              "sp/ours = t_spconv(best) / t_ours(best); ours/cuBLAS = t_cuBLAS / t_ours(best)")
        head = f"{'layer':{w}s} {'N_out':>7s} {'pairs':>8s} " + " ".join(f"{n:>11s}" for n in names)
        head += " " + " ".join(f"{n.replace('spconv:', 'sp:')[:14]:>14s}" for n in sp_names)
        head += f" {'cuBLAS':>8s} {'sp/ours':>7s} {'ours/cuBLAS':>11s} {'ig/cuBLAS':>9s} {'err':>8s}"
        print(head)
        for r in rows:
            md = r["modes"].get(mode, {})
            k, s = md.get("kernel", {}), md.get("summary", {})
            line = f"{r['layer']:{w}s} {r['n_out']:7d} {r['total_pairs']:8d} "
            line += " ".join(_fmt(k.get(f"ours:{n}", {}).get("median_ms"), "10.3f")
                             + ("*" if s.get("ours_best") == n else " ") for n in names)
            line += " " + " ".join(_fmt(k.get(n, {}).get("median_ms"), "14.3f") for n in sp_names)
            line += (f" {_fmt(k.get('cublas', {}).get('median_ms'), '8.3f')} {_fmt(s.get('spconv_over_ours'), '7.2f')}"
                     f" {_fmt(s.get('ours_vs_cublas_rate'), '11.2f')} {_fmt(s.get('implicit_gemm_vs_cublas_rate'), '9.2f')}"
                     f" {_fmt(s.get('ours_worst_rel_l2'), '8.1e')}")
            print(line)
        print(f"\n{mode}: with map construction (fresh tensor each run), median ms; map = with-map minus kernel-only")
        head = f"{'layer':{w}s} " + " ".join(f"{n:>11s}" for n in names)
        head += " " + " ".join(f"{n.replace('spconv:', 'sp+map:')[:14]:>14s}" for n in sp_names)
        head += f" {'sp/ours':>7s} {'ours map':>8s} {'sp map':>8s}"
        print(head)
        for r in rows:
            md = r["modes"].get(mode, {})
            wm, s = md.get("with_map", {}), md.get("summary", {}).get("with_map", {})
            if r["kind"] == "up":
                print(f"{r['layer']:{w}s} (reuses the downsample's map)")
                continue
            line = f"{r['layer']:{w}s} " + " ".join(_fmt(wm.get(f"ours+map:{n}", {}).get("median_ms"), "11.3f")
                                                     for n in names)
            line += " " + " ".join(_fmt(wm.get(n.replace("spconv:", "spconv+map:"), {}).get("median_ms"), "14.3f")
                                   for n in sp_names)
            best = s.get("ours_best")
            sp_best = s.get("spconv_best")
            line += (f" {_fmt(s.get('spconv_over_ours'), '7.2f')} {_fmt(s.get('ours_map_ms', {}).get(best), '8.3f')}"
                     f" {_fmt(s.get('spconv_map_ms', {}).get(sp_best), '8.3f')}")
            print(line)

    problems = [(r["layer"], mode, name, text) for r in rows for mode, md in r["modes"].items()
                for name, text in md.get("summary", {}).get("problems", {}).items()]
    problems += [(r["layer"], mode, "-", md["error"]) for r in rows for mode, md in r["modes"].items() if "error" in md]
    if problems:
        print("\nProblems (errors, or ||out - ref|| / ||ref|| above " +
              ", ".join(f"{k} {v:.0e}" for k, v in report["tolerance_rel_l2"].items()) + "):")
        for layer, mode, name, text in problems:
            print(f"  {layer} {mode} {name}: {short_error(text)}")
    skipped = [(r["layer"], r["skipped"]) for r in report["layers"] if r.get("skipped")]
    for layer, why in skipped:
        print(f"  skipped {layer}: {why}")
    if report["aborted"]:
        print(f"\nABORTED: {report['aborted']}")
    print("\nTargets:")
    for t in report["targets"]:
        print(f"  [{t['status']}] {t['target']}" + (f" ({t['note']})" if t["note"] else ""))
        if t["values"] and t["status"] != "SKIP":
            print("         " + "; ".join(f"{k}: {_fmt(v, '.2f').strip()}"
                                          + ("" if v is not None and v >= t["threshold"] else " (miss)")
                                          for k, v in t["values"].items()))


# --- plot -------------------------------------------------------------------------------------------

def _values(rows, mode, getter) -> List[float]:
    out = []
    for r in rows:
        md = r["modes"].get(mode, {})
        v = getter(md.get("summary", {})) if "summary" in md else None
        out.append(float(v) if isinstance(v, (int, float)) and math.isfinite(v) else float("nan"))
    return out


def _bars(ax, x, series):
    """Grouped bars; ``series``: (label, values). NaN values get no bar and no label."""
    width = 0.84 / max(1, len(series))
    for i, (label, values) in enumerate(series):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label,
                      edgecolor="black", linewidth=0.3)
        ax.bar_label(bars, labels=[f"{v:.2f}" if math.isfinite(v) else "" for v in values],
                     fontsize=6, rotation=90, padding=2)


def plot(report: Dict[str, Any], path: str) -> bool:
    """conv_gpu.png: speedups vs spconv, cuBLAS-rate shares, with-map speedups, per-config times."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed: no plot", file=sys.stderr)
        return False
    rows = [r for r in report["layers"] if not r.get("skipped") and r.get("modes")]
    if not rows:
        print("warning: no layer finished: no plot", file=sys.stderr)
        return False
    modes, names = report["modes"], list(report["configs"])
    x = np.arange(len(rows))
    labels = [r["layer"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(18, 11))

    ax = axes[0, 0]
    _bars(ax, x, [(f"{m}: spconv best / ours best", _values(rows, m, lambda s: s.get("spconv_over_ours")))
                  for m in modes])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.axhline(TARGET_SPCONV_SPEEDUP, color="red", linewidth=0.8, linestyle=":")
    ax.set_title(f"kernel only (maps cached): t_spconv / t_ours (> 1: ours faster; target {TARGET_SPCONV_SPEEDUP} "
                 "on MinkUNet SubM)", fontsize=9)

    ax = axes[0, 1]
    series = []
    for m in modes:
        series.append((f"{m}: best of ours", _values(rows, m, lambda s: s.get("ours_vs_cublas_rate"))))
        series.append((f"{m}: best implicit GEMM", _values(rows, m, lambda s: s.get("implicit_gemm_vs_cublas_rate"))))
    _bars(ax, x, series)
    ax.axhline(TARGET_CUBLAS_RATE, color="red", linewidth=0.8, linestyle=":")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_title(f"t_cuBLAS / t_ours on the equivalent GEMM (M=N_out, K=kvol*C_in, N=C_out); target "
                 f"{TARGET_CUBLAS_RATE} (fp16, C_in >= {TARGET_CUBLAS_MIN_CHANNELS})", fontsize=9)

    ax = axes[1, 0]
    _bars(ax, x, [(f"{m}: spconv+map / ours+map", _values(rows, m, lambda s: s.get("with_map", {}).get("spconv_over_ours")))
                  for m in modes])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_title("with map construction (fresh tensor per run): t_spconv / t_ours, best of each", fontsize=9)

    ax = axes[1, 1]
    mode = modes[0]
    grid = np.full((len(names), len(rows)), np.nan)
    for j, r in enumerate(rows):
        md = r["modes"].get(mode, {})
        best = md.get("summary", {}).get("ours_best_ms")
        for i, n in enumerate(names):
            t = md.get("kernel", {}).get(f"ours:{n}", {}).get("median_ms")
            if t is not None and best:
                grid[i, j] = t / best
    # colours saturate at 3x the best, so configs within a few tens of percent stay distinguishable
    vmax = min(3.0, max(1.5, float(np.nanmax(grid)) if np.isfinite(grid).any() else 1.5))
    image = ax.imshow(grid, aspect="auto", cmap="viridis_r", vmin=1.0, vmax=vmax)
    for i in range(len(names)):
        for j in range(len(rows)):
            if math.isfinite(grid[i, j]):
                dark = (min(grid[i, j], vmax) - 1.0) / (vmax - 1.0) > 0.5
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    fig.colorbar(image, ax=ax, fraction=0.03)
    ax.set_title(f"{mode}: each config's time / the best config's (1.00 = best)", fontsize=9)

    for a in axes.flat:
        a.set_xticks(x, labels, fontsize=6, rotation=30, ha="right")
        if a is not axes[1, 1]:
            a.legend(fontsize=7)
            a.margins(y=0.2)
    m = report["machine"]
    fig.suptitle(f"torchsparse_pp GPU dataflows ({', '.join(report['backends'])}) vs spconv {m['spconv']} vs cuBLAS — {m['device_name']}, torch "
                 f"{m['torch']} (CUDA {m['torch_cuda']}), git {m['git_revision']}, {m['date']}"
                 + ("  [CPU DRY RUN]" if report["dry_run"] else ""), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    sys.exit(main())
