"""CenterHead: a class heatmap and per-cell box regressions on the BEV map."""
import math
from typing import Dict

import torch
from torch import nn

# Regression branches and their channels, in the order of the regression target vector.
REGRESSION_BRANCHES = (("center", 2), ("center_z", 1), ("dim", 3), ("rot", 2))
VELOCITY_BRANCH = ("vel", 2)


def regression_branches(velocity: bool):
    """The regression branches of a head with or without the velocity branch (last)."""
    return REGRESSION_BRANCHES + ((VELOCITY_BRANCH,) if velocity else ())
HEATMAP_PRIOR = 0.1  # initial heatmap probability: keeps the focal loss sane at the start


class CenterHead(nn.Module):
    """A shared 3x3 conv, then per branch a 3x3 conv (BN, ReLU) and a 3x3 output conv:

    - ``heatmap`` [B, num_classes, Y, X]: logits of object centres per class;
    - ``center`` [B, 2, Y, X]: sub-cell offset of the centre (x, y), in cells;
    - ``center_z`` [B, 1, Y, X]: z of the box centre, metres;
    - ``dim`` [B, 3, Y, X]: log of (dx, dy, dz);
    - ``rot`` [B, 2, Y, X]: (sin yaw, cos yaw);
    - with ``velocity``, ``vel`` [B, 2, Y, X]: (vx, vy), m/s.
    """

    def __init__(self, in_channels: int, num_classes: int, head_channels: int = 64, velocity: bool = False):
        super().__init__()
        self.shared = nn.Sequential(nn.Conv2d(in_channels, head_channels, 3, padding=1, bias=False),
                                    nn.BatchNorm2d(head_channels), nn.ReLU(inplace=True))
        branches = (("heatmap", num_classes),) + regression_branches(velocity)
        self.branches = nn.ModuleDict({
            name: nn.Sequential(nn.Conv2d(head_channels, head_channels, 3, padding=1, bias=False),
                                nn.BatchNorm2d(head_channels), nn.ReLU(inplace=True),
                                nn.Conv2d(head_channels, channels, 3, padding=1))
            for name, channels in branches})
        nn.init.constant_(self.branches["heatmap"][-1].bias, math.log(HEATMAP_PRIOR / (1 - HEATMAP_PRIOR)))

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        x = self.shared(x)
        return {name: branch(x) for name, branch in self.branches.items()}
