"""Points -> voxel SparseTensor for CenterPoint: the mean of each voxel's points (a "mean VFE")."""
from typing import Sequence, Union

import numpy as np
import torch

from ...checks import all_finite
from ...tensor import SparseTensor
from .config import CenterPointConfig

PointsLike = Union[torch.Tensor, np.ndarray]


def voxelize(points: Sequence[PointsLike], config: CenterPointConfig) -> SparseTensor:
    """One sample per entry of ``points`` (each ``[N, point_features]``, x, y, z first, metres).

    Points outside ``config.point_cloud_range`` are dropped; each occupied voxel gets the mean of
    its points' features. The result has coordinates (batch, x, y, z) in the voxel grid and
    ``spatial_range = config.sparse_shape``, ready for CenterPoint.forward.
    """
    if isinstance(points, (torch.Tensor, np.ndarray)) or len(points) == 0:
        raise TypeError("voxelize expects a non-empty list of per-sample [N, F] point arrays")
    grid = config.grid_size
    rows_coords, rows_feats = [], []
    for b, sample in enumerate(points):
        pts = torch.as_tensor(sample)
        if pts.dim() != 2 or pts.shape[1] != config.point_features or not pts.is_floating_point():
            raise ValueError(f"sample {b}: points must be a float [N, {config.point_features}] array, got "
                             f"{pts.dtype} {list(pts.shape)}")
        pts = pts.float()
        if not all_finite(pts):
            raise ValueError(f"sample {b}: points contain NaN or Inf")
        lo = torch.tensor(config.point_cloud_range[:3], device=pts.device)
        size = torch.tensor(config.voxel_size, device=pts.device)
        cells = torch.floor((pts[:, :3] - lo) / size).long()
        inside = ((cells >= 0) & (cells < torch.tensor(grid, device=pts.device))).all(1)
        rows_coords.append(torch.cat([torch.full((int(inside.sum()), 1), b, device=pts.device), cells[inside]], 1))
        rows_feats.append(pts[inside])
    coords = torch.cat(rows_coords)
    if coords.shape[0] == 0:
        raise ValueError(f"no point lies inside point_cloud_range {config.point_cloud_range}")
    feats = torch.cat(rows_feats)
    voxels, inverse = torch.unique(coords, dim=0, return_inverse=True)
    sums = feats.new_zeros(len(voxels), feats.shape[1]).index_add_(0, inverse, feats)
    counts = torch.bincount(inverse, minlength=len(voxels)).clamp(min=1).to(feats.dtype)
    return SparseTensor(sums / counts[:, None], voxels.int(), spatial_range=config.sparse_shape)
