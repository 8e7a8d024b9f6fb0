"""Sequences of LiDAR sweeps of one street, for the multi-frame formats (nuScenes sweeps, Waymo
segments): the world of ``synthetic.generate_scan`` (street, buildings, trees, parked and driving
cars, pedestrians), a sensor that drives along the street, and objects that move at constant
velocity; every sweep is ray cast from where the sensor is at its time.

Frames: the *scene frame* is the street's (x along the street) with the sensor at its origin at
t = 0; a sweep's points are in its *sensor frame* (x forward, y left, z up, level), whose pose
in the scene frame at time t is ``sensor_poses[k]`` (scene <- sensor, 4 x 4). The ego moves
along +x at ``ego_speed`` following the road's grade, its heading turning at ``yaw_rate``.
Driving cars move along their heading (those in the ego's lane at about the ego's speed),
pedestrians walk along the street; parked cars stand still.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from . import synthetic
from .synthetic import BEAM_PATTERNS, _measure, _Sensor, build_world

__all__ = ["SyntheticSequence", "generate_sequence", "rotation_z"]

EGO_LANE_HALF_WIDTH = 1.5  # m: cars this close to the ego's line drive in its lane


def rotation_z(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


@dataclass
class SyntheticSequence:
    """Sweeps of one world. ``boxes`` are the objects at t = 0 (scene frame, (x, y, z, dx, dy,
    dz, yaw)); ``velocities`` [M, 3] their constant velocities (scene frame, m/s); ``classes`` [M]
    index ``synthetic.BOX_CLASSES``. Per sweep k at ``times[k]``: ``points[k]`` float32 [N, 4]
    (sensor frame; x, y, z, intensity in [0, 1]), ``labels[k]`` raw SemanticKITTI ids,
    ``instances[k]`` the object index of each point (-1 for stuff), ``sensor_poses[k]``."""
    pattern: str
    times: np.ndarray
    sensor_poses: np.ndarray
    points: List[np.ndarray]
    labels: List[np.ndarray]
    instances: List[np.ndarray]
    boxes: np.ndarray
    velocities: np.ndarray
    classes: np.ndarray
    poles: np.ndarray  # [P, 5] pole cylinders (cx, cy, radius, z0, z1), scene frame (static)
    grade: float  # dz / dx of the road along the street

    def boxes_at(self, k: int) -> np.ndarray:
        """[M, 7] float64 boxes at sweep k in that sweep's sensor frame."""
        sensor_from_scene = np.linalg.inv(self.sensor_poses[k])
        out = self.boxes.copy()
        centres = self.boxes[:, :3] + self.velocities * self.times[k]
        out[:, :3] = centres @ sensor_from_scene[:3, :3].T + sensor_from_scene[:3, 3]
        turn = math.atan2(sensor_from_scene[1, 0], sensor_from_scene[0, 0])
        out[:, 6] = (self.boxes[:, 6] + turn + np.pi) % (2 * np.pi) - np.pi
        return out

    def velocities_at(self, k: int) -> np.ndarray:
        """[M, 3] object velocities in sweep k's sensor frame (the world is at rest)."""
        return self.velocities @ np.linalg.inv(self.sensor_poses[k])[:3, :3].T

    def point_counts(self, k: int) -> np.ndarray:
        """Points of each object in sweep k."""
        return np.bincount(self.instances[k] + 1, minlength=len(self.boxes) + 1)[1:]


def _motions(rng: np.random.Generator, scene, ego_speed: float) -> np.ndarray:
    """[M, 3] velocities (scene frame) of the scene's objects; pedestrians' headings are set to
    their walking direction."""
    velocities = np.zeros((len(scene.objects), 3))
    for i, (box, cls) in enumerate(scene.objects):
        if cls == 1:  # a pedestrian walks along the street
            direction = 1.0 if rng.random() < 0.5 else -1.0
            velocities[i] = (direction * rng.uniform(0.5, 1.6), 0.0, 0.0)
            box[6] = 0.0 if direction > 0 else np.pi
            continue
        if abs(box[1] - scene.yc) > scene.rh - scene.park:  # in a parking strip
            continue
        if abs(box[1]) < EGO_LANE_HALF_WIDTH:
            speed = ego_speed + rng.normal(0.0, 0.3)  # keeps its distance to the ego car
        else:
            speed = rng.uniform(3.0, 12.0)
        vx, vy = speed * math.cos(box[6]), speed * math.sin(box[6])
        velocities[i] = (vx, vy, vx * scene.grade)  # cars follow the road's grade
    return velocities


def _scene_at(scene, centre: np.ndarray, psi: float, velocities: np.ndarray, t: float):
    """The scene seen from a sensor at ``centre`` (scene frame) with heading ``psi`` at time t: every
    primitive shifted by -centre, moving objects by their displacement too. Valid when the
    centre follows the road's grade (then the ground planes keep their form)."""
    out = copy.copy(scene)
    cx, cy, cz = centre

    def moved(inst):
        return velocities[inst] * t if inst >= 0 else np.zeros(3)

    out.boxes = [((c[0] - cx + moved(i)[0], c[1] - cy + moved(i)[1], c[2] - cz + moved(i)[2]), size, yaw, lab, r, i)
                 for c, size, yaw, lab, r, i in scene.boxes]
    out.cylinders = [(x - cx + moved(i)[0], y - cy + moved(i)[1], r, z0 - cz + moved(i)[2], z1 - cz + moved(i)[2],
                      lab, refl, i) for x, y, r, z0, z1, lab, refl, i in scene.cylinders]
    out.ellipsoids = [((c[0] - cx, c[1] - cy, c[2] - cz), radii, lab, r, i) for c, radii, lab, r, i in scene.ellipsoids]
    out.yc, out.xc, out.psi = scene.yc - cy, scene.xc - cx, psi
    return out


def generate_sequence(pattern: str, seed: int, times: Sequence[float], *, ego_speed: Optional[float] = None,
                      num_cars: Optional[int] = None) -> SyntheticSequence:
    """Sweeps of one random world at ``times`` (seconds, t = 0 where the scene frame is the sensor's);
    the same seed and times give identical sequences."""
    if pattern not in BEAM_PATTERNS:
        raise ValueError(f"pattern must be one of {sorted(BEAM_PATTERNS)}, got {pattern!r}")
    times = np.asarray(times, dtype=np.float64)
    if times.ndim != 1 or len(times) == 0 or not np.isfinite(times).all():
        raise ValueError(f"times must be a non-empty list of finite seconds, got {times!r}")
    spec = BEAM_PATTERNS[pattern]
    rng = np.random.default_rng(seed)
    sensor = _Sensor(rng, spec)
    speed = float(rng.uniform(4.0, 9.0)) if ego_speed is None else float(ego_speed)
    travel = abs(speed) * float(np.abs(times).max())
    extent = spec["max_range"] + travel
    scene = build_world(rng, spec, extent, num_cars)
    yaw_rate = float(rng.normal(0.0, 0.03))
    velocities = _motions(rng, scene, speed)

    poses, points, labels, instances = [], [], [], []
    for t in times:
        centre = np.array([speed * t, 0.0, scene.grade * speed * t])
        psi = scene.psi + yaw_rate * t
        pose = np.eye(4)
        pose[:3, :3] = rotation_z(-psi)  # the sensor's x axis is at -psi in the scene frame
        pose[:3, 3] = centre
        hits, d_sensor = sensor.cast(rng, _scene_at(scene, centre, psi, velocities, t), extent)
        p, lab, inst = _measure(rng, hits, d_sensor, spec["max_range"])
        poses.append(pose)
        points.append(p)
        labels.append(lab)
        instances.append(inst.astype(np.int64))
    boxes = np.array([box for box, _ in scene.objects], dtype=np.float64).reshape(-1, 7)
    classes = np.array([cls for _, cls in scene.objects], dtype=np.int64)
    poles = np.array([c[:5] for c in scene.cylinders if c[5] == synthetic.POLE], dtype=np.float64).reshape(-1, 5)
    return SyntheticSequence(pattern, times, np.stack(poses), points, labels, instances, boxes, velocities, classes,
                             poles, float(scene.grade))
