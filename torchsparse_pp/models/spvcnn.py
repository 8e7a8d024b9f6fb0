"""SPVCNN: MinkUNet's voxel branch plus a point branch (Sparse Point-Voxel Convolution, SPVNAS).

The voxel branch is MinkUNet's (same modules and parameter names); a point branch at full
resolution is read from the voxels by trilinear interpolation after the stem, the encoder and the
second and fourth decoder stages, refined by a linear layer (BN, ReLU) and added back, and is
scattered (mean) into the voxels before the decoder stages. Predictions are per point.
"""
import torch
from torch import nn

from ..operators import cat
from ..point import PointTensor, initial_voxelize, point_to_voxel, voxel_to_point
from ..tensor import SparseTensor
from ..utils.cpu_bf16 import dense_autocast
from .minkunet import MinkUNet


def _point_mlp(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(c_in, c_out), nn.BatchNorm1d(c_out), nn.ReLU(True))


def points_of(x: SparseTensor) -> PointTensor:
    """The points of a SparseTensor of point coordinates (SPVNAS's input): its integer
    coordinates as point coordinates, in float64 for float64 features, else float32."""
    dtype = torch.float64 if x.F.dtype == torch.float64 else torch.float32
    return PointTensor(x.F, x.C.to(dtype))


class SPVCNN(MinkUNet):
    """``forward`` takes a PointTensor: ``in_channels`` features per point at float coordinates
    ``(batch, x, y, z)`` in voxel units (point p lies in voxel floor(p)), or, as SPVNAS's SPVCNN,
    a SparseTensor whose coordinates are the points' (voxel units; rows may share a voxel), and
    returns logits ``[N_points, num_classes]`` in the input's row order."""

    def __init__(self, in_channels: int = 4, num_classes: int = 19, cr: float = 1.0, dropout: float = 0.3):
        super().__init__(in_channels, num_classes, cr)
        cs = self.channels
        self.point_transforms = nn.ModuleList([_point_mlp(cs[0], cs[4]), _point_mlp(cs[4], cs[6]),
                                               _point_mlp(cs[6], cs[8])])
        self.dropout = nn.Dropout(dropout)

    def _decode_half(self, y, z: PointTensor, first: int, skips, transform: int):
        """Point features into ``y``'s voxels, decoder stages ``first`` and ``first + 1`` (joined
        with their skips), then the voxels back at the points plus the refined point features."""
        y = point_to_voxel(y, z)
        y = y.replace_feats(self.dropout(y.F))
        for stage in (first, first + 1):
            y = self.decoder[stage](cat([self.up[stage](y), skips[3 - stage]]))
        z_next = voxel_to_point(y, z)
        return y, z_next.replace_feats(z_next.F + dense_autocast(self.point_transforms[transform], z.F))

    def forward(self, z) -> torch.Tensor:
        if isinstance(z, SparseTensor):
            z = points_of(z)
        if not isinstance(z, PointTensor):
            raise TypeError(f"SPVCNN expects a PointTensor or a SparseTensor of points, got {type(z).__name__}")
        if z.F.shape[1] != self.in_channels:
            raise ValueError(f"SPVCNN was built for {self.in_channels} input channels, got {z.F.shape[1]}")
        x0 = self.stem(initial_voxelize(z))
        z0 = voxel_to_point(x0, z)
        skips = [x0]
        x = point_to_voxel(x0, z0)
        for stage in self.encoder:
            x = stage(x)
            skips.append(x)
        z1 = voxel_to_point(x, z0)
        z1 = z1.replace_feats(z1.F + dense_autocast(self.point_transforms[0], z0.F))
        y, z2 = self._decode_half(x, z1, 0, skips, 1)
        _, z3 = self._decode_half(y, z2, 2, skips, 2)
        return dense_autocast(self.classifier, z3.F)
