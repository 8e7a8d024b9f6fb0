"""Points and point-voxel operations (SPVCNN): PointTensor, initial_voxelize, point_to_voxel
(scatter mean), voxel_to_point (trilinear or nearest). Plain torch ops: any device, no
torch_scatter; differentiable in the features."""
from .ops import gather_weighted, scatter_mean, trilinear_corners
from .tensor import PointTensor
from .voxelize import initial_voxelize, point_to_voxel, voxel_to_point

__all__ = ["PointTensor", "initial_voxelize", "point_to_voxel", "voxel_to_point", "scatter_mean",
           "gather_weighted", "trilinear_corners"]
