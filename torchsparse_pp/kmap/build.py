"""Builds (or finds in the cache) the kernel map of each convolution variant.

Every variant reduces to one relation between an input set P and an output set Q:
output q reads input p = q*s - pad + delta*d. They differ only in how Q is made.
"""
import time
from typing import Optional

import torch

from .cache import KernelMapCache, KernelMapKey
from .dispatch import kmap_backend_for, kmap_ops
from .geometry import ConvGeometry, Triple
from .kernel_map import OUT_IN_ROW_PADDING, GeometryKey, KernelMap

DOWNSAMPLE_MODES = ("spconv", "minkowski")


def _now(device: torch.device):
    """The build clock: host seconds, or on a GPU a recorded CUDA event (read without
    synchronising); 0 while torch.compile / export traces (no clock in a graph)."""
    if torch.compiler.is_compiling():
        return 0.0
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        start.record(torch.cuda.current_stream(device))
        return start
    return time.perf_counter()


def _elapsed(started, result: torch.Tensor):
    """The build's seconds since ``started``: a float for host clocks, else a function that waits
    for the end event when first asked (KernelMap.build_seconds), so building never synchronises."""
    if torch.compiler.is_compiling():
        return 0.0
    if not isinstance(started, torch.cuda.Event):
        return time.perf_counter() - started
    end = torch.cuda.Event(enable_timing=True)
    end.record(torch.cuda.current_stream(result.device))

    def seconds() -> float:
        end.synchronize()
        return started.elapsed_time(end) / 1e3
    return seconds


def submanifold_map(cache: KernelMapCache, coords: torch.Tensor, geometry: ConvGeometry,
                    spatial_range: Optional[Triple]) -> KernelMap:
    """Q = P: outputs sit on the input coordinates (built by sort and merge)."""

    def build() -> KernelMap:
        backend = kmap_backend_for(coords.device)
        started = _now(coords.device)
        out_in = kmap_ops(backend).kmap_submanifold(coords, geometry.kernel_size, geometry.dilation,
                                                    geometry.padding, OUT_IN_ROW_PADDING)
        return KernelMap(coords, coords, geometry, "submanifold", out_in, spatial_range, spatial_range,
                         _elapsed(started, out_in), backend)

    key = KernelMapKey.of(cache.token(coords), geometry, "submanifold", spatial_range)
    return cache.kernel_map(key, build)


def strided_map(cache: KernelMapCache, coords: torch.Tensor, geometry: ConvGeometry, mode: str,
                spatial_range: Optional[Triple]) -> KernelMap:
    """spconv: Q = every q some p reaches (clipped to the dense output size when the range is
    known); minkowski: Q = unique(floor(p / s))."""
    if mode not in DOWNSAMPLE_MODES:
        raise ValueError(f"downsample mode must be one of {DOWNSAMPLE_MODES}, got {mode!r}")

    def build() -> KernelMap:
        backend = kmap_backend_for(coords.device)
        started = _now(coords.device)
        clip = None
        if spatial_range is None:
            out_range = None
        elif mode == "minkowski":
            out_range = tuple((n - 1) // s + 1 for n, s in zip(spatial_range, geometry.stride))
        else:
            out_range = clip = geometry.dense_output_size(spatial_range)
            if min(out_range) < 1:
                raise ValueError(f"spatial_range {spatial_range} is smaller than the kernel extent: "
                                 f"the dense output size would be {out_range}")
        out_coords, out_in = kmap_ops(backend).kmap_downsample(coords, *geometry.args(), mode, clip,
                                                               OUT_IN_ROW_PADDING)
        return KernelMap(coords, out_coords, geometry, mode, out_in, spatial_range, out_range,
                         _elapsed(started, out_in), backend)

    key = KernelMapKey.of(cache.token(coords), geometry, mode, spatial_range)
    return cache.kernel_map(key, build)


def generative_map(cache: KernelMapCache, coords: torch.Tensor, geometry: ConvGeometry,
                   spatial_range: Optional[Triple]) -> KernelMap:
    """Generative transposed conv from coarse P: the fine set is every q*s - pad + delta*d that
    conv_transpose3d writes (clipped to its output size when the range is known). The map runs
    from that fine set (its input side) to P (its output side) and is used transposed."""

    def build() -> KernelMap:
        backend = kmap_backend_for(coords.device)
        started = _now(coords.device)
        fine_range = None if spatial_range is None else geometry.transposed_output_size(spatial_range)
        if fine_range is not None and min(fine_range) < 1:
            raise ValueError(f"spatial_range {spatial_range} gives an empty transposed output {fine_range}")
        fine, out_in = kmap_ops(backend).kmap_generative(coords, *geometry.args(), fine_range, OUT_IN_ROW_PADDING)
        return KernelMap(fine, coords, geometry, "generative", out_in, fine_range, spatial_range,
                         _elapsed(started, out_in), backend)

    key = KernelMapKey.of(cache.token(coords), geometry, "generative", spatial_range)
    return cache.kernel_map(key, build)


def transposed_source_map(cache: KernelMapCache, coords: torch.Tensor,
                          geometry: ConvGeometry) -> Optional[KernelMap]:
    """The strided map whose output set is ``coords`` (by identity) with this geometry, if any."""
    wanted = GeometryKey.of(geometry)
    for key, kmap in cache.maps():
        if key.mode in DOWNSAMPLE_MODES and key.geometry == wanted and kmap.out_coords is coords:
            return kmap
    return None
