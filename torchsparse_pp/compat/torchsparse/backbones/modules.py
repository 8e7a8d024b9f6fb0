"""torchsparse 2.1's backbone blocks: conv-BN-ReLU, its transposed form and the residual block."""
from torch import nn

from .. import nn as spnn


class SparseConvBlock(nn.Sequential):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, dilation=1):
        super().__init__(spnn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation),
                         spnn.BatchNorm(out_channels), spnn.ReLU(True))


class SparseConvTransposeBlock(nn.Sequential):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, dilation=1):
        super().__init__(spnn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation,
                                     transposed=True),
                         spnn.BatchNorm(out_channels), spnn.ReLU(True))


class SparseResBlock(nn.Module):
    """Two convs (the first may stride) with BN, plus a 1x1 conv + BN shortcut when the width or
    resolution changes; ReLU after the sum."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, dilation=1):
        super().__init__()
        self.main = nn.Sequential(
            spnn.Conv3d(in_channels, out_channels, kernel_size, dilation=dilation, stride=stride),
            spnn.BatchNorm(out_channels), spnn.ReLU(True),
            spnn.Conv3d(out_channels, out_channels, kernel_size, dilation=dilation), spnn.BatchNorm(out_channels))
        strided = stride != 1 and stride != (1, 1, 1) and stride != [1, 1, 1]
        if in_channels != out_channels or strided:
            self.shortcut = nn.Sequential(spnn.Conv3d(in_channels, out_channels, 1, stride=stride),
                                          spnn.BatchNorm(out_channels))
        else:
            self.shortcut = nn.Identity()
        self.relu = spnn.ReLU(True)

    def forward(self, x):
        return self.relu(self.main(x) + self.shortcut(x))
