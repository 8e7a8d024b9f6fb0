"""torchsparse 2.1's feature-wise modules: norms and activations on ``feats``."""
import torch
from torch import nn

from ...tensor import SparseTensor
from ..utils import fapply


class _OnFeats:
    """A torch module applied to a SparseTensor's features (2.1's fapply)."""

    def forward(self, input: SparseTensor) -> SparseTensor:
        return fapply(input, super().forward)


class ReLU(_OnFeats, nn.ReLU):
    pass


class LeakyReLU(_OnFeats, nn.LeakyReLU):
    pass


class SiLU(_OnFeats, nn.SiLU):
    pass


class BatchNorm(_OnFeats, nn.BatchNorm1d):
    pass


class InstanceNorm(_OnFeats, nn.InstanceNorm1d):
    """As in 2.1: torch's InstanceNorm1d over the ``[N, C]`` features (all points together)."""


class GroupNorm(nn.GroupNorm):
    """GroupNorm over the points of each sample separately."""

    def forward(self, input: SparseTensor) -> SparseTensor:
        feats, batch = input.feats, input.coords[:, 0]
        out = torch.zeros_like(feats)
        for b in range(int(batch.max().item()) + 1):
            rows = batch == b
            sample = feats[rows].t().reshape(1, feats.shape[1], -1)
            out[rows] = super().forward(sample).reshape(feats.shape[1], -1).t()
        return fapply(input, lambda _: out)
