"""Differentiable point <-> voxel primitives in plain torch ops: scatter-mean of point features
into voxels, and weighted gathers of voxel features at points (trilinear or nearest)."""
from typing import Tuple

import torch

# The 8 corners of a unit cell, z fastest: corner k = (k >> 2 & 1, k >> 1 & 1, k & 1).
CORNERS = torch.tensor([[(k >> 2) & 1, (k >> 1) & 1, k & 1] for k in range(8)])


def scatter_mean(feats: torch.Tensor, rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``out[r]`` = mean of ``feats[i]`` over the i with ``rows[i] == r`` (0 where none; rows
    of -1 are dropped)."""
    keep = rows >= 0
    rows, feats = rows[keep], feats[keep]
    total = feats.new_zeros(num_rows, feats.shape[1]).index_add(0, rows, feats)
    count = torch.zeros(num_rows, dtype=feats.dtype, device=feats.device).index_add(
        0, rows, torch.ones_like(rows, dtype=feats.dtype))
    return total / count.clamp(min=1).unsqueeze(1)


def gather_weighted(feats: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``out[i]`` = sum over k of ``weights[i, k] * feats[rows[i, k]]``, skipping rows of -1."""
    present = rows >= 0
    picked = feats[rows.clamp(min=0)] * (weights * present).unsqueeze(-1).to(feats.dtype)
    return picked.sum(1)


def trilinear_corners(points: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """For points ``[N, 3]`` in voxel units: the integer corners ``[N, 8, 3]`` of their cell
    (``floor`` + CORNERS) and the trilinear weights ``[N, 8]`` (products of 1 - |p - corner|)."""
    base = torch.floor(points)
    corners = base.unsqueeze(1) + CORNERS.to(points.device, points.dtype)
    weights = (1 - (points.unsqueeze(1) - corners).abs()).prod(-1)
    return corners.long(), weights
