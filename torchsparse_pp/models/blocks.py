"""Sparse building blocks shared by the models: Conv-BN-ReLU and the basic residual block."""
from typing import Optional

from torch import nn

from ..kmap.geometry import IntOr3
from ..nn import BatchNorm, Conv3d, FusedConv3d, ReLU, register_fuser
from ..nn.fusion import fuse_module
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


class FusedResidualBlock(nn.Module):
    """Inference form of ResidualBlock: conv1 (BatchNorm folded, ReLU in its epilogue), the
    shortcut (identity, or a fused 1x1x1 conv), and conv2 whose epilogue adds the shortcut and
    applies the block's ReLU."""

    def __init__(self, block: ResidualBlock):
        super().__init__()
        body = block.body
        self.conv1 = FusedConv3d(body[0], body[1], relu=True)
        self.conv2 = FusedConv3d(body[3], body[4], relu=True)
        self.shortcut = fuse_module(block.shortcut)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return self.conv2(self.conv1(x), residual=self.shortcut(x))


@register_fuser(ResidualBlock)
def _fuse_residual_block(block: ResidualBlock) -> FusedResidualBlock:
    return FusedResidualBlock(block)
