"""Tiny nuScenes tables written by hand (JSON records in the devkit's schema), for tests that must
not rely on the library's own writer: one scene, one LIDAR_TOP sensor, sweeps with given poses."""
import json
import math
from pathlib import Path

import numpy as np


def axis_angle_quaternion(axis, angle):
    n = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    return [math.cos(angle / 2)] + (n * math.sin(angle / 2)).tolist()


def rodrigues(axis, angle):
    n = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    cross = np.array([[0, -n[2], n[1]], [n[2], 0, -n[0]], [-n[1], n[0], 0]])
    return math.cos(angle) * np.eye(3) + math.sin(angle) * cross + (1 - math.cos(angle)) * np.outer(n, n)


class HandTables:
    """Records appended by the test, written as ROOT/<version>/*.json."""

    def __init__(self, cs_axis=(0.1, -0.2, 1.0), cs_angle=-1.5, cs_translation=(0.9, 0.1, 1.8)):
        self.cs_rotation = rodrigues(cs_axis, cs_angle)
        self.cs_translation = np.asarray(cs_translation, dtype=np.float64)
        self.tables = {name: [] for name in ("scene", "sample", "sample_data", "ego_pose", "calibrated_sensor",
                                             "sensor", "lidarseg", "sample_annotation", "instance", "category")}
        self.tables["sensor"].append({"token": "sensor", "channel": "LIDAR_TOP", "modality": "lidar"})
        self.tables["calibrated_sensor"].append({"token": "cs", "sensor_token": "sensor",
                                                 "translation": list(cs_translation),
                                                 "rotation": axis_angle_quaternion(cs_axis, cs_angle),
                                                 "camera_intrinsic": []})
        self.tables["scene"].append({"token": "scene", "name": "scene-hand", "description": "", "log_token": "log",
                                     "nbr_samples": 0, "first_sample_token": "", "last_sample_token": ""})

    def ego_rotation(self, axis, angle):
        return rodrigues(axis, angle)

    def add_sweep(self, root: Path, token: str, timestamp: int, ego_translation, ego_axis, ego_angle,
                  world_points: np.ndarray, extra: np.ndarray, *, sample: str, key: bool, prev: str = "",
                  next: str = ""):
        """A sweep whose points are given in the global frame (float64 [N, 3], with extra columns
        [N, 2]): the file gets them in the sensor frame, by hand: p_s = Rc^T (Re^T (p_g - te) - tc)."""
        re, te = rodrigues(ego_axis, ego_angle), np.asarray(ego_translation, dtype=np.float64)
        ego = (world_points - te) @ re
        sensor = (ego - self.cs_translation) @ self.cs_rotation
        rel = f"{'samples' if key else 'sweeps'}/LIDAR_TOP/{token}.pcd.bin"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        np.concatenate([sensor, extra], 1).astype("<f4").tofile(root / rel)
        self.tables["ego_pose"].append({"token": f"ego-{token}", "timestamp": timestamp,
                                        "translation": list(map(float, te)),
                                        "rotation": axis_angle_quaternion(ego_axis, ego_angle)})
        self.tables["sample_data"].append({
            "token": token, "sample_token": sample, "ego_pose_token": f"ego-{token}", "calibrated_sensor_token": "cs",
            "filename": rel, "fileformat": "pcd", "width": 0, "height": 0, "timestamp": timestamp,
            "is_key_frame": key, "prev": prev, "next": next})
        return sensor

    def add_sample(self, token, timestamp, prev="", next=""):
        self.tables["sample"].append({"token": token, "timestamp": timestamp, "scene_token": "scene",
                                      "prev": prev, "next": next})

    def add_labels(self, root: Path, sd_token: str, raw: np.ndarray) -> str:
        rel = f"lidarseg/v1.0-hand/{sd_token}_lidarseg.bin"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        raw.astype(np.uint8).tofile(root / rel)
        self.tables["lidarseg"].append({"token": f"ls-{sd_token}", "sample_data_token": sd_token, "filename": rel})
        return rel

    def add_annotation(self, token, sample, instance, category, centre, size_wlh, axis, angle, *, prev="", next="",
                       num_lidar_pts=10):
        if not any(c["name"] == category for c in self.tables["category"]):
            self.tables["category"].append({"token": f"cat-{category}", "name": category, "description": ""})
        if not any(i["token"] == instance for i in self.tables["instance"]):
            self.tables["instance"].append({"token": instance, "category_token": f"cat-{category}",
                                            "nbr_annotations": 1, "first_annotation_token": token,
                                            "last_annotation_token": token})
        self.tables["sample_annotation"].append({
            "token": token, "sample_token": sample, "instance_token": instance, "visibility_token": "",
            "attribute_tokens": [], "translation": list(map(float, centre)), "size": list(map(float, size_wlh)),
            "rotation": axis_angle_quaternion(axis, angle), "prev": prev, "next": next,
            "num_lidar_pts": num_lidar_pts, "num_radar_pts": 0})

    def write(self, root: Path, version: str = "v1.0-hand") -> Path:
        folder = root / version
        folder.mkdir(parents=True, exist_ok=True)
        for name, rows in self.tables.items():
            (folder / f"{name}.json").write_text(json.dumps(rows))
        return folder
