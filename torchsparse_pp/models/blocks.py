"""Sparse building blocks shared by the models: Conv-BN-ReLU and the basic residual block."""
from typing import Optional

from torch import nn

from ..kmap.geometry import IntOr3
from ..nn import BatchNorm, Conv3d, ReLU
from ..tensor import SparseTensor


def conv_bn_relu(in_channels: int, out_channels: int, kernel_size: IntOr3 = 3, stride: IntOr3 = 1,
                 padding: Optional[IntOr3] = None, transposed: bool = False) -> nn.Sequential:
    """Sparse conv (no bias: the norm follows), BatchNorm, ReLU."""
    return nn.Sequential(
        Conv3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, transposed=transposed),
        BatchNorm(out_channels),
        ReLU(True),
    )


class ResidualBlock(nn.Module):
    """Two stride-1 (submanifold) convs with BatchNorm and ReLU, plus a shortcut: the identity
    when the channel count stays, else a 1x1x1 conv and BatchNorm. ReLU after the sum."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOr3 = 3):
        super().__init__()
        self.body = nn.Sequential(
            Conv3d(in_channels, out_channels, kernel_size),
            BatchNorm(out_channels),
            ReLU(True),
            Conv3d(out_channels, out_channels, kernel_size),
            BatchNorm(out_channels),
        )
        if in_channels == out_channels:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Sequential(Conv3d(in_channels, out_channels, 1), BatchNorm(out_channels))
        self.relu = ReLU(True)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return self.relu(self.body(x) + self.shortcut(x))
