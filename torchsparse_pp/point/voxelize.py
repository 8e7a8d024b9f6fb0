"""Point <-> voxel conversions of point-voxel networks (SPVCNN), differentiable in the features."""
import torch

from ..tensor import SparseTensor
from .lookup import find_rows
from .ops import gather_weighted, scatter_mean, trilinear_corners
from .tensor import PointTensor


def _voxel_of(points: PointTensor, stride) -> torch.Tensor:
    """``(batch, floor(x / s), ...)`` of every point as int64 rows."""
    scale = torch.tensor(stride, dtype=points.C.dtype, device=points.C.device)
    return torch.cat([points.C[:, :1], torch.floor(points.C[:, 1:] / scale)], 1).long()


def initial_voxelize(points: PointTensor) -> SparseTensor:
    """The stride-1 voxels that hold points (coordinates sorted like every new coordinate set),
    each with the mean feature of its points."""
    cells = _voxel_of(points, (1, 1, 1))
    coords, rows = torch.unique(cells, dim=0, return_inverse=True)
    coords = coords.int()
    points.lookup(("voxel", (1, 1, 1)), coords, lambda: rows)
    return SparseTensor(scatter_mean(points.F, rows, coords.shape[0]), coords)


def point_to_voxel(voxels: SparseTensor, points: PointTensor) -> SparseTensor:
    """Features on ``voxels``' coordinates: each voxel gets the mean feature of the points inside
    it (0 where there is none; points outside every voxel are dropped). Shares ``voxels``' maps."""
    rows = points.lookup(("voxel", voxels.s), voxels.C, lambda: find_rows(voxels.C, _voxel_of(points, voxels.s)))
    feats = scatter_mean(points.F, rows, voxels.num_points)
    return SparseTensor._derive(feats, voxels.C, voxels.s, voxels.spatial_range, voxels.cache)


def _trilinear(voxels: SparseTensor, points: PointTensor):
    scale = torch.tensor(voxels.s, dtype=points.C.dtype, device=points.C.device)
    corners, weights = trilinear_corners(points.C[:, 1:] / scale)
    batch = points.C[:, :1].long().unsqueeze(1).expand(-1, 8, 1)
    rows = find_rows(voxels.C, torch.cat([batch, corners], 2).reshape(-1, 4)).view(-1, 8)
    weights = torch.where(rows >= 0, weights, torch.zeros_like(weights))
    total = weights.sum(1, keepdim=True)
    return rows, weights / torch.where(total > 0, total, torch.ones_like(total))  # all-missing rows stay 0


def _nearest(voxels: SparseTensor, points: PointTensor):
    rows = find_rows(voxels.C, _voxel_of(points, voxels.s)).unsqueeze(1)
    return rows, (rows >= 0).to(points.C.dtype)


def voxel_to_point(voxels: SparseTensor, points: PointTensor, nearest: bool = False) -> PointTensor:
    """Voxel features at the points, as a PointTensor on ``points``' coordinates.

    Trilinear: a point at ``u = p / s`` (voxel units of ``voxels``' stride s) mixes the present
    voxels among the 8 corners ``floor(u) + {0, 1}^3`` with weights ``prod(1 - |u - corner|)``,
    renormalised over the present ones (0 where none is present). ``nearest``: the voxel the
    point lies in (``floor(u)``), or 0 without one."""
    key = ("nearest" if nearest else "trilinear", voxels.s)
    rows, weights = points.lookup(key, voxels.C, lambda: (_nearest if nearest else _trilinear)(voxels, points))
    return points.replace_feats(gather_weighted(voxels.F, rows, weights))



