"""Pooling modules."""
from typing import Optional

from torch import nn

from ...kmap import DOWNSAMPLE_MODES, ConvGeometry
from ...kmap.geometry import IntOr3
from ...tensor import SparseTensor
from .. import functional as F


class _LocalPool(nn.Module):
    def __init__(self, kernel_size: IntOr3, stride: Optional[IntOr3] = None, dilation: IntOr3 = 1,
                 padding: Optional[IntOr3] = None, downsample_mode: str = "spconv"):
        super().__init__()
        # Validate once here so a bad geometry fails at construction, not at the first batch.
        g = ConvGeometry.make(kernel_size, kernel_size if stride is None else stride, dilation, padding)
        self.kernel_size, self.stride, self.dilation, self.padding = g.kernel_size, g.stride, g.dilation, g.padding
        if downsample_mode not in DOWNSAMPLE_MODES:
            raise ValueError(f"downsample_mode must be one of {DOWNSAMPLE_MODES}, got {downsample_mode!r}")
        self.downsample_mode = downsample_mode

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, dilation={self.dilation}, "
                f"padding={self.padding}")


class MaxPool3d(_LocalPool):
    """Per-channel max over each output's kernel neighbourhood (stride defaults to kernel_size)."""

    def forward(self, input: SparseTensor) -> SparseTensor:
        return F.max_pool3d(input, self.kernel_size, self.stride, self.dilation, self.padding,
                            self.downsample_mode)


class AvgPool3d(_LocalPool):
    """Mean over the inputs present in each output's kernel neighbourhood."""

    def forward(self, input: SparseTensor) -> SparseTensor:
        return F.avg_pool3d(input, self.kernel_size, self.stride, self.dilation, self.padding,
                            self.downsample_mode)


class GlobalAvgPool(nn.Module):
    """``[B, C]`` mean over each sample's points."""

    def forward(self, input: SparseTensor):
        return F.global_avg_pool(input)


class GlobalMaxPool(nn.Module):
    """``[B, C]`` max over each sample's points."""

    def forward(self, input: SparseTensor):
        return F.global_max_pool(input)
