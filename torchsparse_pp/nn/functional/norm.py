"""Normalisation over the points of each sample (GroupNorm / InstanceNorm semantics)."""
from typing import Optional

import torch

from ... import ops


def sample_group_norm(feats: torch.Tensor, batch: torch.Tensor, batch_size: Optional[int], num_groups: int,
                      weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """Normalises each (sample, channel group) over that sample's points, like
    torch.nn.functional.group_norm on one dense sample. Statistics are computed in float32 or
    better, whatever the feature dtype. ``batch`` holds each row's sample index; ``batch_size``,
    when given, is the number of samples, and a larger index is an error (None: the samples are
    0 .. max(batch); nothing is read to the host then). Runs the custom op
    ``torchsparse_pp::sample_group_norm``."""
    if feats.shape[1] % num_groups:
        raise ValueError(f"{feats.shape[1]} channels cannot be split into {num_groups} groups")
    batch = batch.long()
    if batch_size is not None and batch.numel() and int(batch.max()) >= batch_size:
        raise ValueError(f"batch indices reach {int(batch.max())}, beyond batch_size {batch_size}")
    return ops.sample_group_norm(feats, batch, num_groups, weight, bias, eps)
