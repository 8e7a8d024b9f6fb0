"""``spconv.utils``: the CPU voxel generators ``Point2VoxelCPU1d`` ... ``Point2VoxelCPU4d``.

As spconv's, they take and return ``cumm.tensorview`` tensors (``tv.from_numpy(points)``; the
results have ``.numpy()``), so cumm must be installed to call them. The results are views of the
generator's own buffers, which the next call overwrites (copy them with ``.numpy()``). Torch
users: ``spconv.pytorch.utils.PointToVoxel``. spconv's box operations (``rbbox_iou``,
``non_max_suppression_cpu``, ...) are not provided.
"""
from contextlib import nullcontext  # noqa: F401  (spconv.utils exports one)
from typing import List, Tuple

import torch

from .point_to_voxel import VoxelGrid, point_to_voxel_into


def _tensorview():
    try:
        from cumm import tensorview
    except ImportError as error:
        raise ImportError("spconv.utils.Point2VoxelCPU* take and return cumm.tensorview tensors, as spconv's do: "
                          "install cumm, or use spconv.pytorch.utils.PointToVoxel with torch tensors") from error
    return tensorview


def _as_torch(tensor, name: str) -> torch.Tensor:
    """A torch view of a cumm tensor's memory (spconv's generators take nothing else)."""
    tv = _tensorview()
    if not isinstance(tensor, tv.Tensor):
        raise TypeError(f"{name} must be a cumm.tensorview.Tensor, as spconv's Point2VoxelCPU takes "
                        f"(tv.from_numpy(array)), got {type(tensor).__name__}")
    return torch.from_numpy(tensor.numpy_view())


def _as_tv(tensor: torch.Tensor):
    return _tensorview().from_numpy(tensor.numpy())


class _Point2VoxelCPU:
    ndim = 3

    def __init__(self, vsize_xyz: List[float], coors_range_xyz: List[float], num_point_features: int,
                 max_num_voxels: int, max_num_points_per_voxel: int):
        if len(vsize_xyz) != self.ndim:
            raise ValueError(f"{type(self).__name__} needs {self.ndim} voxel sizes, got {list(vsize_xyz)}")
        self._grid = VoxelGrid.from_xyz(vsize_xyz, coors_range_xyz)
        self._voxels = torch.zeros(max_num_voxels, max_num_points_per_voxel, num_point_features)
        self._indices = torch.zeros(max_num_voxels, self.ndim, dtype=torch.int32)
        self._num_per_voxel = torch.zeros(max_num_voxels, dtype=torch.int32)

    @staticmethod
    def calc_meta_data(vsize_xyz: List[float], coors_range_xyz: List[float]):
        """(vsize, grid_size, grid_stride, coors_range), each in z, y, x order."""
        return VoxelGrid.from_xyz(vsize_xyz, coors_range_xyz).meta_data()

    @property
    def grid_size(self) -> List[int]:
        return list(self._grid.grid_size)

    @property
    def voxels(self):
        return _as_tv(self._voxels)

    @property
    def indices(self):
        return _as_tv(self._indices)

    @property
    def num_per_voxel(self):
        return _as_tv(self._num_per_voxel)

    @property
    def densehashdata(self):
        # spconv's dense cell -> voxel table, all -1 between calls; made only when asked for.
        return _as_tv(torch.full(self._grid.grid_size, -1, dtype=torch.int32))

    def _run(self, points, clear_voxels: bool, empty_mean: bool) -> Tuple:
        count, _ = point_to_voxel_into(_as_torch(points, "points"), self._voxels, self._indices, self._num_per_voxel,
                                       self._grid, clear_voxels, empty_mean)
        return tuple(_as_tv(t[:count]) for t in (self._voxels, self._indices, self._num_per_voxel))

    def point_to_voxel(self, points, clear_voxels: bool = True):
        """(voxels, indices (z, y, x), num_per_voxel) as cumm tensors (views of the buffers)."""
        return self._run(points, clear_voxels, False)

    def point_to_voxel_empty_mean(self, points, clear_voxels: bool = True):
        """point_to_voxel, with each voxel's empty rows filled as spconv fills them (see
        point_to_voxel._fill_empty_with_running_mean)."""
        return self._run(points, clear_voxels, True)

    @staticmethod
    def _run_static(points, voxels, indices, num_per_voxel, points_voxel_id, vsize, grid_size, grid_stride,
                    coors_range, clear_voxels: bool, empty_mean: bool):
        grid = VoxelGrid([float(v) for v in vsize], [int(v) for v in grid_size], [int(v) for v in grid_stride],
                         [float(v) for v in coors_range])
        buffers = [_as_torch(t, n) for t, n in ((voxels, "voxels"), (indices, "indices"),
                                                 (num_per_voxel, "num_per_voxel"))]
        count, ids = point_to_voxel_into(_as_torch(points, "points"), *buffers, grid, clear_voxels, empty_mean)
        _as_torch(points_voxel_id, "points_voxel_id").copy_(ids)
        return tuple(_as_tv(t[:count]) for t in buffers)

    @staticmethod
    def point_to_voxel_static(points, voxels, indices, num_per_voxel, densehashdata, points_voxel_id, vsize,
                              grid_size, grid_stride, coors_range, clear_voxels: bool = True):
        """Into caller-made buffers (``densehashdata`` is not read: the cells are found by sorting)."""
        return _Point2VoxelCPU._run_static(points, voxels, indices, num_per_voxel, points_voxel_id, vsize,
                                           grid_size, grid_stride, coors_range, clear_voxels, False)

    @staticmethod
    def point_to_voxel_empty_mean_static(points, voxels, indices, num_per_voxel, densehashdata, points_voxel_id,
                                         vsize, grid_size, grid_stride, coors_range, clear_voxels: bool = True):
        return _Point2VoxelCPU._run_static(points, voxels, indices, num_per_voxel, points_voxel_id, vsize,
                                           grid_size, grid_stride, coors_range, clear_voxels, True)


def _generator(ndim: int):
    return type(f"Point2VoxelCPU{ndim}d", (_Point2VoxelCPU,), {"ndim": ndim, "__module__": __name__})


Point2VoxelCPU1d = _generator(1)
Point2VoxelCPU2d = _generator(2)
Point2VoxelCPU3d = _generator(3)
Point2VoxelCPU4d = _generator(4)

__all__ = ["Point2VoxelCPU1d", "Point2VoxelCPU2d", "Point2VoxelCPU3d", "Point2VoxelCPU4d", "nullcontext"]
