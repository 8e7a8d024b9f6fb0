"""torchsparse 2.1's sparse ResNet backbones: stages of (blocks, width, kernel, stride)."""
from torch import nn

from .modules import SparseConvBlock, SparseResBlock


class SparseResNet(nn.ModuleList):
    """Stage i: a (possibly strided) conv block, then residual blocks; returns every stage's output."""

    def __init__(self, blocks, *, in_channels: int = 4, width_multiplier: float = 1.0):
        super().__init__()
        self.blocks, self.in_channels, self.width_multiplier = blocks, in_channels, width_multiplier
        for num_blocks, out_channels, kernel_size, stride in blocks:
            out_channels = int(out_channels * width_multiplier)
            stage = [SparseConvBlock(in_channels, out_channels, kernel_size, stride=stride)]
            stage += [SparseResBlock(out_channels, out_channels, kernel_size) for _ in range(num_blocks - 1)]
            self.append(nn.Sequential(*stage))
            in_channels = out_channels

    def forward(self, x):
        outputs = []
        for stage in self:
            x = stage(x)
            outputs.append(x)
        return outputs


class SparseResNet21D(SparseResNet):
    def __init__(self, **kwargs):
        super().__init__(blocks=[(3, 16, 3, 1), (3, 32, 3, 2), (3, 64, 3, 2), (3, 128, 3, 2),
                                 (1, 128, (1, 3, 1), (1, 2, 1))], **kwargs)
