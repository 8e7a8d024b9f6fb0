"""Exact intersection-over-union of rotated boxes in bird's-eye view, in pure torch.

The intersection of two convex quadrilaterals is convex, and its vertices are among: corners
of either box inside the other, and crossings of their edges. Sorting those points by angle
around their centroid gives the polygon; the shoelace formula gives its area.
"""
import torch

_EPS = 1e-9


def bev_corners(boxes: torch.Tensor) -> torch.Tensor:
    """Counter-clockwise BEV corners [N, 4, 2] of boxes [N, >=7] (x, y, z, dx, dy, dz, yaw)."""
    half = boxes[:, 3:5] / 2
    signs = boxes.new_tensor([[1, 1], [-1, 1], [-1, -1], [1, -1]])
    local = signs[None] * half[:, None, :]  # [N, 4, 2]
    cos, sin = torch.cos(boxes[:, 6])[:, None], torch.sin(boxes[:, 6])[:, None]
    x = local[..., 0] * cos - local[..., 1] * sin + boxes[:, None, 0]
    y = local[..., 0] * sin + local[..., 1] * cos + boxes[:, None, 1]
    return torch.stack([x, y], -1)


def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside(points: torch.Tensor, poly: torch.Tensor) -> torch.Tensor:
    """[P, k] whether each of points [P, k, 2] lies in (or on) the CCW quadrilateral poly [P, 4, 2]."""
    start = poly[:, None, :, :]                               # [P, 1, 4, 2]
    edge = (torch.roll(poly, -1, dims=1) - poly)[:, None]    # [P, 1, 4, 2]
    side = _cross(edge, points[:, :, None, :] - start)        # [P, k, 4]
    scale = edge.norm(dim=-1) * (points[:, :, None, :] - start).norm(dim=-1)
    return (side >= -1e-7 * scale - _EPS).all(-1)


def _edge_crossings(a: torch.Tensor, b: torch.Tensor):
    """Crossings of every edge of a [P, 4, 2] with every edge of b: points [P, 16, 2], valid [P, 16]."""
    p, r = a[:, :, None, :], (torch.roll(a, -1, dims=1) - a)[:, :, None, :]   # [P, 4, 1, 2]
    q, s = b[:, None, :, :], (torch.roll(b, -1, dims=1) - b)[:, None, :, :]   # [P, 1, 4, 2]
    denom = _cross(r, s)                                                       # [P, 4, 4]
    parallel = denom.abs() <= _EPS * (r.norm(dim=-1) * s.norm(dim=-1)).clamp(min=_EPS)
    safe = torch.where(parallel, torch.ones_like(denom), denom)
    t = _cross(q - p, s) / safe
    u = _cross(q - p, r) / safe
    valid = ~parallel & (t >= 0) & (t <= 1) & (u >= 0) & (u <= 1)
    points = p + t[..., None] * r
    return points.reshape(len(a), 16, 2), valid.reshape(len(a), 16)


def polygon_area(points: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Area of the convex hull of the valid points [P, k, 2], when they all lie on it."""
    count = valid.sum(1)
    weights = valid.to(points.dtype)[..., None]
    centre = (points * weights).sum(1) / count.clamp(min=1)[:, None].to(points.dtype)
    rel = points - centre[:, None, :]
    angle = torch.atan2(rel[..., 1], rel[..., 0]).masked_fill(~valid, float("inf"))
    order = angle.argsort(dim=1)
    rel = rel.gather(1, order[..., None].expand_as(rel))
    ok = valid.gather(1, order)
    # Invalid slots (sorted last) repeat the first point: their shoelace terms vanish.
    rel = torch.where(ok[..., None], rel, rel[:, :1, :])
    area = _cross(rel, torch.roll(rel, -1, dims=1)).sum(1).abs() / 2
    return torch.where(count >= 3, area, torch.zeros_like(area))


def rotated_iou_pairs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """BEV IoU of box pairs a[i], b[i] (each [P, 7]; x, y, dx, dy and yaw are used) -> [P]."""
    if a.shape != b.shape or a.dim() != 2 or a.shape[1] < 7:
        raise ValueError(f"rotated_iou_pairs needs two [P, 7] box tensors, got {list(a.shape)} and {list(b.shape)}")
    a64, b64 = a.double(), b.double()
    ca, cb = bev_corners(a64), bev_corners(b64)
    crossings, crossing_ok = _edge_crossings(ca, cb)
    points = torch.cat([ca, cb, crossings], 1)
    valid = torch.cat([_inside(ca, cb), _inside(cb, ca), crossing_ok], 1)
    inter = polygon_area(points, valid)
    union = a64[:, 3] * a64[:, 4] + b64[:, 3] * b64[:, 4] - inter
    return (inter / union.clamp(min=_EPS)).to(a.dtype)


def rotated_iou_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[N, M] BEV IoU of every box of a [N, 7] with every box of b [M, 7]."""
    n, m = len(a), len(b)
    ia = torch.arange(n, device=a.device).repeat_interleave(m)
    ib = torch.arange(m, device=a.device).repeat(n)
    return rotated_iou_pairs(a[ia], b[ib]).reshape(n, m)
