"""The nuScenes tables (``ROOT/<version>/*.json``) as records indexed by token, checked as they are
read: a table that is not a JSON list of records, a record without a field a reader needs, a
repeated token or a reference to a token that its table lacks raises ValueError naming the file
and the record.

Field meanings follow the devkit's schema (docs/schema_nuscenes.md there): ``sample_data`` rows
form one ``prev`` / ``next`` chain per sensor (``""`` at the ends of a scene); ``ego_pose`` is the
ego frame's pose in the global frame and ``calibrated_sensor`` the sensor's pose in the ego frame,
each a translation (x, y, z) and a rotation quaternion (w, x, y, z); ``sample_annotation``
boxes are in the global frame; timestamps are microseconds.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Union

import numpy as np

from .poses import pose_matrix

__all__ = ["load_table", "field", "NuScenesTables", "LIDAR_CHANNEL"]

LIDAR_CHANNEL = "LIDAR_TOP"


def load_table(path: Path) -> list:
    """The records of one table file (a JSON list of objects)."""
    if not path.is_file():
        raise FileNotFoundError(f"nuScenes table {str(path)!r} does not exist")
    try:
        table = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"nuScenes table {str(path)!r} is not valid JSON: {err}") from err
    if not isinstance(table, list):
        raise ValueError(f"nuScenes table {str(path)!r} must hold a JSON list of records")
    return table


def field(record: dict, key: str, table: str):
    """``record[key]``, or ValueError naming the table and the record."""
    if not isinstance(record, dict) or key not in record:
        raise ValueError(f"a record of {table} lacks the field {key!r}: {_short(record)}")
    return record[key]


def _short(record) -> str:
    text = repr(record)
    return text if len(text) <= 200 else text[:200] + "...}"


class NuScenesTables:
    """The named tables of ``ROOT/<version>``, each a dict token -> record."""

    def __init__(self, root: Union[str, Path], version: str, names: Iterable[str]):
        self.root = Path(root)
        self.version = version
        self.dir = self.root / version
        if not self.dir.is_dir():
            raise FileNotFoundError(f"nuScenes tables directory {str(self.dir)!r} does not exist")
        self.tables: Dict[str, Dict[str, dict]] = {}
        for name in names:
            rows: Dict[str, dict] = {}
            for record in load_table(self.dir / f"{name}.json"):
                token = field(record, "token", self.file(name))
                if not isinstance(token, str) or not token:
                    raise ValueError(f"{self.file(name)}: a token must be a non-empty string, got {token!r}")
                if token in rows:
                    raise ValueError(f"{self.file(name)}: token {token!r} appears twice")
                rows[token] = record
            self.tables[name] = rows
        self._channels: Dict[str, str] = {}

    def file(self, table: str) -> str:
        return str(self.dir / f"{table}.json")

    def where(self, table: str, record: dict) -> str:
        """A record named for an error: its file and token."""
        return f"{self.file(table)} record {record.get('token')!r}"

    def get(self, table: str, token, referrer: str) -> dict:
        """The record of ``token`` in ``table``; ``referrer`` says who refers to it (for the error)."""
        rows = self.tables[table]
        if not isinstance(token, str) or token not in rows:
            raise ValueError(f"{referrer} refers to {table} token {token!r}, which {self.file(table)} lacks")
        return rows[token]

    def value(self, table: str, record: dict, key: str):
        return field(record, key, self.file(table))

    def number(self, table: str, record: dict, key: str) -> float:
        value = self.value(table, record, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ValueError(f"{self.file(table)}: field {key!r} of {record.get('token')!r} must be a number, "
                             f"got {value!r}")
        return value

    def vector(self, table: str, record: dict, key: str, length: int) -> np.ndarray:
        value = self.value(table, record, key)
        try:
            out = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            out = None
        if out is None or out.shape != (length,) or not np.isfinite(out).all():
            raise ValueError(f"{self.file(table)}: field {key!r} of {record.get('token')!r} must be "
                             f"{length} finite numbers, got {value!r}")
        return out

    def pose(self, table: str, record: dict) -> np.ndarray:
        """The 4 x 4 matrix of an ``ego_pose`` (global from ego) or ``calibrated_sensor`` (ego from
        sensor) record."""
        where = f"{self.file(table)} record {record.get('token')!r}"
        return pose_matrix(self.vector(table, record, "translation", 3), self.vector(table, record, "rotation", 4),
                           where)

    def global_from_sensor(self, sample_data: dict) -> np.ndarray:
        """Where a sweep's sensor was: global from ego (its ego_pose) times ego from sensor."""
        token = sample_data.get("token")
        ego = self.get("ego_pose", self.value("sample_data", sample_data, "ego_pose_token"),
                       self.where("sample_data", sample_data))
        sensor = self.get("calibrated_sensor", self.value("sample_data", sample_data, "calibrated_sensor_token"),
                          self.where("sample_data", sample_data))
        return self.pose("ego_pose", ego) @ self.pose("calibrated_sensor", sensor)

    def channel(self, sample_data: dict) -> str:
        """The sensor channel (e.g. LIDAR_TOP) of a sample_data record."""
        cs_token = self.value("sample_data", sample_data, "calibrated_sensor_token")
        if cs_token not in self._channels:
            cs = self.get("calibrated_sensor", cs_token, self.where("sample_data", sample_data))
            sensor = self.get("sensor", self.value("calibrated_sensor", cs, "sensor_token"),
                              self.where("calibrated_sensor", cs))
            self._channels[cs_token] = self.value("sensor", sensor, "channel")
        return self._channels[cs_token]

    def timestamp(self, table: str, record: dict) -> int:
        value = self.value(table, record, "timestamp")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{self.file(table)}: the timestamp of {record.get('token')!r} must be an integer "
                             f"(microseconds), got {value!r}")
        return value

    def key_lidar_frames(self, channel: str = LIDAR_CHANNEL) -> Dict[str, dict]:
        """sample token -> its key-frame sample_data of ``channel``."""
        out: Dict[str, dict] = {}
        for token, sd in self.tables["sample_data"].items():
            if self.value("sample_data", sd, "is_key_frame") is not True or self.channel(sd) != channel:
                continue
            sample = self.value("sample_data", sd, "sample_token")
            self.get("sample", sample, self.where("sample_data", sd))
            if sample in out:
                raise ValueError(f"{self.file('sample_data')}: sample {sample!r} has two {channel} key frames "
                                 f"({out[sample]['token']!r} and {token!r})")
            out[sample] = sd
        return out

    def scene_tokens(self, names: Optional[Iterable[str]]) -> List[str]:
        """The scene tokens of the named scenes (in the order given), or of every scene."""
        scenes = self.tables["scene"]
        if names is None:
            return list(scenes)
        if isinstance(names, str):
            raise TypeError(f"scenes must be a list of scene names, e.g. ['scene-0061'], got {names!r}")
        by_name = {self.value("scene", r, "name"): t for t, r in scenes.items()}
        names = list(names)
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"unknown scenes {unknown[:5]} (the tables list {len(by_name)} scenes)")
        return [by_name[n] for n in names]
