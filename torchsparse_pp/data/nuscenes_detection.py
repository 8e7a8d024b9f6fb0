"""nuScenes detection: the key frames of a set of scenes with multi-sweep points and the
annotated boxes of the 10 detection classes, in the key frame's LiDAR frame.

Tables read from ``ROOT/<version>/``: scene, sample, sample_data, ego_pose, calibrated_sensor,
sensor, sample_annotation, instance, category. A split is a list of scene names: ``scenes=``,
or ``split=NAME``, which reads ``ROOT/splits/NAME_scenes.txt`` (one scene name per line; this
library's format, as the devkit defines its splits by scene name).

Boxes follow the devkit: a sample_annotation's ``translation`` (the box centre), ``size``
(width, length, height) and ``rotation`` are global; they are moved into the key frame's
LiDAR frame by the inverse of its ego_pose, then of its calibrated_sensor. The box is
(x, y, z, dx, dy, dz, yaw, vx, vy) with dx the length (along the heading), dy the width,
yaw the angle of the box's +x axis in the LiDAR x-y plane. The velocity is the devkit's
``box_velocity``: the centre difference to the previous and next annotation of the instance
over their samples' time (one side where the other is missing; none above 1.5 s per side), in
the global frame, then rotated into the LiDAR frame; where it is undefined it is 0 (as
OpenPCDet's SET_NAN_VELOCITY_TO_ZEROS). Categories map to detection classes by the devkit's
``category_to_detection_name``; other categories are left out.

Points are (x, y, z, intensity, time lag) of the key frame and its earlier sweeps
(``nuscenes_sweeps``, 10 sweeps by default as CenterPoint uses them).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from .nuscenes_sweeps import check_sweeps, merge_sweeps, sweep_chain
from .nuscenes_tables import LIDAR_CHANNEL, NuScenesTables
from .poses import invert_pose, quaternion_matrix, rotate_vectors, transform_points, yaw_of
from .frames import FrameDataset
from .transforms import Voxelize

__all__ = ["NuScenesDetection", "DETECTION_CLASSES", "CATEGORY_TO_DETECTION", "annotation_boxes",
           "box_velocity", "read_scene_split"]

#: The detection classes in the order CenterPoint's nuScenes configs list them.
DETECTION_CLASSES = ("car", "truck", "construction_vehicle", "bus", "trailer", "barrier", "motorcycle", "bicycle",
                     "pedestrian", "traffic_cone")

#: The devkit's category -> detection class (personal mobility, strollers, wheelchairs,
#: animals, debris, police / ambulance vehicles and the rest are not detection classes).
CATEGORY_TO_DETECTION = {
    "movable_object.barrier": "barrier",
    "vehicle.bicycle": "bicycle",
    "vehicle.bus.bendy": "bus",
    "vehicle.bus.rigid": "bus",
    "vehicle.car": "car",
    "vehicle.construction": "construction_vehicle",
    "vehicle.motorcycle": "motorcycle",
    "human.pedestrian.adult": "pedestrian",
    "human.pedestrian.child": "pedestrian",
    "human.pedestrian.construction_worker": "pedestrian",
    "human.pedestrian.police_officer": "pedestrian",
    "movable_object.trafficcone": "traffic_cone",
    "vehicle.trailer": "trailer",
    "vehicle.truck": "truck",
}

MAX_VELOCITY_GAP = 1.5  # s per side: the devkit's max_time_diff
DETECTION_TABLES = ("scene", "sample", "sample_data", "ego_pose", "calibrated_sensor", "sensor", "sample_annotation",
                    "instance", "category")


def read_scene_split(root: Union[str, Path], split: str) -> List[str]:
    """Scene names listed by ``ROOT/splits/<split>_scenes.txt`` (blank lines and # comments skipped)."""
    path = Path(root) / "splits" / f"{split}_scenes.txt"
    if not path.is_file():
        found = sorted(p.name[:-len("_scenes.txt")] for p in path.parent.glob("*_scenes.txt")) \
            if path.parent.is_dir() else []
        raise ValueError(f"unknown split {split!r}: no scene list {str(path)!r} (available: {found})")
    names = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    if not names:
        raise ValueError(f"scene list {str(path)!r} names no scenes")
    return names


def _sample_time(tables: NuScenesTables, annotation: dict) -> float:
    sample = tables.get("sample", tables.value("sample_annotation", annotation, "sample_token"),
                        tables.where("sample_annotation", annotation))
    return 1e-6 * tables.timestamp("sample", sample)


def box_velocity(tables: NuScenesTables, annotation: dict) -> np.ndarray:
    """The devkit's velocity estimate (global frame, m/s) of an annotation, NaN where undefined."""
    neighbours = []
    for side in ("prev", "next"):
        token = tables.value("sample_annotation", annotation, side)
        neighbours.append(None if token == "" else
                          tables.get("sample_annotation", token, f"the {side} of {tables.where('sample_annotation', annotation)}"))
    before, after = neighbours
    if before is None and after is None:
        return np.full(3, np.nan)
    first, last = before or annotation, after or annotation
    gap = _sample_time(tables, last) - _sample_time(tables, first)
    limit = MAX_VELOCITY_GAP * (2 if before is not None and after is not None else 1)
    if not 0 < gap <= limit:  # gap <= 0: timestamps out of order in the tables, no estimate
        return np.full(3, np.nan)
    moved = (tables.vector("sample_annotation", last, "translation", 3)
             - tables.vector("sample_annotation", first, "translation", 3))
    return moved / gap


def annotation_boxes(tables: NuScenesTables, annotations: Sequence[dict], lidar_from_global: np.ndarray
                     ) -> np.ndarray:
    """[M, 9] float64 boxes (x, y, z, dx, dy, dz, yaw, vx, vy) in the LiDAR frame."""
    out = np.zeros((len(annotations), 9))
    for m, ann in enumerate(annotations):
        where = f"{tables.file('sample_annotation')} record {ann['token']!r}"
        centre = tables.vector("sample_annotation", ann, "translation", 3)
        width, length, height = tables.vector("sample_annotation", ann, "size", 3)
        if min(width, length, height) <= 0:
            raise ValueError(f"{where}: box sizes must be positive, got {ann['size']!r}")
        rotation = quaternion_matrix(tables.vector("sample_annotation", ann, "rotation", 4), where)
        velocity = np.nan_to_num(box_velocity(tables, ann), nan=0.0)
        out[m, :3] = transform_points(lidar_from_global, centre[None])[0]
        out[m, 3:6] = (length, width, height)
        out[m, 6] = yaw_of(lidar_from_global[:3, :3] @ rotation)  # the box's +x axis, seen from the LiDAR
        out[m, 7:9] = rotate_vectors(lidar_from_global, velocity[None])[0, :2]
    return out


class NuScenesDetection(FrameDataset):
    """nuScenes key frames with ``points`` [N, 5], ``boxes`` [M, 9] and ``box_labels`` [M]
    (indices into ``classes``); ``__getitem__`` voxelises as ``transforms.Voxelize``.

    ``min_points``: boxes with fewer LiDAR points (the annotation's ``num_lidar_pts``) are left
    out (1, as OpenPCDet's FILTER_MIN_POINTS_IN_GT; 0 keeps all).
    """

    def __init__(self, root: Union[str, Path], version: str, split: Optional[str] = None,
                 voxel_size: Union[float, Sequence[float]] = 0.1, transforms: Optional[Callable] = None, *,
                 scenes: Optional[Iterable[str]] = None, sweeps: int = 10,
                 classes: Sequence[str] = DETECTION_CLASSES, min_points: int = 1):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"nuScenes root {str(self.root)!r} does not exist")
        check_sweeps(sweeps)
        if split is not None and scenes is not None:
            raise ValueError("give split (a scene list file) or scenes (scene names), not both")
        self.classes = tuple(classes)
        unknown = [c for c in self.classes if c not in DETECTION_CLASSES]
        if not self.classes or unknown or len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes must be distinct detection classes {list(DETECTION_CLASSES)}, got {classes!r}")
        if isinstance(min_points, bool) or not isinstance(min_points, int) or min_points < 0:
            raise ValueError(f"min_points must be a non-negative int, got {min_points!r}")
        self.version, self.sweeps, self.min_points = version, sweeps, min_points
        self.split = split if split is not None else version
        self.tables = NuScenesTables(self.root, version, DETECTION_TABLES)
        names = read_scene_split(self.root, split) if split is not None else scenes
        self.samples = self._samples(self.tables.scene_tokens(names))
        self.transforms = transforms
        self.voxelize = Voxelize(voxel_size)

    point_features = 5  # x, y, z, intensity, time lag

    def _samples(self, scene_tokens: List[str]) -> List[Tuple[str, dict, List[dict]]]:
        """(sample token, key LIDAR_TOP sample_data, annotations) per sample, by scene then time."""
        t = self.tables
        order = {token: i for i, token in enumerate(scene_tokens)}
        key_frames = t.key_lidar_frames(LIDAR_CHANNEL)
        annotations: Dict[str, List[dict]] = {}
        for ann in t.tables["sample_annotation"].values():
            sample = t.value("sample_annotation", ann, "sample_token")
            t.get("sample", sample, t.where("sample_annotation", ann))
            annotations.setdefault(sample, []).append(ann)
        rows = []
        for token, sample in t.tables["sample"].items():
            scene = t.value("sample", sample, "scene_token")
            t.get("scene", scene, t.where("sample", sample))
            if scene not in order:
                continue
            if token not in key_frames:
                raise ValueError(f"sample {token!r} has no {LIDAR_CHANNEL} key frame in {t.file('sample_data')}")
            rows.append((order[scene], t.timestamp("sample", sample), token))
        if not rows:
            raise ValueError(f"the scenes {scene_tokens[:5]} have no samples in {t.file('sample')}")
        return [(token, key_frames[token], annotations.get(token, [])) for _, _, token in sorted(rows)]

    def _class_of(self, annotation: dict) -> Optional[int]:
        t = self.tables
        instance = t.get("instance", t.value("sample_annotation", annotation, "instance_token"),
                         t.where("sample_annotation", annotation))
        category = t.get("category", t.value("instance", instance, "category_token"),
                         t.where("instance", instance))
        name = CATEGORY_TO_DETECTION.get(t.value("category", category, "name"))
        return self.classes.index(name) if name in self.classes else None

    def __len__(self) -> int:
        return len(self.samples)

    def read_frame(self, index: int) -> Dict[str, object]:
        """The raw frame: ``points`` float32 [N, 5], ``boxes`` float32 [M, 9], ``box_labels`` [M]."""
        token, key, annotations = self.samples[index]
        chain = sweep_chain(self.tables, key["token"], self.sweeps)
        points, _, _ = merge_sweeps(chain)
        lidar_from_global = invert_pose(self.tables.global_from_sensor(key))
        # Every annotation of the sample is converted (and so checked), then the kept ones selected.
        boxes = annotation_boxes(self.tables, annotations, lidar_from_global)
        keep, labels = [], []
        for ann in annotations:
            label = self._class_of(ann)
            keep.append(label is not None and
                        self.tables.number("sample_annotation", ann, "num_lidar_pts") >= self.min_points)
            if keep[-1]:
                labels.append(label)
        boxes = boxes[np.asarray(keep, dtype=bool).reshape(-1)]
        path = self.root / key["filename"]
        return {"points": np.ascontiguousarray(points[:, [0, 1, 2, 3, 5]]), "boxes": boxes.astype(np.float32),
                "box_labels": np.asarray(labels, dtype=np.int64), "file": str(path), "token": token,
                "sweeps": len(chain)}


    def __repr__(self) -> str:
        return (f"NuScenesDetection(root={str(self.root)!r}, version={self.version!r}, split={self.split!r}, "
                f"samples={len(self)}, sweeps={self.sweeps}, {self.voxelize!r})")
