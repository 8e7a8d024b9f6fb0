"""torchsparse 2.1's ``to_dense``: channels-last dense tensor of sparse features."""
from typing import Tuple

import torch


def to_dense(feats: torch.Tensor, coords: torch.Tensor, spatial_range: Tuple[int, ...]) -> torch.Tensor:
    """``[*spatial_range, C]`` with ``feats`` at ``coords`` (``spatial_range`` is (batch, x, y, z)
    for (batch, x, y, z) coordinates) and zeros elsewhere; differentiable, on any device."""
    spatial_range = tuple(int(v) for v in spatial_range)
    if coords.dim() != 2 or coords.shape[1] != len(spatial_range):
        raise ValueError(f"coords must be [N, {len(spatial_range)}] for spatial_range {spatial_range}, "
                         f"got {tuple(coords.shape)}")
    c = coords.long()
    if c.shape[0] and (bool((c < 0).any()) or bool((c >= torch.tensor(spatial_range, device=c.device)).any())):
        raise ValueError(f"coords lie outside spatial_range {spatial_range}")
    out = feats.new_zeros(spatial_range + (feats.shape[1],))
    return out.index_put(tuple(c.t()), feats)
