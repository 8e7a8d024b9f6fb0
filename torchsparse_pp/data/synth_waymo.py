"""A synthetic Waymo dataset in OpenPCDet's processed layout (see ``waymo``): per split one
segment (one generated world, seed + split number, the 64-beam ``waymo64`` pattern) of ``scans``
frames at 10 Hz, with per-frame .npy points in the vehicle frame, the segment's info .pkl (poses
and annotations as OpenPCDet 0.6 writes them: ``gt_boxes_lidar`` [M, 9] with the velocity,
``speed_global``) and the split's combined ``<tag>_infos_<split>.pkl``.

Geometry: the vehicle frame has its origin on the road below the LiDAR, which sits at
``SENSOR_OFFSET``; the vehicle is pitched by the road's grade (so the poses are not yaw-only);
the global frame is the scene frame turned and shifted by a random rigid transform. Cars are
Vehicle, pedestrians Pedestrian or (one in four) Cyclist; the first poles are labelled Sign (a
class the detection set leaves out). A frame annotates the objects that hold at least one of its
points. Elongation is drawn in [0, 0.3); points in one random 10-degree sector carry the
no-label-zone flag 1, the others -1.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Dict, List

import numpy as np

from .synthetic_sequence import generate_sequence, rotation_z
from .waymo import DEFAULT_TAG, FRAME_INTERVAL

__all__ = ["write_waymo", "SENSOR_OFFSET", "segment_name"]

SENSOR_OFFSET = (1.43, 0.0, 2.18)  # m, the top LiDAR in the vehicle frame
SIGN_POLES = 2
_START_TIME = 1_557_845_000_000_000  # microseconds


def segment_name(seed: int, number: int) -> str:
    return f"segment-{seed:08d}{number:04d}_with_camera_labels"


def _rigid(rotation: np.ndarray, translation) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = rotation, translation
    return out


def _pitch(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _frame_annos(seq, k: int, vehicle_from_scene: np.ndarray, global_from_vehicle: np.ndarray,
                 names: np.ndarray, sign_boxes: np.ndarray) -> dict:
    counts = seq.point_counts(k)
    shown = np.flatnonzero(counts > 0)
    centres = seq.boxes[shown, :3] + seq.velocities[shown] * seq.times[k]
    location = centres @ vehicle_from_scene[:3, :3].T + vehicle_from_scene[:3, 3]
    axes = np.stack([np.cos(seq.boxes[shown, 6]), np.sin(seq.boxes[shown, 6]), np.zeros(len(shown))], 1)
    moved = axes @ vehicle_from_scene[:3, :3].T
    heading = np.arctan2(moved[:, 1], moved[:, 0])
    speed_global = (seq.velocities[shown] @ (global_from_vehicle[:3, :3] @ vehicle_from_scene[:3, :3]).T)[:, :2]
    # OpenPCDet: the global speed (z = 0) into the vehicle frame
    speed = np.pad(speed_global, ((0, 0), (0, 1))) @ global_from_vehicle[:3, :3]
    dims = seq.boxes[shown, 3:6]
    sign_location = sign_boxes[:, :3] @ vehicle_from_scene[:3, :3].T + vehicle_from_scene[:3, 3]
    all_names = np.concatenate([names[shown], np.array(["Sign"] * len(sign_boxes))])
    boxes = np.concatenate([
        np.concatenate([location, dims, heading[:, None], speed[:, :2]], 1),
        np.concatenate([sign_location, sign_boxes[:, 3:6], np.zeros((len(sign_boxes), 3))], 1)])
    m = len(all_names)
    return {"name": all_names, "difficulty": np.zeros(m, np.int32), "dimensions": boxes[:, 3:6],
            "location": boxes[:, :3], "heading_angles": boxes[:, 6],
            "obj_ids": np.array([f"obj{i}" for i in shown] + [f"sign{j}" for j in range(len(sign_boxes))]),
            "tracking_difficulty": np.zeros(m, np.int32),
            "num_points_in_gt": np.concatenate([counts[shown], np.zeros(len(sign_boxes), np.int64)]),
            "speed_global": np.concatenate([speed_global, np.zeros((len(sign_boxes), 2))]),
            "accel_global": np.zeros((m, 2)), "gt_boxes_lidar": boxes}


def _segment(root: Path, tag: str, seed: int, number: int, scans: int, progress) -> List[dict]:
    name = segment_name(seed, number)
    folder = root / tag / name
    folder.mkdir(parents=True)
    seq = generate_sequence("waymo64", seed + number, np.arange(scans) * FRAME_INTERVAL)
    progress(scans)
    rng = np.random.default_rng([seed + number, 3])
    global_from_scene = _rigid(rotation_z(rng.uniform(-np.pi, np.pi)), (*rng.uniform(-5000, 5000, 2), 100.0))
    names = np.array(["Vehicle" if c == 0 else ("Cyclist" if rng.random() < 0.25 else "Pedestrian")
                      for c in seq.classes])
    poles = seq.poles[:SIGN_POLES]  # (cx, cy, r, z0, z1): a sign box around the pole's top metre
    signs = np.stack([poles[:, 0], poles[:, 1], poles[:, 4] - 0.5, np.full(len(poles), 0.6),
                      np.full(len(poles), 0.6), np.ones(len(poles))], 1) if len(poles) else np.zeros((0, 6))
    # The grade's pitch: the vehicle's x axis climbs with the road.
    vehicle_from_sensor = _rigid(_pitch(np.arctan(seq.grade)), SENSOR_OFFSET)
    nlz_start = rng.uniform(-np.pi, np.pi)
    infos = []
    for k in range(scans):
        global_from_vehicle = global_from_scene @ seq.sensor_poses[k] @ np.linalg.inv(vehicle_from_sensor)
        vehicle_from_scene = np.linalg.inv(global_from_vehicle) @ global_from_scene
        xyz = seq.points[k][:, :3].astype(np.float64) @ vehicle_from_sensor[:3, :3].T + vehicle_from_sensor[:3, 3]
        azimuth = np.arctan2(seq.points[k][:, 1], seq.points[k][:, 0])
        in_nlz = ((azimuth - nlz_start) % (2 * np.pi)) < np.radians(10.0)
        columns = [xyz, seq.points[k][:, 3:4], rng.uniform(0.0, 0.3, (len(xyz), 1)),
                   np.where(in_nlz, 1.0, -1.0)[:, None]]
        np.save(folder / f"{k:04d}.npy", np.concatenate(columns, 1).astype(np.float32))
        time = _START_TIME + number * 3_600_000_000 + int(round(seq.times[k] * 1e6))
        infos.append({
            "point_cloud": {"num_features": 5, "lidar_sequence": name, "sample_idx": k},
            "frame_id": f"{name}_{k:03d}",
            "metadata": {"context_name": name[len("segment-"):-len("_with_camera_labels")],
                         "timestamp_micros": time},
            "image": {f"image_shape_{j}": (1280, 1920) if j < 3 else (886, 1920) for j in range(5)},
            "pose": global_from_vehicle.astype(np.float32),
            "annos": _frame_annos(seq, k, vehicle_from_scene, global_from_vehicle, names, signs),
            "num_points_of_each_lidar": [len(xyz), 0, 0, 0, 0],
        })
    with open(folder / f"{name}.pkl", "wb") as f:
        pickle.dump(infos, f)
    return infos


def write_waymo(root: Path, splits, scans: int, seed: int, progress, tag: str = DEFAULT_TAG) -> None:
    """Writes one segment per split (see the module docstring); ``progress(n)`` is called with the
    number of frames cast."""
    (root / "ImageSets").mkdir(parents=True)
    combined: Dict[str, List[dict]] = {}
    for number, split in enumerate(splits):
        combined[split] = _segment(root, tag, seed, number, scans, progress)
        (root / "ImageSets" / f"{split}.txt").write_text(f"{segment_name(seed, number)}.tfrecord\n")
    for split, infos in combined.items():
        with open(root / f"{tag}_infos_{split}.pkl", "wb") as f:
            pickle.dump(infos, f)
