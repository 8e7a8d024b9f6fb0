"""``spconv.pytorch.utils``: PointToVoxel (torch tensors in and out) and
gather_features_by_pc_voxel_id.

The voxels, their order and the per-point voxel ids are spconv 2.3.8's CPU ones on every device
(spconv's GPU generator numbers voxels in its hash table's order instead).
"""
from typing import List, Union

import torch

from ..point_to_voxel import VoxelGrid, point_to_voxel_into


class PointToVoxel:
    """spconv's torch voxel generator: buffers of ``max_num_voxels`` voxels on ``device``."""

    def __init__(self, vsize_xyz: List[float], coors_range_xyz: List[float], num_point_features: int,
                 max_num_voxels: int, max_num_points_per_voxel: int, device: torch.device = torch.device("cpu:0")):
        self.ndim = len(vsize_xyz)
        self.device = torch.device(device)
        grid = VoxelGrid.from_xyz(vsize_xyz, coors_range_xyz)
        self._grid = grid
        self.vsize, self.grid_size, self.grid_stride, self.coors_range = grid.meta_data()
        self.num_point_features = num_point_features
        self.max_num_voxels = max_num_voxels
        self.max_num_points_per_voxel = max_num_points_per_voxel
        self.voxels = torch.zeros([max_num_voxels, max_num_points_per_voxel, num_point_features],
                                  dtype=torch.float32, device=self.device)
        self.indices = torch.zeros([max_num_voxels, self.ndim], dtype=torch.int32, device=self.device)
        self.num_per_voxel = torch.zeros([max_num_voxels], dtype=torch.int32, device=self.device)

    def __call__(self, pc: torch.Tensor, clear_voxels: bool = True, empty_mean: bool = False):
        """(voxels, indices (z, y, x), num_per_voxel), copies."""
        return self.generate_voxel_with_id(pc, clear_voxels, empty_mean)[:3]

    def generate_voxel_with_id(self, pc: torch.Tensor, clear_voxels: bool = True, empty_mean: bool = False):
        """(voxels, indices, num_per_voxel, pc_voxel_id): copies of the filled buffers and every
        point's voxel id (int64, -1 for points outside the range or beyond max_num_voxels)."""
        if not isinstance(pc, torch.Tensor):
            raise TypeError(f"pc must be a torch tensor, got {type(pc).__name__}")
        if pc.device.type != self.device.type:
            raise ValueError(f"your pc device is wrong: the points are on {pc.device}, the generator on "
                             f"{self.device}")
        count, voxel_id = point_to_voxel_into(pc, self.voxels, self.indices, self.num_per_voxel, self._grid,
                                              clear_voxels, empty_mean)
        return (self.voxels[:count].clone(), self.indices[:count].clone(), self.num_per_voxel[:count].clone(),
                voxel_id)


def gather_features_by_pc_voxel_id(seg_res_features: torch.Tensor, pc_voxel_id: torch.Tensor,
                                   invalid_value: Union[int, float] = 0) -> torch.Tensor:
    """Per point, the features of its voxel (``invalid_value`` for points without one)."""
    pc_voxel_id = pc_voxel_id.to(seg_res_features.device)
    out = torch.full((pc_voxel_id.shape[0], *seg_res_features.shape[1:]), invalid_value,
                     dtype=seg_res_features.dtype, device=seg_res_features.device)
    valid = (pc_voxel_id != -1).nonzero().view(-1)
    out[valid] = seg_res_features[pc_voxel_id[valid]]
    return out
