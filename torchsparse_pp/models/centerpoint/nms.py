"""Class-aware greedy non-maximum suppression with rotated BEV IoU."""
import torch

from .iou import rotated_iou_pairs


def rotated_nms(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor,
                iou_threshold: float) -> torch.Tensor:
    """Indices of the kept boxes, best score first. A box is dropped when a better-scoring box of
    the same label overlaps it with BEV IoU > iou_threshold. Only pairs whose bounding circles
    meet are measured."""
    n = boxes.shape[0]
    if boxes.dim() != 2 or boxes.shape[1] < 7 or scores.shape != (n,) or labels.shape != (n,):
        raise ValueError(f"rotated_nms needs boxes [N, 7], scores [N] and labels [N], got "
                         f"{list(boxes.shape)}, {list(scores.shape)}, {list(labels.shape)}")
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    order = scores.argsort(descending=True)
    boxes, labels = boxes[order], labels[order]
    radius = boxes[:, 3:5].norm(dim=1) / 2
    dist = torch.cdist(boxes[:, :2].double(), boxes[:, :2].double())
    near = (dist < (radius[:, None] + radius[None, :]).double()) & (labels[:, None] == labels[None, :])
    i, j = torch.triu(near, diagonal=1).nonzero(as_tuple=True)
    overlapping = rotated_iou_pairs(boxes[i], boxes[j]) > iou_threshold
    suppressors = [[] for _ in range(n)]  # suppressors[j]: better boxes that overlap j
    for a, b in zip(i[overlapping].tolist(), j[overlapping].tolist()):
        suppressors[b].append(a)
    kept = [False] * n
    for k in range(n):  # greedy in score order: k survives unless a kept better box overlaps it
        kept[k] = not any(kept[a] for a in suppressors[k])
    return order[torch.tensor(kept, device=order.device)]
