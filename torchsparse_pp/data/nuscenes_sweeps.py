"""Multi-sweep nuScenes point clouds: the key frame plus the sweeps before it, in the key frame's
LiDAR frame, with a time-lag channel.

As the devkit's ``LidarPointCloud.from_file_multisweep`` defines it: the sweeps are the key
frame's sample_data and its ``prev`` chain (same sensor, earlier timestamps), newest first; a
sweep's points go sensor -> ego (its calibrated_sensor) -> global (its ego_pose) -> key ego
(inverse of the key frame's ego_pose) -> key sensor (inverse of the key calibrated_sensor); the
time lag is the key frame's timestamp minus the sweep's, in seconds (0 on the key frame). Where
the chain ends (start of a scene) there are fewer sweeps, as in the devkit. Points of earlier
sweeps with |x| < 1 m and |y| < 1 m in their own sensor frame (the ego car's roof) are dropped,
as the devkit does; the key frame keeps every point so per-point labels stay aligned with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

import numpy as np

from ..io import drop_nonfinite, read_bin
from .nuscenes_tables import NuScenesTables
from .poses import invert_pose, transform_points

__all__ = ["check_sweeps", "Sweep", "sweep_chain", "merge_sweeps", "SWEEP_COLUMNS", "CLOSE_RADIUS"]

SWEEP_COLUMNS = 5  # a .pcd.bin record: x, y, z, intensity, ring index
CLOSE_RADIUS = 1.0  # m, the devkit's min_distance


def check_sweeps(sweeps) -> None:
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 1:
        raise ValueError(f"sweeps must be a positive int (1: the key frame alone), got {sweeps!r}")


@dataclass(frozen=True)
class Sweep:
    """One sweep of a chain: its file, the 4 x 4 transform key sensor <- this sensor, its time lag."""
    token: str
    path: Path
    key_from_sweep: np.ndarray
    time_lag: float


def sweep_chain(tables: NuScenesTables, key_token: str, sweeps: int) -> List[Sweep]:
    """The key frame and up to ``sweeps - 1`` earlier sweeps of its prev chain, newest first."""
    check_sweeps(sweeps)
    key = tables.get("sample_data", key_token, "the key frame")
    key_from_global = invert_pose(tables.global_from_sensor(key))
    key_time = tables.timestamp("sample_data", key)
    channel = tables.channel(key)
    chain: List[Sweep] = []
    record, newer_time = key, None
    while True:
        token = record["token"]
        time = tables.timestamp("sample_data", record)
        if newer_time is not None and time >= newer_time:
            raise ValueError(f"{tables.file('sample_data')}: the prev chain of {key_token!r} is broken: "
                             f"{token!r} (timestamp {time}) is not earlier than the sweep after it "
                             f"({newer_time})")
        if tables.channel(record) != channel:
            raise ValueError(f"{tables.file('sample_data')}: the prev chain of {key_token!r} ({channel}) reaches "
                             f"{token!r} of channel {tables.channel(record)}")
        path = tables.root / tables.value("sample_data", record, "filename")
        if not path.is_file():
            raise FileNotFoundError(f"{tables.file('sample_data')}: sweep {token!r} names "
                                    f"{tables.value('sample_data', record, 'filename')!r}, but {str(path)!r} "
                                    "does not exist")
        # The key frame maps to itself exactly (no rounding through a product and its inverse).
        matrix = np.eye(4) if record is key else key_from_global @ tables.global_from_sensor(record)
        chain.append(Sweep(token, path, matrix, (key_time - time) * 1e-6))
        previous = tables.value("sample_data", record, "prev")
        if len(chain) == sweeps or previous == "":
            return chain
        record, newer_time = tables.get("sample_data", previous, f"the prev of {tables.where('sample_data', record)}"), time


def _sweep_points(sweep: Sweep, is_key: bool) -> Tuple[np.ndarray, np.ndarray]:
    """(points [N, 5] in the key frame, kept row mask of the file's finite rows)."""
    points = read_bin(sweep.path, columns=SWEEP_COLUMNS)
    finite = np.isfinite(points).all(1)
    points = drop_nonfinite(points, sweep.path)
    if not is_key:
        close = (np.abs(points[:, 0]) < CLOSE_RADIUS) & (np.abs(points[:, 1]) < CLOSE_RADIUS)
        points = points[~close]
    out = points.copy()
    out[:, :3] = transform_points(sweep.key_from_sweep, points[:, :3]).astype(np.float32)
    return out, finite


def merge_sweeps(chain: List[Sweep]) -> Tuple[np.ndarray, int, np.ndarray]:
    """(points float32 [N, 6]: x, y, z (key frame), intensity, ring, time lag (s); the number of
    key-frame points, which come first in file order; the key file's finite-row mask)."""
    parts, key_count, key_finite = [], 0, None
    for i, sweep in enumerate(chain):
        points, finite = _sweep_points(sweep, i == 0)
        if i == 0:
            key_count, key_finite = len(points), finite
        lag = np.full((len(points), 1), sweep.time_lag, dtype=np.float32)
        parts.append(np.concatenate([points, lag], 1))
    return np.concatenate(parts).astype(np.float32, copy=False), key_count, key_finite
