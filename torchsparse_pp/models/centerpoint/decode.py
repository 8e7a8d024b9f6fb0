"""Box decoding: heatmap peaks -> boxes (x, y, z, dx, dy, dz, yaw), scores and labels."""
from typing import Dict, List

import torch
import torch.nn.functional as TF

from .config import CenterPointConfig
from .loss import gather_regression
from .nms import rotated_nms

LOG_SIZE_LIMIT = 10.0  # exp() of an untrained size branch must stay finite


def decode_boxes(outputs: Dict[str, torch.Tensor], config: CenterPointConfig) -> List[Dict[str, torch.Tensor]]:
    """Per sample: the top ``pre_nms_top_k`` local maxima (3x3) of the class heatmaps, decoded,
    those above ``score_threshold`` kept, class-aware rotated NMS, at most ``max_boxes``.

    Returns one dict per sample: ``boxes`` [M, 7] ([M, 9] with a velocity branch: vx, vy last),
    ``scores`` [M], ``labels`` [M] (int64), best score first.
    """
    heat = torch.sigmoid(outputs["heatmap"].float())
    batch, classes, rows, cols = heat.shape
    peaks = heat * (TF.max_pool2d(heat, 3, stride=1, padding=1) == heat)
    k = min(config.pre_nms_top_k, classes * rows * cols)
    scores, flat = peaks.flatten(1).topk(k, dim=1)
    labels = flat // (rows * cols)
    cell = flat % (rows * cols)
    iy, ix = (cell // cols).float(), (cell % cols).float()
    reg = gather_regression(outputs, cell)  # [B, k, 8]
    cell_x = config.voxel_size[0] * config.bev_stride[0]
    cell_y = config.voxel_size[1] * config.bev_stride[1]
    x = (ix + reg[..., 0]) * cell_x + config.point_cloud_range[0]
    y = (iy + reg[..., 1]) * cell_y + config.point_cloud_range[1]
    sizes = torch.exp(reg[..., 3:6].clamp(-LOG_SIZE_LIMIT, LOG_SIZE_LIMIT))
    yaw = torch.atan2(reg[..., 6], reg[..., 7])
    boxes = torch.cat([x[..., None], y[..., None], reg[..., 2:3], sizes, yaw[..., None], reg[..., 8:10]], -1)

    results = []
    for b in range(batch):
        keep = scores[b] > config.score_threshold
        bx, sc, lb = boxes[b][keep], scores[b][keep], labels[b][keep]
        kept = rotated_nms(bx, sc, lb, config.nms_iou_threshold)[:config.max_boxes]
        results.append({"boxes": bx[kept], "scores": sc[kept], "labels": lb[kept]})
    return results
