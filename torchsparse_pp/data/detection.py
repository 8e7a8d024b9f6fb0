"""3D detection frames: LiDAR points plus boxes, in a KITTI-like layout (this library's format)::

    ROOT/ImageSets/<split>.txt   frame ids, one per line (e.g. 000042)
    ROOT/velodyne/<id>.bin       float32 (x, y, z, intensity) per point, as KITTI
    ROOT/boxes/<id>.txt          one box per line: ``<class> x y z dx dy dz yaw``

Boxes live in the sensor frame (x forward, y left, z up): (x, y, z) is the box centre,
(dx, dy, dz) its extent along its own axes, ``yaw`` the heading in radians, counter-clockwise
about +z from +x. Class names must be among the dataset's ``classes``; a frame without
objects has an empty box file. Blank lines and lines starting with ``#`` are skipped.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..io import drop_nonfinite, read_bin
from .synthetic import BOX_CLASSES
from .frames import FrameDataset
from .transforms import Voxelize

__all__ = ["DetectionDataset", "read_boxes", "write_boxes"]


def read_boxes(path: Union[str, Path], classes: Sequence[str] = BOX_CLASSES) -> Tuple[np.ndarray, np.ndarray]:
    """(boxes float32 [M, 7], class indices int64 [M]) from a box file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"box file {str(path)!r} does not exist")
    boxes, labels = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        where = f"{str(path)}:{number}"
        if len(fields) != 8:
            raise ValueError(f"{where}: expected '<class> x y z dx dy dz yaw', got {line!r}")
        if fields[0] not in classes:
            raise ValueError(f"{where}: unknown class {fields[0]!r}; the dataset's classes are {list(classes)}")
        try:
            values = [float(v) for v in fields[1:]]
        except ValueError:
            raise ValueError(f"{where}: box values must be numbers, got {line!r}") from None
        if not all(math.isfinite(v) for v in values) or min(values[3:6]) <= 0:
            raise ValueError(f"{where}: box values must be finite with positive sizes, got {line!r}")
        boxes.append(values)
        labels.append(list(classes).index(fields[0]))
    return np.asarray(boxes, dtype=np.float32).reshape(-1, 7), np.asarray(labels, dtype=np.int64)


def write_boxes(path: Union[str, Path], boxes: np.ndarray, labels: np.ndarray,
                classes: Sequence[str] = BOX_CLASSES) -> None:
    """Writes boxes [M, 7] with class indices [M] in the format read_boxes reads."""
    boxes, labels = np.asarray(boxes), np.asarray(labels)
    if boxes.ndim != 2 or boxes.shape[1] != 7 or labels.shape != (len(boxes),):
        raise ValueError(f"need boxes [M, 7] and labels [M], got {boxes.shape} and {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
        raise ValueError(f"box labels must index classes {list(classes)}, got {np.unique(labels).tolist()}")
    lines = [" ".join([classes[int(c)]] + [repr(float(v)) for v in box]) for box, c in zip(boxes, labels)]
    Path(path).write_text("".join(line + "\n" for line in lines))


class DetectionDataset(FrameDataset):
    """Detection frames as voxelised samples with ``boxes`` and ``box_labels``
    (see ``transforms.Voxelize``); ``transforms`` move points and boxes together."""

    def __init__(self, root: Union[str, Path], split: str = "train", voxel_size: Union[float, Sequence[float]] = 0.1,
                 transforms: Optional[Callable] = None, *, classes: Sequence[str] = BOX_CLASSES):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"detection dataset root {str(self.root)!r} does not exist")
        sets = self.root / "ImageSets"
        index = sets / f"{split}.txt"
        if not index.is_file():
            available = sorted(p.stem for p in sets.glob("*.txt")) if sets.is_dir() else []
            raise ValueError(f"unknown split {split!r}: no file {str(index)!r} (available splits: {available})")
        self.frame_ids: List[str] = [line.strip() for line in index.read_text().splitlines()
                                     if line.strip() and not line.strip().startswith("#")]
        if not self.frame_ids:
            raise ValueError(f"split file {str(index)!r} lists no frames")
        self.classes = tuple(classes)
        if not self.classes or len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes must be distinct names, got {classes!r}")
        self.split = split
        self.transforms = transforms
        self.voxelize = Voxelize(voxel_size)
        for frame_id in self.frame_ids:  # fail now, not in the middle of an epoch
            points = self.root / "velodyne" / f"{frame_id}.bin"
            if not points.is_file():
                raise FileNotFoundError(f"frame {frame_id!r} of split {split!r} has no point file {str(points)!r}")

    def __len__(self) -> int:
        return len(self.frame_ids)

    def read_frame(self, index: int) -> Dict[str, object]:
        """The raw frame: ``points`` [N, 4], ``boxes`` [M, 7], ``box_labels`` [M]. Points
        holding NaN or Inf are dropped (a NonFiniteWarning counts them)."""
        frame_id = self.frame_ids[index]
        points_file = self.root / "velodyne" / f"{frame_id}.bin"
        boxes, labels = read_boxes(self.root / "boxes" / f"{frame_id}.txt", self.classes)
        points = drop_nonfinite(read_bin(points_file, columns=4), points_file)
        return {"points": points, "boxes": boxes, "box_labels": labels, "file": str(points_file)}


    def __repr__(self) -> str:
        return (f"DetectionDataset(root={str(self.root)!r}, split={self.split!r}, frames={len(self)}, "
                f"classes={self.classes}, {self.voxelize!r})")
