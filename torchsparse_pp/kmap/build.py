"""Builds (or finds in the cache) the kernel map of each convolution variant.

Every variant reduces to one relation between an input set P and an output set Q:
output q reads input p = q*s - pad + delta*d. They differ only in how Q is made.
"""
import time
from typing import Optional

import torch

from .. import ops
from .cache import KernelMapCache, KernelMapKey
from .geometry import ConvGeometry, Triple
from .kernel_map import OUT_IN_ROW_PADDING, KernelMap

DOWNSAMPLE_MODES = ("spconv", "minkowski")


def _build(cache: KernelMapCache, in_coords: torch.Tensor, out_coords: torch.Tensor,
           geometry: ConvGeometry, mode: str, in_range: Optional[Triple], out_range: Optional[Triple],
           started: float) -> KernelMap:
    keys, vals = cache.hash_table(in_coords)
    symmetric = out_coords is in_coords and geometry.is_centred
    out_in = ops.kmap_out_in(keys, vals, out_coords, *geometry.args(), OUT_IN_ROW_PADDING, symmetric)
    return KernelMap(in_coords, out_coords, geometry, mode, out_in, in_range, out_range,
                     time.perf_counter() - started)


def submanifold_map(cache: KernelMapCache, coords: torch.Tensor, geometry: ConvGeometry,
                    spatial_range: Optional[Triple]) -> KernelMap:
    """Q = P: outputs sit on the input coordinates."""
    key = KernelMapKey(cache.token(coords), geometry, "submanifold", spatial_range)
    return cache.kernel_map(key, lambda: _build(cache, coords, coords, geometry, "submanifold",
                                                spatial_range, spatial_range, time.perf_counter()))


def strided_map(cache: KernelMapCache, coords: torch.Tensor, geometry: ConvGeometry, mode: str,
                spatial_range: Optional[Triple]) -> KernelMap:
    """spconv: Q = every q some p reaches (clipped to the dense output size when the range is
    known); minkowski: Q = unique(floor(p / s))."""
    if mode not in DOWNSAMPLE_MODES:
        raise ValueError(f"downsample mode must be one of {DOWNSAMPLE_MODES}, got {mode!r}")

    def build() -> KernelMap:
        started = time.perf_counter()
        if mode == "minkowski":
            out_range = None if spatial_range is None else tuple(
                (n - 1) // s + 1 for n, s in zip(spatial_range, geometry.stride))
            out_coords = ops.kmap_output_coords(coords, *geometry.args(), "minkowski", None)
        else:
            out_range = None if spatial_range is None else geometry.dense_output_size(spatial_range)
            if out_range is not None and min(out_range) < 1:
                raise ValueError(f"spatial_range {spatial_range} is smaller than the kernel extent: "
                                 f"the dense output size would be {out_range}")
            out_coords = ops.kmap_output_coords(coords, *geometry.args(), "spconv", out_range)
        return _build(cache, coords, out_coords, geometry, mode, spatial_range, out_range, started)

    key = KernelMapKey(cache.token(coords), geometry, mode, spatial_range)
    return cache.kernel_map(key, build)


def generative_map(cache: KernelMapCache, coords: torch.Tensor, geometry: ConvGeometry,
                   spatial_range: Optional[Triple]) -> KernelMap:
    """Generative transposed conv from coarse P: the fine set is every q*s - pad + delta*d that
    conv_transpose3d writes (clipped to its output size when the range is known). The map runs
    from that fine set (its input side) to P (its output side) and is used transposed."""

    def build() -> KernelMap:
        started = time.perf_counter()
        fine_range = None if spatial_range is None else geometry.transposed_output_size(spatial_range)
        if fine_range is not None and min(fine_range) < 1:
            raise ValueError(f"spatial_range {spatial_range} gives an empty transposed output {fine_range}")
        fine = ops.kmap_output_coords(coords, *geometry.args(), "generative", fine_range)
        return _build(cache, fine, coords, geometry, "generative", fine_range, spatial_range, started)

    key = KernelMapKey(cache.token(coords), geometry, "generative", spatial_range)
    return cache.kernel_map(key, build)


def transposed_source_map(cache: KernelMapCache, coords: torch.Tensor,
                          geometry: ConvGeometry) -> Optional[KernelMap]:
    """The strided map whose output set is ``coords`` (by identity) with this geometry, if any."""
    for key, kmap in cache.maps():
        if key.mode in DOWNSAMPLE_MODES and kmap.out_coords is coords and kmap.geometry == geometry:
            return kmap
    return None
