"""ToDense module."""
from typing import Optional, Sequence

from torch import nn

from ...tensor import SparseTensor
from .. import functional as F


class ToDense(nn.Module):
    """SparseTensor -> dense ``[B, C, X, Y, Z]``; the grid is ``spatial_range`` if given, else the
    tensor's own range, else ``max(coord) + 1``."""

    def __init__(self, spatial_range: Optional[Sequence[int]] = None, batch_size: Optional[int] = None):
        super().__init__()
        self.spatial_range = None if spatial_range is None else tuple(spatial_range)
        self.batch_size = batch_size

    def forward(self, input: SparseTensor):
        return F.to_dense(input, self.spatial_range, self.batch_size)
