"""Rigid transforms of LiDAR frames: unit quaternions, 4 x 4 matrices, and what they do to points,
headings and velocities. Everything is float64.

Conventions (those of the nuScenes tables and of Waymo's poses):

- a quaternion is ``(w, x, y, z)``, scalar first, and rotates a vector v to q v q*;
- a pose ``(translation t, rotation q)`` of frame A in frame B maps a point of A to B as
  ``p_B = R(q) p_A + t``; its 4 x 4 matrix is ``[[R, t], [0, 1]]`` ("B from A");
- a heading (yaw) is the angle of a box's own +x axis about +z, counter-clockwise from +x.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["quaternion_matrix", "matrix_quaternion", "pose_matrix", "invert_pose", "transform_points",
           "rotate_vectors", "yaw_of", "QUATERNION_NORM_TOLERANCE"]

#: A stored unit quaternion may deviate from norm 1 by this much (rounding in the tables);
#: more means the record is not a rotation.
QUATERNION_NORM_TOLERANCE = 1e-3


def quaternion_matrix(q: Sequence[float], where: str = "quaternion") -> np.ndarray:
    """The 3 x 3 rotation of the unit quaternion ``(w, x, y, z)`` (normalised first)."""
    q = np.asarray(q, dtype=np.float64)
    if q.shape != (4,) or not np.isfinite(q).all():
        raise ValueError(f"{where}: a rotation must be 4 finite numbers (w, x, y, z), got {q.tolist()}")
    norm = float(np.linalg.norm(q))
    if abs(norm - 1.0) > QUATERNION_NORM_TOLERANCE:
        raise ValueError(f"{where}: the rotation quaternion {q.tolist()} has norm {norm:.6g}, not 1")
    w, x, y, z = q / norm
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def matrix_quaternion(rotation: np.ndarray) -> np.ndarray:
    """The unit quaternion ``(w, x, y, z)`` with w >= 0 of a 3 x 3 rotation matrix."""
    r = np.asarray(rotation, dtype=np.float64)
    if r.shape != (3, 3) or not np.allclose(r @ r.T, np.eye(3), atol=1e-9) or np.linalg.det(r) < 0:
        raise ValueError(f"not a rotation matrix: {r.tolist()}")
    # Shepperd's choice: divide by the largest of the four candidate terms, never by a small one.
    trace = np.trace(r)
    candidates = [trace, r[0, 0], r[1, 1], r[2, 2]]
    k = int(np.argmax(candidates))
    if k == 0:
        s = 2.0 * np.sqrt(1.0 + trace)
        q = [s / 4, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
    elif k == 1:
        s = 2.0 * np.sqrt(1.0 + r[0, 0] - r[1, 1] - r[2, 2])
        q = [(r[2, 1] - r[1, 2]) / s, s / 4, (r[0, 1] + r[1, 0]) / s, (r[0, 2] + r[2, 0]) / s]
    elif k == 2:
        s = 2.0 * np.sqrt(1.0 + r[1, 1] - r[0, 0] - r[2, 2])
        q = [(r[0, 2] - r[2, 0]) / s, (r[0, 1] + r[1, 0]) / s, s / 4, (r[1, 2] + r[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + r[2, 2] - r[0, 0] - r[1, 1])
        q = [(r[1, 0] - r[0, 1]) / s, (r[0, 2] + r[2, 0]) / s, (r[1, 2] + r[2, 1]) / s, s / 4]
    q = np.asarray(q)
    return q if q[0] >= 0 else -q


def pose_matrix(translation: Sequence[float], rotation: Sequence[float], where: str = "pose") -> np.ndarray:
    """``[[R(q), t], [0, 1]]``: the 4 x 4 matrix of a pose (translation, quaternion)."""
    t = np.asarray(translation, dtype=np.float64)
    if t.shape != (3,) or not np.isfinite(t).all():
        raise ValueError(f"{where}: a translation must be 3 finite numbers (x, y, z), got {np.asarray(translation).tolist()}")
    out = np.eye(4)
    out[:3, :3] = quaternion_matrix(rotation, where)
    out[:3, 3] = t
    return out


def invert_pose(matrix: np.ndarray) -> np.ndarray:
    """The inverse of a rigid 4 x 4 transform (R^T, -R^T t): exact, no general matrix inverse."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (4, 4):
        raise ValueError(f"a pose matrix is 4 x 4, got {m.shape}")
    out = np.eye(4)
    out[:3, :3] = m[:3, :3].T
    out[:3, 3] = -m[:3, :3].T @ m[:3, 3]
    return out


def transform_points(matrix: np.ndarray, xyz: np.ndarray) -> np.ndarray:
    """Points ``[N, 3]`` mapped by a 4 x 4 rigid transform, in float64."""
    xyz = np.asarray(xyz, dtype=np.float64)
    return xyz @ matrix[:3, :3].T + matrix[:3, 3]


def rotate_vectors(matrix: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Free vectors ``[N, 3]`` (velocities) mapped by the rotation part only."""
    return np.asarray(vectors, dtype=np.float64) @ np.asarray(matrix, dtype=np.float64)[:3, :3].T


def yaw_of(rotation: np.ndarray) -> float:
    """The heading of a frame whose orientation is ``rotation`` (3 x 3): the angle of its +x axis
    projected on the x-y plane, as the devkit's quaternion_yaw measures it."""
    return float(np.arctan2(rotation[1, 0], rotation[0, 0]))
