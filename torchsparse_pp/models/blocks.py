"""Sparse building blocks shared by the models: Conv-BN-ReLU and the basic residual block."""
from typing import Optional

from torch import nn

from ..kmap.geometry import IntOr3
from ..nn import BatchNorm, Conv3d, FusedConv3d, ReLU, SyncBatchNorm, register_fuser
from ..nn.fusion import fuse_module
from ..tensor import SparseTensor


def _conv_norm_relu(conv: nn.Module, norm: nn.Module, relu: nn.Module) -> bool:
    """Whether (conv, norm, relu) are our Conv3d, BatchNorm and ReLU, whose conv takes the norm,
    a residual and the ReLU (folded into its kernel and epilogue in inference, else run in the
    norm's pass); subclasses and other modules are called one by one."""
    return type(conv) is Conv3d and type(norm) in (BatchNorm, SyncBatchNorm) and type(relu) is ReLU


class ConvBNReLU(nn.Sequential):
    """Sparse conv (no bias: the norm follows), BatchNorm, ReLU: an nn.Sequential (same modules and
    state_dict keys as one built by hand) that runs as one conv (Conv3d's norm= / relu=)."""

    def forward(self, x: SparseTensor) -> SparseTensor:
        if len(self) == 3 and _conv_norm_relu(*self):
            return self[0](x, norm=self[1], relu=True)
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
        if len(body) == 5 and _conv_norm_relu(*body[:3]) and _conv_norm_relu(body[3], body[4], self.relu):
            # Each conv takes its norm, and the second the shortcut's add and the block's ReLU.
            h = body[0](x, norm=body[1], relu=True)
            return body[3](h, norm=body[4], residual=self._shortcut(x), relu=True)
        return self.relu(self.body(x) + self.shortcut(x))

    def _shortcut(self, x: SparseTensor) -> SparseTensor:
        """The shortcut; a 1x1x1 conv and its BatchNorm run as one conv (folded in inference)."""
        s = self.shortcut
        if (type(s) is nn.Sequential and len(s) == 2 and type(s[0]) is Conv3d
                and type(s[1]) in (BatchNorm, SyncBatchNorm)):
            return s[0](x, norm=s[1])
        return s(x)


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
