"""A synthetic nuScenes dataset on disk: per split one scene (one generated world, seed + split
number) of ``scans`` key frames at 2 Hz with ``sweeps`` LIDAR_TOP sweeps per key-frame interval
(20 Hz: 10), so that every key frame, the first included, has a full chain of that many.

Written (the layout and tables the readers of ``nuscenes``, ``nuscenes_sweeps`` and
``nuscenes_detection`` read, in the devkit's schema):

- ``samples/LIDAR_TOP/*.pcd.bin`` (key frames), ``sweeps/LIDAR_TOP/*.pcd.bin`` (the others):
  x, y, z in the LiDAR frame, intensity 0..255, ring index;
- ``lidarseg/v1.0-synth/<token>_lidarseg.bin``: general-class ids of the key frames' points;
- ``v1.0-synth/``: scene, sample, sample_data (prev / next chains), ego_pose (one per sweep),
  calibrated_sensor and sensor (LIDAR_TOP), log, category (with lidarseg indices), instance,
  sample_annotation (global boxes, prev / next per instance), lidarseg;
- ``splits/<split>.txt`` (lidarseg index) and ``splits/<split>_scenes.txt`` (scene names).

Geometry: the LiDAR frame is the nuScenes one (x right, y forward of the car): it is the
generator's level sensor frame (x forward) turned by -90 degrees about z and tilted a little; the
calibrated_sensor rotation is that turn with a slightly different tilt, so the ego_pose
rotations carry some roll and pitch (every quaternion is a general rotation). The global frame
is the scene frame turned and shifted by a random rigid transform. Cars are ``vehicle.car`` or
(one in six) ``vehicle.emergency.police`` (not a detection class; ignored in lidarseg);
pedestrians one of the adult, child, construction-worker, police-officer or personal-mobility
kinds (the last is not a detection class). An object is annotated in a key frame when it holds
a point of it or its centre lies within 30 m; ``num_lidar_pts`` counts its points.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, List

import numpy as np

from ..io import write_bin
from . import synthetic
from .nuscenes import RAW_CLASS_NAMES
from .poses import invert_pose, matrix_quaternion
from .synthetic import BEAM_PATTERNS
from .synthetic_sequence import SyntheticSequence, generate_sequence, rotation_z

__all__ = ["write_nuscenes", "VERSION", "SWEEP_INTERVAL", "KEY_INTERVAL_SWEEPS", "ring_index"]

VERSION = "v1.0-synth"
SWEEP_INTERVAL = 0.05  # s (20 Hz)
KEY_INTERVAL_SWEEPS = 10  # sweeps per key frame interval (2 Hz samples)
ANNOTATION_RADIUS = 30.0  # m: objects this close are annotated even without points
_START_TIME = 1_533_151_603_000_000  # microseconds, any plausible Unix time

# generator's raw SemanticKITTI id -> nuScenes general class id (objects take their instance's)
TO_GENERAL = {synthetic.ROAD: 24, synthetic.SIDEWALK: 26, synthetic.TERRAIN: 27, synthetic.BUILDING: 28,
              synthetic.FENCE: 28, synthetic.POLE: 28, synthetic.VEGETATION: 30, synthetic.TRUNK: 30}
CAR_KINDS = ("vehicle.car",) * 5 + ("vehicle.emergency.police",)
PEDESTRIAN_KINDS = ("human.pedestrian.adult", "human.pedestrian.adult", "human.pedestrian.child",
                    "human.pedestrian.construction_worker", "human.pedestrian.police_officer",
                    "human.pedestrian.personal_mobility")
LIDAR_TRANSLATION = (0.943, 0.0, 1.84)  # m, LIDAR_TOP in the ego frame (about nuScenes')


def token(*parts) -> str:
    return hashlib.md5("/".join(str(p) for p in parts).encode()).hexdigest()


def ring_index(points: np.ndarray, pattern: dict) -> np.ndarray:
    """Laser index of each point (0 = top beam), from its elevation in the level sensor frame and
    the nominal beam angles; range noise acts along the ray, so the elevation identifies the beam."""
    nominal = np.radians(np.concatenate([np.linspace(top, bottom, n) for n, top, bottom in pattern["blocks"]]))
    elevation = np.arctan2(points[:, 2], np.hypot(points[:, 0], points[:, 1]))
    return np.abs(elevation[:, None] - nominal[None, :]).argmin(1)


def _tilt(rng, degrees: float) -> np.ndarray:
    a, b = np.radians(rng.normal(0.0, degrees, 2))
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    return rx @ ry


def _rigid(rotation: np.ndarray, translation) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = rotation, translation
    return out


def _pose_record(tok: str, matrix: np.ndarray, **extra) -> dict:
    return {"token": tok, "translation": matrix[:3, 3].tolist(), "rotation": matrix_quaternion(matrix[:3, :3]).tolist(),
            **extra}


class _Writer:
    def __init__(self, root: Path, seed: int):
        self.root, self.seed = root, seed
        self.tables: Dict[str, List[dict]] = {name: [] for name in (
            "scene", "sample", "sample_data", "ego_pose", "calibrated_sensor", "sensor", "log", "category",
            "instance", "sample_annotation", "lidarseg")}
        self.index: Dict[str, List[str]] = {}
        rng = np.random.default_rng([seed, 1])
        # level generator frame <- file's LiDAR frame, and ego <- LiDAR (a slightly different tilt)
        self.gen_from_lidar = rotation_z(-np.pi / 2) @ _tilt(rng, 0.4)
        self.ego_from_lidar = _rigid(rotation_z(-np.pi / 2) @ _tilt(rng, 0.4), LIDAR_TRANSLATION)
        self.sensor_token, self.cs_token = token("sensor", seed), token("calibrated_sensor", seed)
        self.tables["sensor"].append({"token": self.sensor_token, "channel": "LIDAR_TOP", "modality": "lidar"})
        self.tables["calibrated_sensor"].append(_pose_record(self.cs_token, self.ego_from_lidar,
                                                             sensor_token=self.sensor_token, camera_intrinsic=[]))
        self.category_tokens = {name: token("category", seed, name) for name in RAW_CLASS_NAMES}
        self.tables["category"] = [{"token": t, "name": n, "description": "", "index": RAW_CLASS_NAMES.index(n)}
                                   for n, t in self.category_tokens.items()]
        for d in ("samples/LIDAR_TOP", "sweeps/LIDAR_TOP", f"lidarseg/{VERSION}"):
            (root / d).mkdir(parents=True, exist_ok=True)

    def scene(self, split: str, number: int, scans: int, sweeps: int, progress) -> None:
        seed = self.seed + number
        self.start = _START_TIME + number * 3_600_000_000  # scenes an hour apart
        rng = np.random.default_rng([seed, 2])
        count = scans * sweeps
        times = (np.arange(count) - (sweeps - 1)) * SWEEP_INTERVAL  # key frame 0 at t = 0
        seq = generate_sequence("nuscenes32", seed, times)
        progress(count)
        global_from_scene = _rigid(rotation_z(rng.uniform(-np.pi, np.pi)), (*rng.uniform(300, 1500, 2), 0.0))
        kinds = [CAR_KINDS[rng.integers(len(CAR_KINDS))] if c == 0 else
                 PEDESTRIAN_KINDS[rng.integers(len(PEDESTRIAN_KINDS))] for c in seq.classes]
        scene_token = token("scene", seed, split)
        keys = [k for k in range(count) if k % sweeps == sweeps - 1]
        sample_tokens = [token("sample", seed, k) for k in keys]
        for i, (k, tok) in enumerate(zip(keys, sample_tokens)):
            self.tables["sample"].append({"token": tok, "timestamp": self._time(seq, k), "scene_token": scene_token,
                                          "prev": sample_tokens[i - 1] if i else "",
                                          "next": sample_tokens[i + 1] if i + 1 < len(keys) else ""})
        self.tables["log"].append({"token": token("log", seed), "logfile": f"synth-{seed}", "vehicle": "synth",
                                   "date_captured": "2018-08-01", "location": "synthetic"})
        self.tables["scene"].append({"token": scene_token, "name": f"synth-{split}", "description": "",
                                     "log_token": token("log", seed), "nbr_samples": len(keys),
                                     "first_sample_token": sample_tokens[0], "last_sample_token": sample_tokens[-1]})
        sd_tokens = [token("sample_data", seed, k) for k in range(count)]
        self.index[split] = []
        for k in range(count):
            sample = min(keys.index(j) for j in keys if j >= k)  # the sample that follows closest
            self._sweep(seq, k, sd_tokens, sample_tokens[sample], k in keys, global_from_scene, kinds, split)
        self._annotations(seq, keys, sample_tokens, global_from_scene, kinds, seed)

    def _time(self, seq: SyntheticSequence, k: int) -> int:
        return self.start + int(round(seq.times[k] * 1e6))

    def _sweep(self, seq, k, sd_tokens, sample_token, is_key, global_from_scene, kinds, split) -> None:
        global_from_lidar = global_from_scene @ seq.sensor_poses[k] @ _rigid(self.gen_from_lidar, (0, 0, 0))
        global_from_ego = global_from_lidar @ invert_pose(self.ego_from_lidar)
        pose_token = token("ego_pose", self.seed, sd_tokens[k])
        self.tables["ego_pose"].append(_pose_record(pose_token, global_from_ego, timestamp=self._time(seq, k)))
        level = seq.points[k]
        xyz = level[:, :3].astype(np.float64) @ self.gen_from_lidar  # = gen_from_lidar^T p: into the LiDAR frame
        ring = ring_index(level, BEAM_PATTERNS["nuscenes32"])
        record = np.concatenate([xyz, level[:, 3:4] * 255.0, ring[:, None]], 1).astype(np.float32)
        folder = "samples" if is_key else "sweeps"
        rel = f"{folder}/LIDAR_TOP/synth{self.seed}__LIDAR_TOP__{self._time(seq, k)}.pcd.bin"
        write_bin(self.root / rel, record)
        self.tables["sample_data"].append({
            "token": sd_tokens[k], "sample_token": sample_token, "ego_pose_token": pose_token,
            "calibrated_sensor_token": self.cs_token, "filename": rel, "fileformat": "pcd", "width": 0, "height": 0,
            "timestamp": self._time(seq, k), "is_key_frame": bool(is_key), "prev": sd_tokens[k - 1] if k else "",
            "next": sd_tokens[k + 1] if k + 1 < len(sd_tokens) else ""})
        if is_key:
            labels_rel = f"lidarseg/{VERSION}/{sd_tokens[k]}_lidarseg.bin"
            write_bin(self.root / labels_rel, self._general_ids(seq, k, kinds)[:, None], dtype=np.uint8)
            self.tables["lidarseg"].append({"token": token("lidarseg", self.seed, sd_tokens[k]),
                                            "sample_data_token": sd_tokens[k], "filename": labels_rel})
            self.index[split].append(f"{rel} {labels_rel}")

    @staticmethod
    def _general_ids(seq, k, kinds) -> np.ndarray:
        labels, inst = seq.labels[k], seq.instances[k]
        raw = np.zeros(len(labels), dtype=np.uint8)
        for kitti, general in TO_GENERAL.items():
            raw[labels == kitti] = general
        objects = inst >= 0
        raw[objects] = [RAW_CLASS_NAMES.index(kinds[i]) for i in inst[objects]]
        unmapped = set(np.unique(labels[~objects]).tolist()) - set(TO_GENERAL)
        if unmapped:
            raise RuntimeError(f"generator labels {sorted(unmapped)} have no nuScenes class in synth_nuscenes.py")
        return raw

    def _annotations(self, seq, keys, sample_tokens, global_from_scene, kinds, seed) -> None:
        chains: Dict[int, List[dict]] = {}
        for k, sample in zip(keys, sample_tokens):
            counts = seq.point_counts(k)
            sensor_position = seq.sensor_poses[k][:3, 3]
            for m, (box, velocity) in enumerate(zip(seq.boxes, seq.velocities)):
                centre = box[:3] + velocity * seq.times[k]
                if counts[m] == 0 and np.linalg.norm((centre - sensor_position)[:2]) > ANNOTATION_RADIUS:
                    continue
                box_pose = global_from_scene @ _rigid(rotation_z(box[6]), centre)
                chains.setdefault(m, []).append(_pose_record(
                    token("sample_annotation", seed, k, m), box_pose, sample_token=sample,
                    instance_token=token("instance", seed, m), visibility_token="", attribute_tokens=[],
                    size=[float(box[4]), float(box[3]), float(box[5])],  # width, length, height
                    num_lidar_pts=int(counts[m]), num_radar_pts=0))
        for m, chain in chains.items():
            for i, ann in enumerate(chain):
                ann["prev"] = chain[i - 1]["token"] if i else ""
                ann["next"] = chain[i + 1]["token"] if i + 1 < len(chain) else ""
            self.tables["sample_annotation"] += chain
            self.tables["instance"].append({"token": token("instance", seed, m),
                                            "category_token": self.category_tokens[kinds[m]],
                                            "nbr_annotations": len(chain), "first_annotation_token": chain[0]["token"],
                                            "last_annotation_token": chain[-1]["token"]})

    def finish(self) -> None:
        (self.root / "splits").mkdir(exist_ok=True)
        for split, lines in self.index.items():
            (self.root / "splits" / f"{split}.txt").write_text("".join(line + "\n" for line in lines))
            (self.root / "splits" / f"{split}_scenes.txt").write_text(f"synth-{split}\n")
        version = self.root / VERSION
        version.mkdir(exist_ok=True)
        for name, rows in self.tables.items():
            (version / f"{name}.json").write_text(json.dumps(rows, indent=1))


def write_nuscenes(root: Path, splits, scans: int, seed: int, sweeps: int, progress) -> None:
    """Writes the splits' scenes into ``root`` (see the module docstring); ``progress(n)`` is
    called with the number of sweeps cast."""
    writer = _Writer(root, seed)
    for number, split in enumerate(splits):
        writer.scene(split, number, scans, sweeps, progress)
    writer.finish()
