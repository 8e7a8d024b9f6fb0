"""Transforms of one LiDAR frame, and its voxelisation into a sample for sparse_collate_fn.

A *frame* is a dict of numpy arrays: ``points`` float32 ``[N, C]`` (x, y, z first) and,
when the dataset has them, ``labels`` ``[N]`` (per point), ``boxes`` float32 ``[M, 7]``
(x, y, z, dx, dy, dz, yaw; yaw about +z, counter-clockwise from +x) or ``[M, 9]`` (then vx, vy
in m/s) and ``box_labels`` ``[M]``. Other keys pass through unchanged. Geometric transforms move
points and boxes together, so a point inside a box stays inside it; velocities turn, mirror and
scale with them.

Random transforms draw from torch's generator (or the one given): DataLoader seeds it per
worker, so workers do not repeat each other's augmentations.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..tensor import SparseTensor
from ..utils import sparse_quantize

__all__ = ["Compose", "RandomRotation", "RandomFlip", "RandomScale", "PointCap", "Voxelize",
           "rotate_z", "wrap_angle"]

Frame = Dict[str, object]


def _uniform(generator: Optional[torch.Generator], low: float, high: float) -> float:
    return low + (high - low) * torch.rand((), generator=generator, dtype=torch.float64).item()


def wrap_angle(angle: np.ndarray) -> np.ndarray:
    """Angles wrapped to [-pi, pi)."""
    return (angle + np.pi) % (2 * np.pi) - np.pi


def _with(frame: Frame, points: np.ndarray, boxes: Optional[np.ndarray]) -> Frame:
    out = dict(frame)
    out["points"] = points
    if boxes is not None:
        out["boxes"] = boxes
    return out


def _split(frame: Frame) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    points = frame["points"]
    if not isinstance(points, np.ndarray) or points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"frame['points'] must be a numpy [N, 3+] array, got {getattr(points, 'shape', points)!r}")
    boxes = frame.get("boxes")
    if boxes is not None and (not isinstance(boxes, np.ndarray) or boxes.ndim != 2 or boxes.shape[1] not in (7, 9)):
        raise ValueError(f"frame['boxes'] must be a numpy [M, 7] or [M, 9] (with velocity) array, got "
                         f"{getattr(boxes, 'shape', boxes)!r}")
    return points, boxes


def rotate_z(frame: Frame, angle: float) -> Frame:
    """Rotates points and boxes by ``angle`` (radians, counter-clockwise) about the z axis."""
    points, boxes = _split(frame)
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, -s], [s, c]], dtype=np.float64)
    points = points.copy()
    points[:, :2] = (points[:, :2].astype(np.float64) @ rot.T).astype(points.dtype)
    if boxes is not None:
        boxes = boxes.copy()
        boxes[:, :2] = (boxes[:, :2].astype(np.float64) @ rot.T).astype(boxes.dtype)
        boxes[:, 6] = wrap_angle(boxes[:, 6].astype(np.float64) + angle).astype(boxes.dtype)
        if boxes.shape[1] == 9:  # velocities turn with the frame
            boxes[:, 7:9] = (boxes[:, 7:9].astype(np.float64) @ rot.T).astype(boxes.dtype)
    return _with(frame, points, boxes)


class Compose:
    """Applies transforms in order."""

    def __init__(self, transforms: Sequence[Callable[[Frame], Frame]]):
        self.transforms = list(transforms)
        for t in self.transforms:
            if not callable(t):
                raise TypeError(f"every transform must be callable, got {type(t).__name__}")

    def __call__(self, frame: Frame) -> Frame:
        for t in self.transforms:
            frame = t(frame)
        return frame

    def __repr__(self) -> str:
        return f"Compose({self.transforms!r})"


class RandomRotation:
    """Rotation about z by an angle drawn uniformly from [-max_angle, max_angle]."""

    def __init__(self, max_angle: float = math.pi, generator: Optional[torch.Generator] = None):
        if not (0 <= max_angle <= math.pi):
            raise ValueError(f"max_angle must lie in [0, pi], got {max_angle!r}")
        self.max_angle = float(max_angle)
        self.generator = generator

    def __call__(self, frame: Frame) -> Frame:
        return rotate_z(frame, _uniform(self.generator, -self.max_angle, self.max_angle))

    def __repr__(self) -> str:
        return f"RandomRotation(max_angle={self.max_angle})"


class RandomFlip:
    """Mirrors across the x axis (y -> -y) and/or the y axis (x -> -x), each with probability p."""

    def __init__(self, axes: Sequence[str] = ("x", "y"), p: float = 0.5,
                 generator: Optional[torch.Generator] = None):
        axes = tuple(axes)
        if not axes or any(a not in ("x", "y") for a in axes) or len(set(axes)) != len(axes):
            raise ValueError(f"axes must be distinct names from ('x', 'y'), got {axes!r}")
        if not (0 <= p <= 1):
            raise ValueError(f"p must lie in [0, 1], got {p!r}")
        self.axes, self.p, self.generator = axes, float(p), generator

    def __call__(self, frame: Frame) -> Frame:
        points, boxes = _split(frame)
        points = points.copy()
        boxes = None if boxes is None else boxes.copy()
        for axis in self.axes:
            if _uniform(self.generator, 0.0, 1.0) >= self.p:
                continue
            # Mirroring across the x axis negates y; across the y axis negates x.
            col = 1 if axis == "x" else 0
            points[:, col] = -points[:, col]
            if boxes is not None:
                boxes[:, col] = -boxes[:, col]
                if boxes.shape[1] == 9:
                    boxes[:, 7 + col] = -boxes[:, 7 + col]
                yaw = boxes[:, 6].astype(np.float64)
                boxes[:, 6] = wrap_angle(-yaw if axis == "x" else math.pi - yaw).astype(boxes.dtype)
        return _with(frame, points, boxes)

    def __repr__(self) -> str:
        return f"RandomFlip(axes={self.axes}, p={self.p})"


class RandomScale:
    """Scales x, y, z (and box centres, sizes and velocities) by one factor drawn from [low, high]."""

    def __init__(self, low: float = 0.95, high: float = 1.05, generator: Optional[torch.Generator] = None):
        if not (0 < low <= high) or not math.isfinite(high):
            raise ValueError(f"need 0 < low <= high < inf, got low={low!r}, high={high!r}")
        self.low, self.high, self.generator = float(low), float(high), generator

    def __call__(self, frame: Frame) -> Frame:
        points, boxes = _split(frame)
        factor = _uniform(self.generator, self.low, self.high)
        points = points.copy()
        points[:, :3] *= factor
        if boxes is not None:
            boxes = boxes.copy()
            boxes[:, :6] *= factor
            boxes[:, 7:9] *= factor
        return _with(frame, points, boxes)

    def __repr__(self) -> str:
        return f"RandomScale(low={self.low}, high={self.high})"


class PointCap:
    """Keeps a random subset of ``max_points`` points (in their original order) when a frame has
    more; per-point arrays (``PER_POINT_KEYS``) are subset alike. Boxes are kept."""

    PER_POINT_KEYS = ("labels", "raw_labels", "instances")

    def __init__(self, max_points: int, generator: Optional[torch.Generator] = None):
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
            raise ValueError(f"max_points must be a positive int, got {max_points!r}")
        self.max_points, self.generator = max_points, generator

    def __call__(self, frame: Frame) -> Frame:
        points, _ = _split(frame)
        n = len(points)
        if n <= self.max_points:
            return frame
        keep = torch.randperm(n, generator=self.generator)[: self.max_points].sort().values.numpy()
        out = dict(frame)
        out["points"] = points[keep]
        for key in self.PER_POINT_KEYS:
            if key in frame:
                values = np.asarray(frame[key])
                if len(values) != n:
                    raise ValueError(f"frame[{key!r}] has {len(values)} entries but there are {n} points")
                out[key] = values[keep]
        return out

    def __repr__(self) -> str:
        return f"PointCap(max_points={self.max_points})"


class Voxelize:
    """Turns a frame into a sample for ``sparse_collate_fn``.

    Each voxel (``sparse_quantize`` at ``voxel_size``) is represented by the first point that
    falls into it: its columns are the voxel's features and its label the voxel's label.
    The sample holds:

    - ``lidar``: SparseTensor of those features (float32) at (0, x, y, z) voxel coordinates;
    - ``inverse_map``: int64 ``[N]``, each point's voxel row (to carry predictions back);
    - with labels: ``targets`` int64 ``[V]`` per voxel and ``point_targets`` int64 ``[N]``;
    - with instance ids: ``point_instances`` int64 ``[N]``;
    - with boxes: ``boxes`` float32 ``[M, 7]`` and ``box_labels`` int64 ``[M]`` as tensors;
    - any other frame entries unchanged (e.g. ``file``).

    Per-sample tensors of different lengths come out of ``sparse_collate_fn`` as lists;
    ``torch.cat`` of ``targets`` lines up with the collated ``lidar`` rows.
    """

    def __init__(self, voxel_size: Union[float, Sequence[float]]):
        # sparse_quantize validates the size; check it now so a bad value fails at construction.
        sparse_quantize(np.zeros((1, 3)), voxel_size)
        self.voxel_size = voxel_size

    def __call__(self, frame: Frame) -> Dict[str, object]:
        points, boxes = _split(frame)
        if len(points) == 0:
            raise ValueError(f"frame {frame.get('file', '')!r} has no points to voxelize")
        coords, index, inverse = sparse_quantize(points[:, :3], self.voxel_size,
                                                 return_index=True, return_inverse=True)
        coords = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), torch.from_numpy(coords)], 1)
        feats = torch.from_numpy(np.ascontiguousarray(points[index], dtype=np.float32))
        sample: Dict[str, object] = {k: v for k, v in frame.items() if k not in ("points", "labels", "boxes",
                                                                              "box_labels", "instances")}
        sample["lidar"] = SparseTensor(feats, coords)
        sample["inverse_map"] = torch.from_numpy(inverse)
        if "labels" in frame:
            labels = torch.from_numpy(np.asarray(frame["labels"]).astype(np.int64))
            if len(labels) != len(points):
                raise ValueError(f"frame has {len(labels)} labels for {len(points)} points")
            sample["targets"] = labels[torch.from_numpy(index)]
            sample["point_targets"] = labels
        if "instances" in frame:
            instances = torch.from_numpy(np.asarray(frame["instances"]).astype(np.int64))
            if len(instances) != len(points):
                raise ValueError(f"frame has {len(instances)} instance ids for {len(points)} points")
            sample["point_instances"] = instances
        if boxes is not None:
            box_labels = np.asarray(frame.get("box_labels", ()))
            if box_labels.shape != (len(boxes),):
                raise ValueError(f"frame has {len(boxes)} boxes but box_labels of shape {box_labels.shape}")
            sample["boxes"] = torch.from_numpy(np.ascontiguousarray(boxes, dtype=np.float32))
            sample["box_labels"] = torch.from_numpy(box_labels.astype(np.int64))
        return sample

    def __repr__(self) -> str:
        return f"Voxelize(voxel_size={self.voxel_size!r})"
