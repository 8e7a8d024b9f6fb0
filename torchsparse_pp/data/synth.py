"""Synthetic datasets on disk, in the exact formats the readers read (``torchsparse-pp synth``).

Every scan comes from ``generate_scan`` (scan k of a run uses seed ``seed + k``). Each format
gets a ``train`` and a ``val`` split of ``scans`` scans each:

- ``semantickitti`` (64 beams): ``sequences/00`` (train) and ``sequences/08`` (val), velodyne
  ``.bin`` and ``.label`` files with raw SemanticKITTI ids. To exercise the learning map the
  raw ids are not only the canonical ones: moving objects (a random third of the cars and
  people) get the "moving" ids 252/254, bright road points (intensity > 0.2) the lane-marking
  id 60. Car and person points carry instance ids (upper 16 bits): 1 + the index of the box
  holding them.
- ``nuscenes`` (32 beams): ``.pcd.bin`` sweeps (x, y, z, intensity 0..255, ring index) and
  ``_lidarseg.bin`` labels in nuScenes general-class ids, the index files
  ``splits/{train,val}.txt`` and the tables ``v1.0-synth/{scene,sample,sample_data,lidarseg}.json``
  (scenes ``synth-train`` and ``synth-val``).
- ``detection`` (64 beams): the ``detection`` module's layout, with the generator's car and
  person boxes.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, Tuple, Union

import numpy as np
from tqdm import tqdm

from ..io import write_bin
from . import synthetic
from .detection import write_boxes
from .synthetic import BEAM_PATTERNS, BOX_CLASSES, generate_scan

__all__ = ["FORMATS", "write_synthetic"]

FORMATS = ("semantickitti", "nuscenes", "detection")
SPLIT_NAMES = ("train", "val")
_KITTI_SEQUENCE = {"train": "00", "val": "08"}
_NUSCENES_VERSION = "v1.0-synth"

_CAR, _PERSON, _ROAD = synthetic.CAR, synthetic.PERSON, synthetic.ROAD
_MOVING = {_CAR: 252, _PERSON: 254}
_LANE_MARKING = 60
_LANE_MARKING_MIN_INTENSITY = 0.2  # lane paint is ~4x brighter than asphalt
_MOVING_FRACTION = 1 / 3

# generator's raw SemanticKITTI id -> nuScenes general class id
_TO_NUSCENES = {synthetic.CAR: 17, synthetic.ROAD: 24, synthetic.SIDEWALK: 26, synthetic.TERRAIN: 27,
                synthetic.BUILDING: 28, synthetic.FENCE: 28, synthetic.POLE: 28, synthetic.VEGETATION: 30,
                synthetic.TRUNK: 30}
_NUSCENES_PEDESTRIANS = (2, 3, 4, 6)  # adult, child, construction worker, police officer


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


def _ring_index(points: np.ndarray, pattern: dict) -> np.ndarray:
    """Laser index of each point (0 = top beam), from its elevation and the nominal beam angles;
    range noise acts along the ray, so the elevation identifies the beam."""
    nominal = np.radians(np.concatenate([np.linspace(top, bottom, n) for n, top, bottom in pattern["blocks"]]))
    elevation = np.arctan2(points[:, 2], np.hypot(points[:, 0], points[:, 1]))
    return np.abs(elevation[:, None] - nominal[None, :]).argmin(1)


def _nuscenes_labels(scan: Dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    labels = scan["labels"]
    raw = np.zeros(len(labels), dtype=np.uint8)
    for kitti, general in _TO_NUSCENES.items():
        raw[labels == kitti] = general
    # Each pedestrian is one of the general pedestrian kinds, all one challenge class.
    instances = _instances(scan)
    kinds = rng.choice(_NUSCENES_PEDESTRIANS, size=len(scan["boxes"]) + 1)
    person = labels == _PERSON
    raw[person] = kinds[instances[person]]
    unmapped = set(np.unique(labels).tolist()) - set(_TO_NUSCENES) - {_PERSON}
    if unmapped:
        raise RuntimeError(f"generator labels {sorted(unmapped)} have no nuScenes class in synth.py")
    return raw


def _token(*parts) -> str:
    return hashlib.md5("/".join(str(p) for p in parts).encode()).hexdigest()


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


def _write_nuscenes(root: Path, split: str, frame: int, scan: dict, rng, tables: Dict[str, list],
                    index: Dict[str, list], seed: int) -> None:
    sweeps = root / "samples" / "LIDAR_TOP"
    labels_dir = root / "lidarseg" / _NUSCENES_VERSION
    sweeps.mkdir(parents=True, exist_ok=True)
    labels_dir.mkdir(parents=True, exist_ok=True)
    points = scan["points"]
    ring = _ring_index(points, BEAM_PATTERNS["nuscenes32"])
    record = np.concatenate([points[:, :3], points[:, 3:4] * 255.0, ring[:, None]], 1).astype(np.float32)
    sd_token = _token("sample_data", seed, frame)
    sample_token = _token("sample", seed, frame)
    points_rel = f"samples/LIDAR_TOP/synth__LIDAR_TOP__{frame:06d}.pcd.bin"
    labels_rel = f"lidarseg/{_NUSCENES_VERSION}/{sd_token}_lidarseg.bin"
    write_bin(root / points_rel, record)
    write_bin(root / labels_rel, _nuscenes_labels(scan, rng)[:, None], dtype=np.uint8)
    tables["sample"].append({"token": sample_token, "scene_token": _token("scene", seed, split),
                             "timestamp": frame * 500_000})
    tables["sample_data"].append({"token": sd_token, "sample_token": sample_token, "filename": points_rel,
                                  "fileformat": "pcd", "is_key_frame": True, "timestamp": frame * 500_000})
    tables["lidarseg"].append({"token": _token("lidarseg", seed, frame), "sample_data_token": sd_token,
                               "filename": labels_rel})
    index[split].append(f"{points_rel} {labels_rel}")


def write_synthetic(out: Union[str, Path], format: str = "semantickitti", scans: int = 2, seed: int = 0,
                    progress: bool = True) -> Dict[str, int]:
    """Writes a synthetic dataset of ``format`` into the new or empty directory ``out``.

    Returns the number of scans per split (``scans`` each for train and val).
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; choose one of {FORMATS}")
    if isinstance(scans, bool) or not isinstance(scans, int) or scans < 1:
        raise ValueError(f"scans must be a positive int (scans per split), got {scans!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{str(root)!r} exists and is not an empty directory; choose a new --out")
    root.mkdir(parents=True, exist_ok=True)

    beams = 32 if format == "nuscenes" else 64
    index: Dict[str, list] = {split: [] for split in SPLIT_NAMES}
    tables: Dict[str, list] = {"sample": [], "sample_data": [], "lidarseg": []}
    jobs: Tuple[Tuple[str, int], ...] = tuple((split, k) for split in SPLIT_NAMES for k in range(scans))
    for frame, (split, k) in enumerate(tqdm(jobs, desc=f"synth {format}", unit="scan", disable=not progress)):
        scan = generate_scan(beams, seed=seed + frame, return_boxes=True)
        rng = np.random.default_rng([seed, frame])  # relabelling draws, apart from the scan's own
        if format == "semantickitti":
            _write_semantickitti(root, split, k, scan, rng)
        elif format == "detection":
            _write_detection(root, split, frame, scan, index)
        else:
            _write_nuscenes(root, split, frame, scan, rng, tables, index, seed)

    if format == "detection":
        (root / "ImageSets").mkdir()
        for split, names in index.items():
            (root / "ImageSets" / f"{split}.txt").write_text("".join(n + "\n" for n in names))
    elif format == "nuscenes":
        (root / "splits").mkdir()
        for split, lines in index.items():
            (root / "splits" / f"{split}.txt").write_text("".join(line + "\n" for line in lines))
        tables["scene"] = [{"token": _token("scene", seed, split), "name": f"synth-{split}",
                            "nbr_samples": scans} for split in SPLIT_NAMES]
        version = root / _NUSCENES_VERSION
        version.mkdir()
        for name, rows in tables.items():
            (version / f"{name}.json").write_text(json.dumps(rows, indent=1))
    return {split: scans for split in SPLIT_NAMES}
