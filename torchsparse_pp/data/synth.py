"""Synthetic datasets on disk, in the exact formats the readers read (``torchsparse-pp synth``).

Each format gets a ``train`` and a ``val`` split of ``scans`` scans (key frames) each. The
semantickitti and detection scans come from ``generate_scan`` (scan k of a run uses seed
``seed + k``); nuscenes and waymo write sequences of one world per split
(``synthetic_sequence``, seed ``seed + split number``):

- ``semantickitti`` (64 beams): ``sequences/00`` (train) and ``sequences/08`` (val), velodyne
  ``.bin`` and ``.label`` files with raw SemanticKITTI ids. To exercise the learning map the
  raw ids are not only the canonical ones: moving objects (a random third of the cars and
  people) get the "moving" ids 252/254, bright road points (intensity > 0.2) the lane-marking
  id 60. Car and person points carry instance ids (upper 16 bits): 1 + the index of the box
  holding them.
- ``nuscenes`` (32 beams): ``synth_nuscenes``: per split one scene (``synth-train``,
  ``synth-val``) of ``scans`` key frames with ``sweeps`` sweeps per key-frame interval, ego poses,
  the LiDAR's calibration, lidarseg labels and annotated boxes (with prev / next chains for
  velocities); read by ``NuScenesLidarSeg`` (index files or tables) and ``NuScenesDetection``.
- ``detection`` (64 beams): the ``detection`` module's layout, with the generator's car and
  person boxes.
- ``waymo`` (the 64-beam ``waymo64`` pattern): ``synth_waymo``: per split one segment of
  ``scans`` frames in OpenPCDet's processed layout; read by ``WaymoDataset``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple, Union

import numpy as np
from tqdm import tqdm

from ..io import write_bin
from . import synthetic
from .detection import write_boxes
from .synth_nuscenes import KEY_INTERVAL_SWEEPS, write_nuscenes
from .synth_waymo import write_waymo
from .synthetic import BOX_CLASSES, generate_scan

__all__ = ["FORMATS", "write_synthetic"]

FORMATS = ("semantickitti", "nuscenes", "detection", "waymo")
SPLIT_NAMES = ("train", "val")
_KITTI_SEQUENCE = {"train": "00", "val": "08"}

_CAR, _PERSON, _ROAD = synthetic.CAR, synthetic.PERSON, synthetic.ROAD
_MOVING = {_CAR: 252, _PERSON: 254}
_LANE_MARKING = 60
_LANE_MARKING_MIN_INTENSITY = 0.2  # lane paint is ~4x brighter than asphalt
_MOVING_FRACTION = 1 / 3


def _points_in_boxes(xyz: np.ndarray, boxes: np.ndarray, margin: float) -> np.ndarray:
    """Index of the first box (grown by margin) holding each point, -1 for none."""
    owner = np.full(len(xyz), -1, dtype=np.int64)
    for m in range(len(boxes) - 1, -1, -1):
        d = xyz - boxes[m, :3]
        c, s = np.cos(boxes[m, 6]), np.sin(boxes[m, 6])
        inside = ((np.abs(d[:, 0] * c + d[:, 1] * s) <= boxes[m, 3] / 2 + margin)
                  & (np.abs(-d[:, 0] * s + d[:, 1] * c) <= boxes[m, 4] / 2 + margin)
                  & (np.abs(d[:, 2]) <= boxes[m, 5] / 2 + margin))
        owner[inside] = m
    return owner


def _instances(scan: Dict[str, np.ndarray]) -> np.ndarray:
    """Per point: 1 + index of the box holding an object point, 0 for stuff."""
    is_object = np.isin(scan["labels"], (_CAR, _PERSON))
    owner = _points_in_boxes(scan["points"][:, :3].astype(np.float64), scan["boxes"].astype(np.float64), 0.15)
    return np.where(is_object & (owner >= 0), owner + 1, 0)


def _kitti_labels(scan: Dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    raw = scan["labels"].astype(np.uint32).copy()
    instances = _instances(scan)
    moving = np.flatnonzero(rng.random(len(scan["boxes"])) < _MOVING_FRACTION) + 1
    for label, moving_id in _MOVING.items():
        raw[(raw == label) & np.isin(instances, moving)] = moving_id
    raw[(raw == _ROAD) & (scan["points"][:, 3] > _LANE_MARKING_MIN_INTENSITY)] = _LANE_MARKING
    return raw | (instances.astype(np.uint32) << 16)


def _write_semantickitti(root: Path, split: str, frame: int, scan: dict, rng) -> None:
    seq = root / "sequences" / _KITTI_SEQUENCE[split]
    (seq / "velodyne").mkdir(parents=True, exist_ok=True)
    (seq / "labels").mkdir(parents=True, exist_ok=True)
    name = f"{frame:06d}"
    write_bin(seq / "velodyne" / f"{name}.bin", scan["points"])
    write_bin(seq / "labels" / f"{name}.label", _kitti_labels(scan, rng)[:, None], dtype=np.uint32)


def _write_detection(root: Path, split: str, frame: int, scan: dict, index: Dict[str, list]) -> None:
    for sub in ("velodyne", "boxes"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    name = f"{frame:06d}"
    write_bin(root / "velodyne" / f"{name}.bin", scan["points"])
    write_boxes(root / "boxes" / f"{name}.txt", scan["boxes"], scan["box_labels"], BOX_CLASSES)
    index[split].append(name)


def write_synthetic(out: Union[str, Path], format: str = "semantickitti", scans: int = 2, seed: int = 0,
                    progress: bool = True, sweeps: int = KEY_INTERVAL_SWEEPS) -> Dict[str, int]:
    """Writes a synthetic dataset of ``format`` into the new or empty directory ``out``.

    Returns the number of scans (key frames) per split (``scans`` each for train and val).
    ``sweeps``: nuScenes sweeps per key-frame interval (the other formats take the default only).
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; choose one of {FORMATS}")
    if isinstance(scans, bool) or not isinstance(scans, int) or scans < 1:
        raise ValueError(f"scans must be a positive int (scans per split), got {scans!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 1:
        raise ValueError(f"sweeps must be a positive int (sweeps per key-frame interval), got {sweeps!r}")
    if format != "nuscenes" and sweeps != KEY_INTERVAL_SWEEPS:
        raise ValueError(f"sweeps sets the nuscenes format's sweeps per key frame; {format!r} has none")
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{str(root)!r} exists and is not an empty directory; choose a new --out")
    root.mkdir(parents=True, exist_ok=True)

    bar = tqdm(total=2 * scans * (sweeps if format == "nuscenes" else 1), desc=f"synth {format}", unit="scan",
               disable=not progress)
    if format == "nuscenes":
        write_nuscenes(root, SPLIT_NAMES, scans, seed, sweeps, bar.update)
    elif format == "waymo":
        write_waymo(root, SPLIT_NAMES, scans, seed, bar.update)
    else:
        _write_single_scans(root, format, scans, seed, bar.update)
    bar.close()
    return {split: scans for split in SPLIT_NAMES}


def _write_single_scans(root: Path, format: str, scans: int, seed: int, progress) -> None:
    """semantickitti and detection: independent scans, scan k of the run from seed + k."""
    index: Dict[str, list] = {split: [] for split in SPLIT_NAMES}
    jobs: Tuple[Tuple[str, int], ...] = tuple((split, k) for split in SPLIT_NAMES for k in range(scans))
    for frame, (split, k) in enumerate(jobs):
        scan = generate_scan(64, seed=seed + frame, return_boxes=True)
        rng = np.random.default_rng([seed, frame])  # relabelling draws, apart from the scan's own
        if format == "semantickitti":
            _write_semantickitti(root, split, k, scan, rng)
        else:
            _write_detection(root, split, frame, scan, index)
        progress(1)
    if format == "detection":
        (root / "ImageSets").mkdir()
        for split, names in index.items():
            (root / "ImageSets" / f"{split}.txt").write_text("".join(n + "\n" for n in names))
