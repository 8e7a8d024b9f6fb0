"""Voxelisation of point coordinates."""
from typing import Sequence, Union

import numpy as np
import torch

from ..checks import SPATIAL_MAX, SPATIAL_MIN

ArrayLike = Union[np.ndarray, torch.Tensor]


def _voxel_size(voxel_size, dims: int) -> torch.Tensor:
    size = torch.as_tensor(voxel_size, dtype=torch.float64).flatten()
    if size.numel() == 1:
        size = size.expand(dims)
    if size.numel() != dims:
        raise ValueError(f"voxel_size must be a scalar or have {dims} entries, got {voxel_size!r}")
    if not bool(torch.isfinite(size).all()) or bool((size <= 0).any()):
        raise ValueError(f"voxel_size must be positive and finite, got {voxel_size!r}")
    return size


def sparse_quantize(coords: ArrayLike, voxel_size: Union[float, Sequence[float]] = 1.0, *,
                    return_index: bool = False, return_inverse: bool = False):
    """Voxel coordinates ``floor(coords / voxel_size)`` with duplicates removed.

    ``coords`` is ``[N, D]`` (numpy or torch, any real dtype, negative values allowed);
    ``voxel_size`` is a scalar or per-axis. Returns int32 voxel coordinates sorted
    lexicographically, in the input's array type, plus on request:

    - ``index``: for each voxel, the first input row that falls into it;
    - ``inverse``: for each input row, its voxel's row in the output.
    """
    is_numpy = isinstance(coords, np.ndarray)
    if not is_numpy and not isinstance(coords, torch.Tensor):
        raise TypeError(f"coords must be a numpy array or torch tensor, got {type(coords).__name__}")
    points = torch.from_numpy(np.ascontiguousarray(coords)) if is_numpy else coords
    if points.dim() != 2 or points.shape[0] == 0:
        raise ValueError(f"coords must be a non-empty [N, D] array, got shape {tuple(points.shape)}")
    if points.is_complex() or points.dtype == torch.bool:
        raise TypeError(f"coords must be real numbers, got {points.dtype}")
    points = points.to(torch.float64)
    if not bool(torch.isfinite(points).all()):
        raise ValueError("coords contain NaN or Inf")
    voxels = torch.floor(points / _voxel_size(voxel_size, points.shape[1]).to(points.device))
    lo, hi = voxels.min().item(), voxels.max().item()
    if lo < SPATIAL_MIN or hi > SPATIAL_MAX:
        raise ValueError(f"voxel coordinates span [{lo:.0f}, {hi:.0f}], outside the supported range "
                         f"[{SPATIAL_MIN}, {SPATIAL_MAX}]; use a larger voxel_size or crop the points")
    voxels = voxels.to(torch.int64)
    unique, inverse = torch.unique(voxels, dim=0, return_inverse=True)
    rows = torch.arange(points.shape[0], device=points.device)
    index = torch.full((unique.shape[0],), points.shape[0], dtype=torch.int64, device=points.device)
    index = index.scatter_reduce(0, inverse, rows, reduce="amin")

    outputs = [unique.to(torch.int32)]
    if return_index:
        outputs.append(index)
    if return_inverse:
        outputs.append(inverse)
    if is_numpy:
        outputs = [o.numpy() for o in outputs]
    return outputs[0] if len(outputs) == 1 else tuple(outputs)
