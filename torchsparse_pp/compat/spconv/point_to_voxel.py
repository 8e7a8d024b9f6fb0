"""spconv 2.3.8's CPU point-to-voxel algorithm, in torch ops (any device), into caller-owned buffers.

What spconv's loop over the points does, and so what this reproduces:
- a point's cell on axis j (indices order: the reverse of the point's x, y, z... columns) is
  ``floor((p - low_j) / vsize_j)``, in the points' dtype with float32 ``low`` and ``vsize``;
  a point with any cell outside ``[0, grid_size_j)`` (NaN and infinities included) is dropped
  (voxel id -1);
- voxels are numbered in the order their first point comes; once ``max_num_voxels`` exist, the
  points of new voxels are dropped (voxel id -1);
- a voxel keeps its first ``max_num_points_per_voxel`` points, in order; later points of a full
  voxel still get its id;
- ``num_per_voxel`` is zeroed first, ``voxels`` only with ``clear_voxels`` (else the rows left
  from an earlier call stay), and ``indices`` rows are written only for the voxels made.
"""
import math
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
import torch


def _float32(value: float) -> float:
    return float(np.float32(value))


def _round_half_away(value: float) -> int:
    # std::round; value is a float32 number, so |value| + 0.5 is exact in double below 2**52.
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


@dataclass(frozen=True)
class VoxelGrid:
    """spconv's point-to-voxel metadata, every list in the indices' axis order (z, y, x for 3-D)."""
    vsize: List[float]
    grid_size: List[int]
    grid_stride: List[int]
    coors_range: List[float]  # lower bounds, then upper bounds

    @property
    def ndim(self) -> int:
        return len(self.vsize)

    @staticmethod
    def from_xyz(vsize_xyz, coors_range_xyz) -> "VoxelGrid":
        """spconv's calc_meta_data: float32 sizes and bounds, reversed; grid sizes rounded from
        float32 quotients; row-major strides."""
        vsize_xyz, coors_range_xyz = list(vsize_xyz), list(coors_range_xyz)
        ndim = len(vsize_xyz)
        if len(coors_range_xyz) != 2 * ndim:
            raise ValueError(f"coors_range_xyz needs {2 * ndim} values (lower then upper bounds) for "
                             f"{ndim} voxel sizes, got {len(coors_range_xyz)}")
        vsize = [_float32(v) for v in reversed(vsize_xyz)]
        low = [_float32(v) for v in reversed(coors_range_xyz[:ndim])]
        high = [_float32(v) for v in reversed(coors_range_xyz[ndim:])]
        extent = [float((np.float32(h) - np.float32(lo)) / np.float32(v)) for lo, h, v in zip(low, high, vsize)]
        grid_size = [_round_half_away(e) for e in extent]
        if any(not math.isfinite(e) or g < 0 for e, g in zip(extent, grid_size)):
            raise ValueError(f"the voxel grid of vsize_xyz={vsize_xyz} over coors_range_xyz={coors_range_xyz} "
                             f"has size {grid_size} (zyx): sizes must be positive and bounds ascending")
        stride, prod = [0] * ndim, 1
        for axis in reversed(range(ndim)):
            stride[axis], prod = prod, prod * grid_size[axis]
        return VoxelGrid(vsize, grid_size, stride, low + high)

    def meta_data(self) -> Tuple[List[float], List[int], List[int], List[float]]:
        return list(self.vsize), list(self.grid_size), list(self.grid_stride), list(self.coors_range)


def _check_points(points: torch.Tensor, voxels: torch.Tensor, ndim: int) -> None:
    if points.dim() != 2:
        raise ValueError(f"points must be [N, num_point_features], got shape {tuple(points.shape)}")
    if points.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"points must be float32 or float64 (as spconv's point_to_voxel), got {points.dtype}")
    if points.shape[1] != voxels.shape[2]:
        raise ValueError(f"your points num features doesn't equal to voxel: the points have {points.shape[1]} "
                         f"columns, the voxels num_point_features={voxels.shape[2]}")
    if points.shape[1] < ndim:
        raise ValueError(f"{ndim}-D voxels need at least {ndim} point columns (x, y, z...), got {points.shape[1]}")


def _cells(points: torch.Tensor, grid: VoxelGrid) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each point's cell (indices axis order, int64) and whether it lies in the grid."""
    ndim = grid.ndim
    xyz = points[:, :ndim].flip(1)
    low = torch.tensor(grid.coors_range[:ndim], dtype=points.dtype, device=points.device)
    size = torch.tensor(grid.vsize, dtype=points.dtype, device=points.device)
    cell = torch.floor((xyz - low) / size)
    limit = torch.tensor(grid.grid_size, dtype=points.dtype, device=points.device)
    inside = ((cell >= 0) & (cell < limit)).all(1)
    return torch.where(inside[:, None], cell, 0).long(), inside


def _first_appearance_ids(keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per row, the id of its key numbered by first appearance; and each id's first row."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    rows = torch.arange(keys.shape[0], device=keys.device)
    first = torch.full((unique.shape[0],), keys.shape[0], dtype=torch.long, device=keys.device)
    first = first.scatter_reduce(0, inverse, rows, "amin")
    by_appearance = torch.argsort(first)
    rank = torch.empty_like(by_appearance)
    rank[by_appearance] = torch.arange(unique.shape[0], device=keys.device)
    return rank[inverse], first[by_appearance]


def _slots(ids: torch.Tensor, num_ids: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each row's position among the rows of its id (in row order), and the rows per id."""
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=num_ids)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(ids)
    slot[order] = torch.arange(ids.shape[0], device=ids.device) - starts[ids[order]]
    return slot, counts


def _fill_empty_with_running_mean(voxels: torch.Tensor, num_per_voxel: torch.Tensor, num_voxels: int) -> None:
    """spconv's empty_mean, as its CPU build computes it: its per-voxel sum is never reset (the
    buffer is cleared with std::vector::clear, which keeps the values), so voxel i's filler is
    (filler of voxel i-1 + its points, summed in order) / its count, in float32, voxel 0 from 0."""
    block = voxels[:num_voxels].cpu().numpy()
    counts = num_per_voxel[:num_voxels].cpu().numpy()
    running = np.zeros(block.shape[2], dtype=block.dtype)
    for i in range(num_voxels):
        n = int(counts[i])
        for j in range(n):
            running += block[i, j]
        running /= block.dtype.type(n)
        block[i, n:] = running
    voxels[:num_voxels] = torch.from_numpy(block).to(voxels.device)


def point_to_voxel_into(points: torch.Tensor, voxels: torch.Tensor, indices: torch.Tensor,
                        num_per_voxel: torch.Tensor, grid: VoxelGrid, clear_voxels: bool = True,
                        empty_mean: bool = False) -> Tuple[int, torch.Tensor]:
    """Fills the buffers ``voxels [max_voxels, max_points, C]``, ``indices [max_voxels, ndim]``
    (int32) and ``num_per_voxel [max_voxels]`` (int32) in place, as spconv does; returns the
    number of voxels made and every point's voxel id (int64, -1 where dropped)."""
    _check_points(points, voxels, grid.ndim)
    max_voxels, max_points = voxels.shape[0], voxels.shape[1]
    with torch.no_grad():
        cells, inside = _cells(points, grid)
        stride = torch.tensor(grid.grid_stride, dtype=torch.long, device=points.device)
        inside_rows = inside.nonzero().squeeze(1)
        ids, first = _first_appearance_ids((cells[inside_rows] * stride).sum(1))
        num_voxels = min(int(first.shape[0]), max_voxels)
        kept = ids < num_voxels
        rows, ids = inside_rows[kept], ids[kept]
        voxel_id = torch.full((points.shape[0],), -1, dtype=torch.long, device=points.device)
        voxel_id[rows] = ids
        slot, counts = _slots(ids, num_voxels)
        stored = slot < max_points
        num_per_voxel.zero_()
        num_per_voxel[:num_voxels] = counts.clamp(max=max_points).to(num_per_voxel.dtype)
        if clear_voxels:
            voxels.zero_()
        voxels[ids[stored], slot[stored]] = points[rows[stored]].to(voxels.dtype)
        indices[:num_voxels] = cells[inside_rows[first[:num_voxels]]].to(indices.dtype)
        if empty_mean:
            _fill_empty_with_running_mean(voxels, num_per_voxel, num_voxels)
    return num_voxels, voxel_id
