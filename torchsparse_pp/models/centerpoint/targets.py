"""Training targets of the CenterHead: gaussian class heatmaps and regressions at box centres.

BEV maps are [Y, X] (rows y, columns x). A box centre at (x, y) metres lies at the continuous
cell position ((x - x_min) / cell_x, (y - y_min) / cell_y) with cell = voxel size x BEV stride;
its cell is the floor of that, and the offset target is the remainder.
"""
import math
from dataclasses import dataclass
from typing import Sequence, Tuple

import torch

from .config import CenterPointConfig

NUM_REGRESSION = 8  # offset x, y; z; log dx, dy, dz; sin yaw, cos yaw (then vx, vy with velocity)


def gaussian_radius(length: float, width: float, min_overlap: float) -> float:
    """CornerNet's radius (in cells) within which a shifted box of this size keeps IoU
    >= min_overlap with the true one: the smallest root of its three corner cases. As in
    CenterNet/CenterPoint, the second and third roots are halved rather than divided by 2a;
    trained CenterPoint models use this variant."""
    total, area, o = length + width, length * width, min_overlap
    r1 = (total + math.sqrt(total ** 2 - 4 * area * (1 - o) / (1 + o))) / 2
    r2 = (2 * total + math.sqrt((2 * total) ** 2 - 16 * (1 - o) * area)) / 2
    r3 = (-2 * o * total + math.sqrt((2 * o * total) ** 2 - 16 * o * (o - 1) * area)) / 2
    return min(r1, r2, r3)


def draw_gaussian(heatmap: torch.Tensor, cx: int, cy: int, radius: int) -> None:
    """In place: heatmap[y, x] = max(heatmap, exp(-((x-cx)^2 + (y-cy)^2) / (2 sigma^2))) for
    |x - cx|, |y - cy| <= radius, sigma = (2 radius + 1) / 6; the peak at (cx, cy) is 1."""
    rows, cols = heatmap.shape
    sigma = (2 * radius + 1) / 6
    x0, x1 = max(cx - radius, 0), min(cx + radius + 1, cols)
    y0, y1 = max(cy - radius, 0), min(cy + radius + 1, rows)
    if x0 >= x1 or y0 >= y1:
        return
    xs = torch.arange(x0, x1, device=heatmap.device, dtype=heatmap.dtype) - cx
    ys = torch.arange(y0, y1, device=heatmap.device, dtype=heatmap.dtype) - cy
    g = torch.exp(-(ys[:, None] ** 2 + xs[None, :] ** 2) / (2 * sigma ** 2))
    window = heatmap[y0:y1, x0:x1]
    torch.maximum(window, g, out=window)


@dataclass
class CenterTargets:
    heatmap: torch.Tensor      # [B, num_classes, Y, X] float32, 1 at each object's centre cell
    regression: torch.Tensor   # [B, M, 8] float32 ([B, M, 10] with velocity)
    index: torch.Tensor        # [B, M] int64, y * X + x of the centre cell
    mask: torch.Tensor         # [B, M] bool: which of the M slots hold an object


def check_boxes(boxes: torch.Tensor, labels: torch.Tensor, num_classes: int, sample: int, box_size: int = 7) -> None:
    if not isinstance(boxes, torch.Tensor) or boxes.dim() != 2 or boxes.shape[1] != box_size:
        what = "x, y, z, dx, dy, dz, yaw" + (", vx, vy" if box_size == 9 else "")
        raise ValueError(f"sample {sample}: boxes must be a [M, {box_size}] tensor ({what}), got "
                         f"{list(boxes.shape) if isinstance(boxes, torch.Tensor) else type(boxes).__name__}")
    if not isinstance(labels, torch.Tensor) or labels.shape != (boxes.shape[0],) or labels.is_floating_point():
        raise ValueError(f"sample {sample}: labels must be an integer [{boxes.shape[0]}] tensor")
    if boxes.shape[0] and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"sample {sample}: labels must lie in [0, {num_classes}), got "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    if not bool(torch.isfinite(boxes).all()):
        raise ValueError(f"sample {sample}: boxes contain NaN or Inf")
    if bool((boxes[:, 3:6] <= 0).any()):
        raise ValueError(f"sample {sample}: box sizes (dx, dy, dz) must be positive")


def build_targets(boxes_list: Sequence[torch.Tensor], labels_list: Sequence[torch.Tensor],
                  config: CenterPointConfig, map_size: Tuple[int, int], device: torch.device) -> CenterTargets:
    """Targets for a batch; ``map_size`` is the head's (Y, X). Boxes whose centre falls outside
    the map are left out."""
    if len(boxes_list) != len(labels_list):
        raise ValueError(f"got {len(boxes_list)} box sets but {len(labels_list)} label sets")
    rows, cols = map_size
    cell_x = config.voxel_size[0] * config.bev_stride[0]
    cell_y = config.voxel_size[1] * config.bev_stride[1]
    x_min, y_min = config.point_cloud_range[0], config.point_cloud_range[1]
    batch = len(boxes_list)
    slots = max([len(b) for b in boxes_list] + [1])
    heatmap = torch.zeros(batch, config.num_classes, rows, cols, device=device)
    regression = torch.zeros(batch, slots, config.regression_channels, device=device)
    index = torch.zeros(batch, slots, dtype=torch.long, device=device)
    mask = torch.zeros(batch, slots, dtype=torch.bool, device=device)
    for b, (boxes, labels) in enumerate(zip(boxes_list, labels_list)):
        check_boxes(boxes, labels, config.num_classes, b, config.box_size)
        boxes = boxes.detach().to(device=device, dtype=torch.float32)
        for m, (box, label) in enumerate(zip(boxes.tolist(), labels.tolist())):
            x, y, z, dx, dy, dz, yaw = box[:7]
            fx, fy = (x - x_min) / cell_x, (y - y_min) / cell_y
            ix, iy = math.floor(fx), math.floor(fy)
            if not (0 <= ix < cols and 0 <= iy < rows):
                continue
            radius = gaussian_radius(dx / cell_x, dy / cell_y, config.gaussian_overlap)
            draw_gaussian(heatmap[b, label], ix, iy, max(config.min_radius, int(radius)))
            regression[b, m] = torch.tensor([fx - ix, fy - iy, z, math.log(dx), math.log(dy), math.log(dz),
                                             math.sin(yaw), math.cos(yaw)] + box[7:], device=device)
            index[b, m] = iy * cols + ix
            mask[b, m] = True
    return CenterTargets(heatmap, regression, index, mask)
