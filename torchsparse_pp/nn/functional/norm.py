"""Normalisation over the points of each sample (GroupNorm / InstanceNorm semantics)."""
from typing import Optional

import torch


def sample_group_norm(feats: torch.Tensor, batch: torch.Tensor, batch_size: int, num_groups: int,
                      weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """Normalises each (sample, channel group) over that sample's points, like
    torch.nn.functional.group_norm on one dense sample. Statistics are computed in float32 or
    better, whatever the feature dtype."""
    n, channels = feats.shape
    if channels % num_groups:
        raise ValueError(f"{channels} channels cannot be split into {num_groups} groups")
    compute = torch.promote_types(feats.dtype, torch.float32)
    x = feats.to(compute).view(n, num_groups, channels // num_groups)
    counts = torch.bincount(batch, minlength=batch_size).to(compute).clamp(min=1) * (channels // num_groups)
    mean = x.new_zeros(batch_size, num_groups).index_add(0, batch, x.sum(-1)) / counts[:, None]
    centred = x - mean[batch][:, :, None]
    var = x.new_zeros(batch_size, num_groups).index_add(0, batch, centred.square().sum(-1)) / counts[:, None]
    out = (centred * torch.rsqrt(var[batch][:, :, None] + eps)).view(n, channels)
    if weight is not None:
        out = out * weight.to(compute) + bias.to(compute)
    return out.to(feats.dtype)
