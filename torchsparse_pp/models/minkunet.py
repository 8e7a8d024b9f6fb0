"""MinkUNet: the sparse U-Net of the SemanticKITTI / SPVNAS model zoo."""
from typing import List

import torch
from torch import nn

from ..operators import cat
from ..tensor import SparseTensor
from ..utils.cpu_bf16 import dense_autocast
from .blocks import ResidualBlock, conv_bn_relu

BASE_CHANNELS = (32, 32, 64, 128, 256, 256, 128, 96, 96)


def minkunet_channels(cr: float) -> List[int]:
    """The nine stage widths ``BASE_CHANNELS x cr``, rounded to int."""
    if not (isinstance(cr, (int, float)) and not isinstance(cr, bool) and cr > 0):
        raise ValueError(f"cr (channel ratio) must be a positive number, got {cr!r}")
    cs = [int(round(c * cr)) for c in BASE_CHANNELS]
    if min(cs) < 1:
        raise ValueError(f"cr={cr} leaves a stage without channels: {cs}")
    return cs


class MinkUNet(nn.Module):
    """Stem (two 3^3 convs), 4 encoder stages (k2 s2 conv, 2 residual blocks), 4 decoder stages
    (k2 s2 transposed conv back onto the skip's coordinates, concatenation, 2 residual blocks)
    and a linear classifier.

    ``forward`` takes a SparseTensor with ``in_channels`` features per voxel and returns logits
    ``[N, num_classes]`` in the input's row order.
    """

    def __init__(self, in_channels: int = 4, num_classes: int = 19, cr: float = 1.0):
        super().__init__()
        if in_channels < 1 or num_classes < 1:
            raise ValueError(f"in_channels and num_classes must be positive, got {in_channels}, {num_classes}")
        cs = minkunet_channels(cr)
        self.channels = cs
        self.in_channels, self.num_classes = in_channels, num_classes
        self.stem = nn.Sequential(conv_bn_relu(in_channels, cs[0], 3), conv_bn_relu(cs[0], cs[0], 3))
        # Encoder stage i halves the resolution at width cs[i], then widens to cs[i + 1].
        self.encoder = nn.ModuleList(
            nn.Sequential(conv_bn_relu(cs[i], cs[i], 2, stride=2),
                          ResidualBlock(cs[i], cs[i + 1]), ResidualBlock(cs[i + 1], cs[i + 1]))
            for i in range(4))
        # Decoder stage i: up from cs[4 + i] to cs[5 + i], joined with the encoder output of width cs[3 - i].
        self.up = nn.ModuleList(conv_bn_relu(cs[4 + i], cs[5 + i], 2, stride=2, transposed=True)
                                for i in range(4))
        self.decoder = nn.ModuleList(
            nn.Sequential(ResidualBlock(cs[5 + i] + cs[3 - i], cs[5 + i]), ResidualBlock(cs[5 + i], cs[5 + i]))
            for i in range(4))
        self.classifier = nn.Linear(cs[8], num_classes)

    def forward(self, x: SparseTensor) -> torch.Tensor:
        if not isinstance(x, SparseTensor):
            raise TypeError(f"MinkUNet expects a SparseTensor, got {type(x).__name__}")
        if x.num_channels != self.in_channels:
            raise ValueError(f"MinkUNet was built for {self.in_channels} input channels, got {x.num_channels}")
        skips = [self.stem(x)]
        for stage in self.encoder:
            skips.append(stage(skips[-1]))
        y = skips.pop()
        for up, decoder in zip(self.up, self.decoder):
            # The transposed conv lands on the coordinates its strided conv came from: the skip's.
            y = decoder(cat([up(y), skips.pop()]))
        return dense_autocast(self.classifier, y.F)
