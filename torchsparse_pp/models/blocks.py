"""Sparse building blocks shared by the models: Conv-BN-ReLU and the basic residual block."""
from typing import Optional

from torch import nn

from ..kmap.geometry import IntOr3
from ..nn import BatchNorm, Conv3d, FusedConv3d, ReLU, SyncBatchNorm, register_fuser
from ..nn.fusion import fuse_module
from ..tensor import SparseTensor


def _norm_takes_act(module: nn.Module) -> bool:
    """Whether ``module`` is one of our BatchNorms, whose forward adds a residual and applies the
    ReLU in its own pass (a subclass or another norm is called plainly)."""
    return type(module) in (BatchNorm, SyncBatchNorm)


class ConvBNReLU(nn.Sequential):
    """Sparse conv (no bias: the norm follows), BatchNorm, ReLU: an nn.Sequential (same modules and
    state_dict keys as one built by hand) whose BatchNorm applies the ReLU in its own pass."""

    def forward(self, x: SparseTensor) -> SparseTensor:
        if len(self) == 3 and _norm_takes_act(self[1]) and type(self[2]) is ReLU:
            return self[1](self[0](x), relu=True)
        return super().forward(x)


def conv_bn_relu(in_channels: int, out_channels: int, kernel_size: IntOr3 = 3, stride: IntOr3 = 1,
                 padding: Optional[IntOr3] = None, transposed: bool = False) -> nn.Sequential:
    """Sparse conv (no bias: the norm follows), BatchNorm, ReLU."""
    return ConvBNReLU(
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
        body = self.body
        if (len(body) == 5 and _norm_takes_act(body[1]) and type(body[2]) is ReLU and _norm_takes_act(body[4])
                and type(self.relu) is ReLU):
            # The norms run the ReLUs and the shortcut's add in their own passes.
            h = body[1](body[0](x), relu=True)
            return body[4](body[3](h), residual=self.shortcut(x), relu=True)
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
