"""nuScenes-lidarseg reader.

Files (the official formats):

- a sweep ``*.pcd.bin``: float32 (x, y, z, intensity, ring index) per point;
- its lidarseg labels ``*_lidarseg.bin``: one uint8 per point, an id of the 32 general
  classes (``RAW_CLASS_NAMES``), mapped here to the 16 lidarseg challenge classes 0..15
  (``CLASS_NAMES``); the general classes the challenge leaves out become ``IGNORE_INDEX``.

Which files form a split comes from either

- an index file ``ROOT/splits/<split>.txt`` (this library's format): one frame per line,
  ``<points path> <labels path>``, both relative to ROOT and separated by whitespace; blank
  lines and lines starting with ``#`` are skipped. ``torchsparse-pp synth`` writes these; or
- the nuScenes tables (``NuScenesLidarSeg.from_tables``): ``ROOT/<version>/lidarseg.json``
  (``sample_data_token``, ``filename``) joined with ``sample_data.json`` (``token``,
  ``filename``); a ``scenes`` filter by scene name also reads ``sample.json`` and ``scene.json``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
from torch.utils.data import Dataset

from ..io import drop_nonfinite, read_bin
from .transforms import Voxelize

__all__ = ["NuScenesLidarSeg", "CLASS_NAMES", "RAW_CLASS_NAMES", "LEARNING_MAP", "IGNORE_INDEX", "map_labels",
           "read_index", "read_tables"]

IGNORE_INDEX = 255

RAW_CLASS_NAMES = (
    "noise", "animal", "human.pedestrian.adult", "human.pedestrian.child",
    "human.pedestrian.construction_worker", "human.pedestrian.personal_mobility",
    "human.pedestrian.police_officer", "human.pedestrian.stroller", "human.pedestrian.wheelchair",
    "movable_object.barrier", "movable_object.debris", "movable_object.pushable_pullable",
    "movable_object.trafficcone", "static_object.bicycle_rack", "vehicle.bicycle", "vehicle.bus.bendy",
    "vehicle.bus.rigid", "vehicle.car", "vehicle.construction", "vehicle.emergency.ambulance",
    "vehicle.emergency.police", "vehicle.motorcycle", "vehicle.trailer", "vehicle.truck",
    "flat.driveable_surface", "flat.other", "flat.sidewalk", "flat.terrain", "static.manmade",
    "static.other", "static.vegetation", "vehicle.ego",
)

CLASS_NAMES = ("barrier", "bicycle", "bus", "car", "construction_vehicle", "motorcycle", "pedestrian",
               "traffic_cone", "trailer", "truck", "driveable_surface", "other_flat", "sidewalk", "terrain",
               "manmade", "vegetation")

#: general class name -> challenge class name (general classes not listed are ignored)
_GENERAL_TO_CHALLENGE = {
    "movable_object.barrier": "barrier",
    "vehicle.bicycle": "bicycle",
    "vehicle.bus.bendy": "bus", "vehicle.bus.rigid": "bus",
    "vehicle.car": "car",
    "vehicle.construction": "construction_vehicle",
    "vehicle.motorcycle": "motorcycle",
    "human.pedestrian.adult": "pedestrian", "human.pedestrian.child": "pedestrian",
    "human.pedestrian.construction_worker": "pedestrian", "human.pedestrian.police_officer": "pedestrian",
    "movable_object.trafficcone": "traffic_cone",
    "vehicle.trailer": "trailer",
    "vehicle.truck": "truck",
    "flat.driveable_surface": "driveable_surface",
    "flat.other": "other_flat",
    "flat.sidewalk": "sidewalk",
    "flat.terrain": "terrain",
    "static.manmade": "manmade",
    "static.vegetation": "vegetation",
}

#: raw general id -> training class (0..15) or IGNORE_INDEX
LEARNING_MAP: Dict[int, int] = {
    raw: CLASS_NAMES.index(_GENERAL_TO_CHALLENGE[name]) if name in _GENERAL_TO_CHALLENGE else IGNORE_INDEX
    for raw, name in enumerate(RAW_CLASS_NAMES)
}
_LUT = np.array([LEARNING_MAP[i] for i in range(len(RAW_CLASS_NAMES))], dtype=np.uint8)


def map_labels(raw: np.ndarray) -> np.ndarray:
    """Training classes (uint8, 0..15 or IGNORE_INDEX) of raw general-class ids."""
    raw = np.asarray(raw)
    if not np.issubdtype(raw.dtype, np.integer):
        raise TypeError(f"raw labels must be integers, got {raw.dtype}")
    bad = (raw < 0) | (raw >= len(_LUT))
    if bad.any():
        raise ValueError(f"raw lidarseg ids {np.unique(raw[bad])[:10].tolist()} are outside the "
                         f"{len(_LUT)} general classes (the labels are corrupt or not nuScenes-lidarseg)")
    return _LUT[raw]


def _inside_root(root: Path, rel: str, where: str) -> Path:
    path = root / rel
    if not path.is_file():
        raise FileNotFoundError(f"{where} names {rel!r}, but {str(path)!r} does not exist")
    return path


def read_index(root: Union[str, Path], split: str) -> List[Tuple[Path, Path]]:
    """(points, labels) file pairs listed by ``ROOT/splits/<split>.txt``."""
    root = Path(root)
    split_dir = root / "splits"
    index = split_dir / f"{split}.txt"
    if not index.is_file():
        available = sorted(p.stem for p in split_dir.glob("*.txt")) if split_dir.is_dir() else []
        raise ValueError(f"unknown split {split!r}: no index file {str(index)!r} "
                         f"(available splits: {available})")
    pairs = []
    for number, line in enumerate(index.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"{str(index)}:{number}: expected '<points path> <labels path>', got {line!r}")
        where = f"{index.name} line {number}"
        pairs.append((_inside_root(root, fields[0], where), _inside_root(root, fields[1], where)))
    if not pairs:
        raise ValueError(f"index file {str(index)!r} lists no frames")
    return pairs


def _load_table(path: Path) -> list:
    if not path.is_file():
        raise FileNotFoundError(f"nuScenes table {str(path)!r} does not exist")
    try:
        table = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"nuScenes table {str(path)!r} is not valid JSON: {err}") from err
    if not isinstance(table, list):
        raise ValueError(f"nuScenes table {str(path)!r} must hold a JSON list of records")
    return table


def _field(record: dict, key: str, table: str):
    if not isinstance(record, dict) or key not in record:
        raise ValueError(f"a record of {table} lacks the field {key!r}: {record!r}")
    return record[key]


def read_tables(root: Union[str, Path], version: str,
                scenes: Optional[Iterable[str]] = None) -> List[Tuple[Path, Path]]:
    """(points, labels) file pairs of every lidarseg record in ``ROOT/<version>/``, optionally only
    those of the named scenes; in the order of lidarseg.json."""
    root = Path(root)
    tables = root / version
    if not tables.is_dir():
        raise FileNotFoundError(f"nuScenes tables directory {str(tables)!r} does not exist")
    lidarseg = _load_table(tables / "lidarseg.json")
    sample_data = {_field(r, "token", "sample_data.json"): r for r in _load_table(tables / "sample_data.json")}

    keep_samples = None
    if scenes is not None:
        if isinstance(scenes, str):
            raise TypeError(f"scenes must be a list of scene names, e.g. ['scene-0061'], got {scenes!r}")
        wanted = set(scenes)
        scene_rows = _load_table(tables / "scene.json")
        names = {_field(r, "name", "scene.json") for r in scene_rows}
        unknown = sorted(wanted - names)
        if unknown:
            raise ValueError(f"unknown scenes {unknown[:5]} (the tables list {len(names)} scenes)")
        scene_tokens = {_field(r, "token", "scene.json") for r in scene_rows if r["name"] in wanted}
        keep_samples = {_field(r, "token", "sample.json") for r in _load_table(tables / "sample.json")
                        if _field(r, "scene_token", "sample.json") in scene_tokens}

    pairs = []
    for record in lidarseg:
        token = _field(record, "sample_data_token", "lidarseg.json")
        if token not in sample_data:
            raise ValueError(f"lidarseg.json refers to sample_data {token!r}, which sample_data.json lacks")
        sd = sample_data[token]
        if keep_samples is not None and _field(sd, "sample_token", "sample_data.json") not in keep_samples:
            continue
        pairs.append((_inside_root(root, _field(sd, "filename", "sample_data.json"), "sample_data.json"),
                      _inside_root(root, _field(record, "filename", "lidarseg.json"), "lidarseg.json")))
    if not pairs:
        raise ValueError(f"no lidarseg frames in {str(tables)!r}" + (f" for scenes {sorted(wanted)}"
                                                                    if scenes is not None else ""))
    return pairs


class NuScenesLidarSeg(Dataset):
    """nuScenes-lidarseg sweeps as voxelised samples (see ``transforms.Voxelize`` for the keys).

    Features are the file's (x, y, z, intensity, ring) columns of each voxel's first point
    (intensity as stored, 0..255 in nuScenes). Construct from an index file with
    ``NuScenesLidarSeg(root, split)`` or from the nuScenes tables with ``from_tables``.
    """

    def __init__(self, root: Union[str, Path], split: str = "train", voxel_size: Union[float, Sequence[float]] = 0.1,
                 transforms: Optional[Callable] = None):
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"nuScenes root {str(root)!r} does not exist")
        self._setup(root, split, read_index(root, split), voxel_size, transforms)

    @classmethod
    def from_tables(cls, root: Union[str, Path], version: str, voxel_size: Union[float, Sequence[float]] = 0.1,
                    transforms: Optional[Callable] = None, *,
                    scenes: Optional[Iterable[str]] = None) -> "NuScenesLidarSeg":
        """Every lidarseg frame of ``ROOT/<version>`` (``scenes``: only these scene names)."""
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"nuScenes root {str(root)!r} does not exist")
        dataset = cls.__new__(cls)
        dataset._setup(root, version, read_tables(root, version, scenes), voxel_size, transforms)
        return dataset

    def _setup(self, root: Path, name: str, frames: List[Tuple[Path, Path]], voxel_size, transforms) -> None:
        self.root, self.split, self.frames = root, name, frames
        self.transforms = transforms
        self.voxelize = Voxelize(voxel_size)

    def __len__(self) -> int:
        return len(self.frames)

    def read_frame(self, index: int) -> Dict[str, object]:
        """The raw frame: ``points`` [N, 5], ``labels`` (training classes), ``raw_labels``.
        Points holding NaN or Inf are dropped with their labels (a NonFiniteWarning counts them)."""
        points_file, labels_file = self.frames[index]
        points = read_bin(points_file, columns=5)
        raw = read_bin(labels_file, columns=1, dtype=np.uint8).reshape(-1)
        if len(raw) != len(points):
            raise ValueError(f"label file {str(labels_file)!r} has {len(raw)} labels but "
                             f"{str(points_file)!r} has {len(points)} points")
        labels = map_labels(raw)
        points, labels, raw = drop_nonfinite(points, points_file, "drop", labels, raw)
        return {"points": points, "labels": labels, "raw_labels": raw, "file": str(points_file)}

    def __getitem__(self, index: int) -> Dict[str, object]:
        frame = self.read_frame(index)
        frame.pop("raw_labels")
        if self.transforms is not None:
            frame = self.transforms(frame)
        return self.voxelize(frame)

    def __repr__(self) -> str:
        return f"NuScenesLidarSeg(root={str(self.root)!r}, split={self.split!r}, frames={len(self)}, {self.voxelize!r})"
