"""torchsparse 2.1's global pooling modules and the crop module."""
from torch import nn

from .. import functional as F


class GlobalAvgPool(nn.Module):
    def forward(self, input):
        return F.global_avg_pool(input)


class GlobalMaxPool(nn.Module):
    def forward(self, input):
        return F.global_max_pool(input)


class SparseCrop(nn.Module):
    def __init__(self, coords_min=None, coords_max=None):
        super().__init__()
        self.coords_min, self.coords_max = coords_min, coords_max

    def forward(self, input):
        return F.spcrop(input, self.coords_min, self.coords_max)
