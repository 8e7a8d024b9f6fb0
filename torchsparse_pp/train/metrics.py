"""Evaluation metrics: confusion matrix, per-class IoU and mIoU for segmentation; BEV average
precision at a fixed rotated-IoU threshold for detection."""
from typing import Dict, List, Sequence

import torch

from ..models.centerpoint.iou import rotated_iou_matrix

__all__ = ["confusion_matrix", "iou_from_confusion", "mean_iou", "average_precision", "bev_map"]

IGNORE_INDEX = 255


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int,
                     ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """int64 [C, C]: entry (t, p) counts points of true class t predicted as p; targets equal to
    ``ignore_index`` are left out. Any other target or prediction outside [0, C) is an error."""
    pred, target = pred.reshape(-1).long(), target.reshape(-1).long()
    if pred.shape != target.shape:
        raise ValueError(f"pred and target differ in size: {pred.numel()} vs {target.numel()}")
    keep = target != ignore_index
    pred, target = pred[keep], target[keep]
    for name, values in (("target", target), ("prediction", pred)):
        if values.numel() and (int(values.min()) < 0 or int(values.max()) >= num_classes):
            raise ValueError(f"{name} classes must lie in [0, {num_classes}) (or be {ignore_index} for targets), "
                             f"got [{int(values.min())}, {int(values.max())}]")
    return torch.bincount(target * num_classes + pred, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def iou_from_confusion(confusion: torch.Tensor) -> torch.Tensor:
    """float64 [C]: TP / (TP + FP + FN) per class; NaN for a class absent from targets and predictions."""
    confusion = confusion.double()
    tp = confusion.diag()
    union = confusion.sum(0) + confusion.sum(1) - tp
    return torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))


def mean_iou(confusion: torch.Tensor) -> float:
    """Mean IoU over the classes that occur (in targets or predictions)."""
    iou = iou_from_confusion(confusion)
    present = ~torch.isnan(iou)
    return float(iou[present].mean()) if bool(present.any()) else float("nan")


def average_precision(scores: torch.Tensor, matched: torch.Tensor, num_ground_truth: int) -> float:
    """Area under the precision-recall curve (precision made monotone, all-point interpolation)
    of detections with ``scores`` and true-positive flags ``matched``."""
    if num_ground_truth == 0:
        return float("nan")
    if scores.numel() == 0:
        return 0.0
    order = scores.argsort(descending=True)
    tp = matched[order].double()
    tp_cum, fp_cum = tp.cumsum(0), (1 - tp).cumsum(0)
    recall = tp_cum / num_ground_truth
    precision = tp_cum / (tp_cum + fp_cum)
    # Monotone envelope from the right, then sum precision over recall steps.
    precision = precision.flip(0).cummax(0).values.flip(0)
    steps = torch.cat([recall.new_zeros(1), recall]).diff()
    return float((steps * precision).sum())


def bev_map(predictions: Sequence[Dict[str, torch.Tensor]], ground_truth: Sequence[Dict[str, torch.Tensor]],
            num_classes: int, iou_threshold: float = 0.5) -> Dict[str, object]:
    """BEV mAP: per class, detections of all samples in score order are true positives when their
    rotated BEV IoU with a not yet matched ground-truth box of the class is >= iou_threshold
    (greedy, best-overlap match). Returns ``ap`` (per class, NaN without ground truth) and ``map``
    (mean over classes with ground truth)."""
    if len(predictions) != len(ground_truth):
        raise ValueError(f"{len(predictions)} prediction sets for {len(ground_truth)} samples")
    ap: List[float] = []
    for c in range(num_classes):
        scores, flags, count = [], [], 0
        for pred, gt in zip(predictions, ground_truth):
            p_mask, g_mask = pred["labels"] == c, gt["labels"] == c
            p_boxes, p_scores = pred["boxes"][p_mask].double(), pred["scores"][p_mask].double()
            g_boxes = gt["boxes"][g_mask].double()
            count += len(g_boxes)
            order = p_scores.argsort(descending=True)
            p_boxes, p_scores = p_boxes[order], p_scores[order]
            hit = torch.zeros(len(p_boxes), dtype=torch.bool)
            if len(p_boxes) and len(g_boxes):
                iou = rotated_iou_matrix(p_boxes, g_boxes)
                taken = torch.zeros(len(g_boxes), dtype=torch.bool)
                for i in range(len(p_boxes)):
                    candidates = iou[i].masked_fill(taken, -1.0)
                    best = int(candidates.argmax())
                    if float(candidates[best]) >= iou_threshold:
                        taken[best] = True
                        hit[i] = True
            scores.append(p_scores)
            flags.append(hit)
        ap.append(average_precision(torch.cat(scores), torch.cat(flags), count))
    values = torch.tensor(ap, dtype=torch.float64)
    present = ~torch.isnan(values)
    return {"ap": ap, "map": float(values[present].mean()) if bool(present.any()) else float("nan")}
