"""Waymo Open Dataset frames in the layout OpenPCDet's Waymo preprocessing writes::

    ROOT/ImageSets/<split>.txt                 one segment file name per line (its stem names the segment)
    ROOT/<tag>/<segment>/<segment>.pkl         the segment's infos: a list, one dict per frame
    ROOT/<tag>/<segment>/<NNNN>.npy            frame NNNN's points, float32 [N, 6] in the vehicle frame:
                                               x, y, z, intensity, elongation, no-label-zone flag
    ROOT/<tag>_infos_<split>.pkl               all infos of a split (written beside; not read here)

``<tag>`` is the processed-data folder (``waymo_processed_data_v0_5_0`` by default). A frame's
info holds ``point_cloud`` (``lidar_sequence``: the segment, ``sample_idx``: the frame number,
which names its .npy), ``frame_id``, ``pose`` (4 x 4, global from vehicle) and ``annos``
(``name`` [M] and ``gt_boxes_lidar`` [M, 7] or [M, 9]: x, y, z, length, width, height, heading
and, from OpenPCDet 0.6 on, the velocity vx, vy, all in the vehicle frame).

As OpenPCDet reads them: the intensity becomes tanh(intensity); the points are (x, y, z,
intensity, elongation); with ``drop_nlz`` only points with the flag -1 (outside no-label zones)
are kept (OpenPCDet's default Waymo configs keep all: DISABLE_NLZ_FLAG_ON_POINTS). Boxes of the
classes (Vehicle, Pedestrian, Cyclist) are kept; Sign and unknown are left out.

``frames=F`` (F > 1) adds the F - 1 frames before each one (frame numbers sample_idx - 1, ...),
each carried into the current vehicle frame through the poses (current <- global <- previous),
with a sixth column, the time lag 0.1 s x the frame-number difference (0 on the current frame;
Waymo runs at 10 Hz); points of earlier frames with |x| < 1 m and |y| < 1 m after the move are
dropped, as OpenPCDet's sequence loader does. At the start of a segment there are fewer frames
(OpenPCDet repeats the first frame instead).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..io import read_points
from .poses import invert_pose, transform_points
from .safe_pickle import load_pickle
from .frames import FrameDataset
from .transforms import Voxelize

__all__ = ["WaymoDataset", "WAYMO_CLASSES", "DEFAULT_TAG", "FRAME_INTERVAL", "NPY_COLUMNS"]

WAYMO_CLASSES = ("Vehicle", "Pedestrian", "Cyclist")
DEFAULT_TAG = "waymo_processed_data_v0_5_0"
FRAME_INTERVAL = 0.1  # s between frames (10 Hz)
NPY_COLUMNS = 6  # x, y, z, intensity, elongation, NLZ flag
EGO_RADIUS = 1.0  # m


def _frame_key(info, pkl: Path, k: int) -> Tuple[str, int]:
    if not isinstance(info, dict):
        raise ValueError(f"{str(pkl)!r}: info {k} must be a dict, got {type(info).__name__}")
    for key in ("point_cloud", "pose", "frame_id"):
        if key not in info:
            raise ValueError(f"{str(pkl)!r}: info {k} lacks the key {key!r}")
    pc = info["point_cloud"]
    if not isinstance(pc, dict) or "lidar_sequence" not in pc or "sample_idx" not in pc:
        raise ValueError(f"{str(pkl)!r}: info {k}'s 'point_cloud' must hold 'lidar_sequence' and 'sample_idx'")
    idx = pc["sample_idx"]
    if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)) or idx < 0:
        raise ValueError(f"{str(pkl)!r}: info {k}'s sample_idx must be a non-negative int, got {idx!r}")
    return str(pc["lidar_sequence"]), int(idx)


def _pose(info: dict, pkl: Path) -> np.ndarray:
    pose = np.asarray(info["pose"], dtype=np.float64)
    where = f"{str(pkl)!r}: frame {info['frame_id']!r}"
    if pose.shape != (4, 4) or not np.isfinite(pose).all():
        raise ValueError(f"{where}: 'pose' must be a finite 4 x 4 matrix, got shape {pose.shape}")
    r = pose[:3, :3]
    # float32 poses are rigid to ~1e-6; anything far off is not a pose.
    if not np.allclose(r @ r.T, np.eye(3), atol=1e-4) or np.linalg.det(r) < 0 or \
            not np.allclose(pose[3], [0, 0, 0, 1]):
        raise ValueError(f"{where}: 'pose' is not a rigid transform (rotation and translation)")
    return pose


class WaymoDataset(FrameDataset):
    """Waymo frames as ``points`` [N, 5] (x, y, z, tanh(intensity), elongation; a sixth column, the
    time lag, with frames > 1), ``boxes`` [M, 7 or 9] and ``box_labels`` [M] (indices into
    ``classes``); ``__getitem__`` voxelises as ``transforms.Voxelize``."""

    def __init__(self, root: Union[str, Path], split: str = "train", voxel_size: Union[float, Sequence[float]] = 0.1,
                 transforms: Optional[Callable] = None, *, frames: int = 1, tag: str = DEFAULT_TAG,
                 classes: Sequence[str] = WAYMO_CLASSES, drop_nlz: bool = False):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"Waymo root {str(self.root)!r} does not exist")
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
            raise ValueError(f"frames must be a positive int (1: the frame alone), got {frames!r}")
        self.classes = tuple(classes)
        unknown = [c for c in self.classes if c not in WAYMO_CLASSES]
        if not self.classes or unknown or len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes must be distinct names of {list(WAYMO_CLASSES)}, got {classes!r}")
        self.split, self.frames, self.tag, self.drop_nlz = split, frames, tag, bool(drop_nlz)
        self.data_dir = self.root / tag
        if not self.data_dir.is_dir():
            raise FileNotFoundError(f"Waymo processed-data folder {str(self.data_dir)!r} does not exist "
                                    f"(the tag {tag!r} names it)")
        self.infos: List[dict] = []
        self.segment_infos: Dict[str, Dict[int, dict]] = {}
        self.info_files: Dict[str, Path] = {}
        for segment in self._segments():
            self._add_segment(segment)
        if not self.infos:
            raise ValueError(f"the {split} segments of {str(self.root)!r} hold no frames")
        self.transforms = transforms
        self.voxelize = Voxelize(voxel_size)

    def _segments(self) -> List[str]:
        sets = self.root / "ImageSets"
        index = sets / f"{self.split}.txt"
        if not index.is_file():
            available = sorted(p.stem for p in sets.glob("*.txt")) if sets.is_dir() else []
            raise ValueError(f"unknown split {self.split!r}: no file {str(index)!r} (available splits: {available})")
        names = [Path(line.strip()).stem for line in index.read_text().splitlines()
                 if line.strip() and not line.strip().startswith("#")]
        if not names:
            raise ValueError(f"split file {str(index)!r} lists no segments")
        return names

    def _add_segment(self, segment: str) -> None:
        pkl = self.data_dir / segment / f"{segment}.pkl"
        infos = load_pickle(pkl)
        if not isinstance(infos, list) or not infos:
            raise ValueError(f"{str(pkl)!r} must hold a non-empty list of frame infos")
        by_index: Dict[int, dict] = {}
        for k, info in enumerate(infos):
            name, idx = _frame_key(info, pkl, k)
            if name != segment:
                raise ValueError(f"{str(pkl)!r}: info {k} belongs to segment {name!r}, not {segment!r}")
            if idx in by_index:
                raise ValueError(f"{str(pkl)!r}: frame {idx} appears twice")
            _pose(info, pkl)
            by_index[idx] = info
            self.infos.append(info)
        self.segment_infos[segment] = by_index
        self.info_files[segment] = pkl

    @property
    def point_features(self) -> int:
        return 5 + (self.frames > 1)

    def __len__(self) -> int:
        return len(self.infos)

    def _points(self, segment: str, idx: int) -> np.ndarray:
        path = self.data_dir / segment / f"{idx:04d}.npy"
        points = read_points(path)  # NaN / Inf rows dropped with a NonFiniteWarning
        if points.shape[1] != NPY_COLUMNS:
            raise ValueError(f"{str(path)!r} holds {points.shape[1]} columns; a Waymo frame has {NPY_COLUMNS} "
                             "(x, y, z, intensity, elongation, no-label-zone flag)")
        if self.drop_nlz:
            points = points[points[:, 5] == -1]
        out = points[:, :5].copy()
        out[:, 3] = np.tanh(out[:, 3])
        return out

    def _boxes(self, info: dict, segment: str) -> Tuple[np.ndarray, np.ndarray]:
        where = f"{str(self.info_files[segment])!r}: frame {info['frame_id']!r}"
        annos = info.get("annos")
        if not isinstance(annos, dict) or "name" not in annos or "gt_boxes_lidar" not in annos:
            raise ValueError(f"{where}: 'annos' must hold 'name' and 'gt_boxes_lidar'")
        names = np.asarray(annos["name"]).reshape(-1)
        boxes = np.asarray(annos["gt_boxes_lidar"], dtype=np.float64)
        if boxes.ndim != 2 or boxes.shape[1] not in (7, 9) or len(boxes) != len(names):
            raise ValueError(f"{where}: gt_boxes_lidar must be [M, 7] or [M, 9] with one row per name, got "
                             f"{boxes.shape} for {len(names)} names")
        if not np.isfinite(boxes).all() or (boxes[:, 3:6] <= 0).any():
            raise ValueError(f"{where}: gt_boxes_lidar must be finite with positive sizes")
        keep = np.isin(names, self.classes)
        labels = np.array([self.classes.index(n) for n in names[keep]], dtype=np.int64)
        return boxes[keep].astype(np.float32), labels

    def read_frame(self, index: int) -> Dict[str, object]:
        """The raw frame: ``points`` float32, ``boxes``, ``box_labels``, ``file``, ``frame_id``."""
        info = self.infos[index]
        segment, idx = str(info["point_cloud"]["lidar_sequence"]), int(info["point_cloud"]["sample_idx"])
        points = self._points(segment, idx)
        used = 1
        if self.frames > 1:
            current_from_global = invert_pose(_pose(info, self.info_files[segment]))
            parts = [np.concatenate([points, np.zeros((len(points), 1), np.float32)], 1)]
            for previous in range(idx - 1, max(idx - self.frames, -1), -1):
                before = self.segment_infos[segment].get(previous)
                if before is None:
                    raise ValueError(f"{str(self.info_files[segment])!r} has no frame {previous}, which frame "
                                     f"{idx} needs for frames={self.frames}")
                moved = self._points(segment, previous)
                matrix = current_from_global @ _pose(before, self.info_files[segment])
                moved[:, :3] = transform_points(matrix, moved[:, :3]).astype(np.float32)
                moved = moved[~((np.abs(moved[:, 0]) < EGO_RADIUS) & (np.abs(moved[:, 1]) < EGO_RADIUS))]
                lag = np.full((len(moved), 1), FRAME_INTERVAL * (idx - previous), np.float32)
                parts.append(np.concatenate([moved, lag], 1))
                used += 1
            points = np.concatenate(parts)
        boxes, labels = self._boxes(info, segment)
        return {"points": np.ascontiguousarray(points, dtype=np.float32), "boxes": boxes, "box_labels": labels,
                "file": str(self.data_dir / segment / f"{idx:04d}.npy"), "frame_id": str(info["frame_id"]),
                "sweeps": used}


    def __repr__(self) -> str:
        return (f"WaymoDataset(root={str(self.root)!r}, split={self.split!r}, samples={len(self)}, "
                f"frames_per_sample={self.frames}, {self.voxelize!r})")
