"""torchsparse 2.1's sparse residual U-Net: stem, 4 encoder and 4 decoder stages."""
from typing import List

from torch import nn

from ..operators import cat
from .. import nn as spnn
from .modules import SparseConvBlock, SparseConvTransposeBlock, SparseResBlock


class SparseResUNet(nn.Module):
    """Returns the stem output, every encoder output and every decoder output."""

    def __init__(self, stem_channels: int, encoder_channels: List[int], decoder_channels: List[int], *,
                 in_channels: int = 4, width_multiplier: float = 1.0):
        super().__init__()
        self.stem_channels, self.encoder_channels, self.decoder_channels = stem_channels, encoder_channels, decoder_channels
        self.in_channels, self.width_multiplier = in_channels, width_multiplier
        cs = [int(width_multiplier * c) for c in [stem_channels] + list(encoder_channels) + list(decoder_channels)]
        self.stem = nn.Sequential(spnn.Conv3d(in_channels, cs[0], 3), spnn.BatchNorm(cs[0]), spnn.ReLU(True),
                                  spnn.Conv3d(cs[0], cs[0], 3), spnn.BatchNorm(cs[0]), spnn.ReLU(True))
        self.encoders = nn.ModuleList(
            nn.Sequential(SparseConvBlock(cs[k], cs[k], 2, stride=2), SparseResBlock(cs[k], cs[k + 1], 3),
                          SparseResBlock(cs[k + 1], cs[k + 1], 3)) for k in range(4))
        self.decoders = nn.ModuleList(
            nn.ModuleDict({
                "upsample": SparseConvTransposeBlock(cs[k + 4], cs[k + 5], 2, stride=2),
                "fuse": nn.Sequential(SparseResBlock(cs[k + 5] + cs[3 - k], cs[k + 5], 3),
                                      SparseResBlock(cs[k + 5], cs[k + 5], 3)),
            }) for k in range(4))

    def _unet_forward(self, x, encoders, decoders):
        if not encoders and not decoders:
            return [x]
        outputs = self._unet_forward(encoders[0](x), encoders[1:], decoders[:-1])
        up = decoders[-1]["upsample"](outputs[-1])
        return [x] + outputs + [decoders[-1]["fuse"](cat([up, x]))]

    def forward(self, x):
        return self._unet_forward(self.stem(x), self.encoders, self.decoders)


class SparseResUNet42(SparseResUNet):
    def __init__(self, **kwargs):
        super().__init__(stem_channels=32, encoder_channels=[32, 64, 128, 256],
                         decoder_channels=[256, 128, 96, 96], **kwargs)
