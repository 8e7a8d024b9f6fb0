"""CenterPoint losses: focal loss on the heatmap, weighted L1 on the regressions at centres."""
from typing import Dict

import torch

from .head import regression_branches
from .targets import CenterTargets

PROBABILITY_CLAMP = 1e-4  # keeps log() finite for saturated logits


def focal_heatmap_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """CenterNet's penalty-reduced focal loss (alpha 2, beta 4), divided by the number of
    centres (cells where the target is 1)."""
    p = torch.sigmoid(logits.float()).clamp(PROBABILITY_CLAMP, 1 - PROBABILITY_CLAMP)
    positive = target.eq(1).float()
    pos_loss = torch.log(p) * (1 - p) ** 2 * positive
    neg_loss = torch.log(1 - p) * p ** 2 * (1 - target) ** 4 * (1 - positive)
    return -(pos_loss.sum() + neg_loss.sum()) / positive.sum().clamp(min=1)


def gather_regression(outputs: Dict[str, torch.Tensor], index: torch.Tensor) -> torch.Tensor:
    """The predicted regression vector at each index: [B, M, 8] (10 with a velocity branch) from
    the [B, c, Y, X] branch maps."""
    maps = torch.cat([outputs[name].float() for name, _ in regression_branches("vel" in outputs)], dim=1)
    flat = maps.flatten(2)  # [B, 8, Y*X]
    picked = flat.gather(2, index[:, None, :].expand(-1, flat.shape[1], -1))
    return picked.transpose(1, 2)


def regression_loss(outputs: Dict[str, torch.Tensor], targets: CenterTargets,
                    code_weights: torch.Tensor) -> torch.Tensor:
    """Weighted L1 over the objects' regressions, divided by the number of objects."""
    pred = gather_regression(outputs, targets.index)
    mask = targets.mask[..., None].float()
    l1 = (pred - targets.regression).abs() * mask * code_weights
    return l1.sum() / mask.sum().clamp(min=1)
