"""FusedConv3d: a Conv3d with the BatchNorm after it folded into its weight and bias, and its
ReLU (and a residual block's sum) run as the conv's epilogue. Made by torchsparse_pp.nn.fuse
for inference; a fused layer refuses training mode."""
from typing import Optional

from torch import nn

from ...tensor import SparseTensor
from .. import functional as F
from ..functional.conv import conv3d_with_geometry
from ..functional.epilogue import Epilogue
from ..functional.norm import fold_batchnorm
from .conv import Conv3d


class FusedConv3d(nn.Module):
    """Inference form of Conv3d [+ BatchNorm] [+ ReLU]; ``forward(x, residual)`` also adds a
    residual (a SparseTensor on the output's coordinates) before the ReLU."""

    def __init__(self, conv: Conv3d, norm: Optional[nn.modules.batchnorm._BatchNorm] = None, relu: bool = False):
        super().__init__()
        if not isinstance(conv, Conv3d):
            raise TypeError(f"FusedConv3d fuses a Conv3d, got {type(conv).__name__}")
        self.geometry = conv.geometry
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.transposed, self.generative, self.downsample_mode = conv.transposed, conv.generative, conv.downsample_mode
        self.config = conv.config
        self.relu = relu
        if norm is not None:
            if norm.num_features != conv.out_channels:
                raise ValueError(f"BatchNorm of {norm.num_features} channels after a conv with {conv.out_channels}")
            kernel, bias = fold_batchnorm(conv.kernel, conv.bias, norm)
        else:
            kernel = conv.kernel.detach().clone()
            bias = None if conv.bias is None else conv.bias.detach().clone()
        self.register_buffer("kernel", kernel)
        self.register_buffer("bias", bias)

    def forward(self, input: SparseTensor, residual: Optional[SparseTensor] = None) -> SparseTensor:
        if residual is not None:
            if not isinstance(residual, SparseTensor):
                raise TypeError(f"residual must be a SparseTensor, got {type(residual).__name__}")
            if residual.C is not input.C or not self.geometry.is_unit_stride or self.transposed:
                raise ValueError("a residual is added on the output's coordinates: it needs a stride-1 conv whose "
                                 "input and residual share one coordinate tensor")
        epilogue = None
        if residual is not None or self.relu:
            epilogue = Epilogue(None if residual is None else residual.F, self.relu)
        return conv3d_with_geometry(input, self.kernel, self.geometry, self.bias, self.transposed, self.generative,
                                    self.downsample_mode, self.config, epilogue=epilogue)

    def train(self, mode: bool = True):
        if mode:
            raise RuntimeError("a fused model (torchsparse_pp.nn.fuse) is for inference: train the original model "
                               "and fuse it again")
        return super().train(False)

    def extra_repr(self) -> str:
        g = self.geometry
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={g.kernel_size}, stride={g.stride}, "
                f"padding={g.padding}, bias={self.bias is not None}, relu={self.relu}")
        return text + (", transposed=True" if self.transposed else "")
