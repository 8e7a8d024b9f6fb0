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

Multi-sweep frames (``sweeps=N``) also read ``ego_pose``, ``calibrated_sensor`` and ``sensor``
(see ``nuscenes_sweeps``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..io import drop_nonfinite, read_bin
from .nuscenes_sweeps import SWEEP_COLUMNS, check_sweeps, merge_sweeps, sweep_chain
from .nuscenes_tables import NuScenesTables
from .frames import FrameDataset
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


def read_tables(root: Union[str, Path], version: str,
                scenes: Optional[Iterable[str]] = None) -> List[Tuple[Path, Path]]:
    """(points, labels) file pairs of every lidarseg record in ``ROOT/<version>/``, optionally only
    those of the named scenes; in the order of lidarseg.json."""
    return [(points, labels) for points, labels, _ in _table_frames(_lidarseg_tables(root, version, scenes), scenes)]


def _lidarseg_tables(root: Union[str, Path], version: str, scenes, sweeps: bool = False) -> NuScenesTables:
    names = ["lidarseg", "sample_data"]
    if scenes is not None:
        names += ["sample", "scene"]
    if sweeps:
        names += ["ego_pose", "calibrated_sensor", "sensor"]
    return NuScenesTables(root, version, names)


def _table_frames(tables: NuScenesTables, scenes) -> List[Tuple[Path, Path, str]]:
    """(points, labels, sample_data token) of each lidarseg record (of the scenes), in file order."""
    keep_samples = None
    if scenes is not None:
        scene_tokens = set(tables.scene_tokens(scenes))
        keep_samples = {t for t, r in tables.tables["sample"].items()
                        if tables.value("sample", r, "scene_token") in scene_tokens}
    frames = []
    for record in tables.tables["lidarseg"].values():
        token = tables.value("lidarseg", record, "sample_data_token")
        sd = tables.get("sample_data", token, tables.where("lidarseg", record))
        if keep_samples is not None and tables.value("sample_data", sd, "sample_token") not in keep_samples:
            continue
        frames.append((_inside_root(tables.root, tables.value("sample_data", sd, "filename"), "sample_data.json"),
                       _inside_root(tables.root, tables.value("lidarseg", record, "filename"), "lidarseg.json"),
                       token))
    if not frames:
        raise ValueError(f"no lidarseg frames in {str(tables.dir)!r}" + (f" for scenes {sorted(scenes)}"
                                                                        if scenes is not None else ""))
    return frames


def _index_tokens(tables: NuScenesTables, pairs: List[Tuple[Path, Path]], index: str) -> List[str]:
    """The sample_data token of each (points, labels) pair of an index file, checked against the
    tables: the points file must be a sample_data record's and the labels its lidarseg record's."""
    by_file = {(tables.root / tables.value("sample_data", r, "filename")).resolve(): t
               for t, r in tables.tables["sample_data"].items()}
    labels_of = {tables.value("lidarseg", r, "sample_data_token"):
                 (tables.root / tables.value("lidarseg", r, "filename")).resolve()
                 for r in tables.tables["lidarseg"].values()}
    tokens = []
    for points, labels in pairs:
        token = by_file.get(points.resolve())
        if token is None:
            raise ValueError(f"{index} lists {str(points)!r}, which no record of {tables.file('sample_data')} names")
        if labels_of.get(token) != labels.resolve():
            raise ValueError(f"{index} pairs {str(points)!r} with {str(labels)!r}, but "
                             f"{tables.file('lidarseg')} gives that sweep the labels {str(labels_of.get(token))!r}")
        tokens.append(token)
    return tokens


class NuScenesLidarSeg(FrameDataset):
    """nuScenes-lidarseg key frames as voxelised samples (see ``transforms.Voxelize`` for the keys).

    Features are the file's (x, y, z, intensity, ring) columns of each voxel's first point
    (intensity as stored, 0..255 in nuScenes). Construct from an index file with
    ``NuScenesLidarSeg(root, split)`` or from the nuScenes tables with ``from_tables``.

    ``sweeps=N`` (N > 1) adds the N - 1 sweeps before each key frame (``nuscenes_sweeps``: in
    the key frame's LiDAR frame), with a sixth column, the time lag in seconds (0 on the key
    frame). Labels exist for the key frame only: the points of earlier sweeps get IGNORE_INDEX.
    Key-frame points come first, so a voxel holding any is represented (and labelled) by one.
    Sweeps need the tables: ``version`` (e.g. "v1.0-trainval") names them for an index file;
    given without sweeps, the index is checked against them.
    """

    def __init__(self, root: Union[str, Path], split: str = "train", voxel_size: Union[float, Sequence[float]] = 0.1,
                 transforms: Optional[Callable] = None, *, sweeps: int = 1, version: Optional[str] = None):
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"nuScenes root {str(root)!r} does not exist")
        check_sweeps(sweeps)
        pairs = read_index(root, split)
        tokens, tables = None, None
        if version is not None:
            tables = _lidarseg_tables(root, version, None, sweeps=sweeps > 1)
            tokens = _index_tokens(tables, pairs, str(root / "splits" / f"{split}.txt"))
        elif sweeps > 1:
            raise ValueError(f"sweeps={sweeps} needs the nuScenes tables for the prev chains: pass version "
                             "(the tables directory under the root, e.g. 'v1.0-trainval')")
        self._setup(root, split, pairs, tokens, tables, sweeps, voxel_size, transforms)

    @classmethod
    def from_tables(cls, root: Union[str, Path], version: str, voxel_size: Union[float, Sequence[float]] = 0.1,
                    transforms: Optional[Callable] = None, *,
                    scenes: Optional[Iterable[str]] = None, sweeps: int = 1) -> "NuScenesLidarSeg":
        """Every lidarseg frame of ``ROOT/<version>`` (``scenes``: only these scene names)."""
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"nuScenes root {str(root)!r} does not exist")
        check_sweeps(sweeps)
        tables = _lidarseg_tables(root, version, scenes, sweeps=sweeps > 1)
        frames = _table_frames(tables, scenes)
        dataset = cls.__new__(cls)
        dataset._setup(root, version, [(p, l) for p, l, _ in frames], [t for _, _, t in frames], tables, sweeps,
                       voxel_size, transforms)
        return dataset

    def _setup(self, root: Path, name: str, frames: List[Tuple[Path, Path]], tokens: Optional[List[str]],
               tables: Optional[NuScenesTables], sweeps: int, voxel_size, transforms) -> None:
        self.root, self.split, self.frames, self.tokens = root, name, frames, tokens
        self.tables, self.sweeps = tables, sweeps
        self.transforms = transforms
        self.voxelize = Voxelize(voxel_size)

    @property
    def point_features(self) -> int:
        """Columns per point: x, y, z, intensity, ring (and the time lag with sweeps > 1)."""
        return SWEEP_COLUMNS + (self.sweeps > 1)

    def __len__(self) -> int:
        return len(self.frames)

    def read_frame(self, index: int) -> Dict[str, object]:
        """The raw frame: ``points`` [N, 5] (or [N, 6] with sweeps), ``labels`` (training classes),
        ``raw_labels`` (the key frame's raw ids). Points holding NaN or Inf are dropped with their
        labels (a NonFiniteWarning counts them)."""
        points_file, labels_file = self.frames[index]
        if self.sweeps > 1:
            return self._read_sweeps(index)
        points = read_bin(points_file, columns=SWEEP_COLUMNS)
        raw = self._raw_labels(labels_file, points_file, len(points))
        labels = map_labels(raw)
        points, labels, raw = drop_nonfinite(points, points_file, "drop", labels, raw)
        return {"points": points, "labels": labels, "raw_labels": raw, "file": str(points_file)}

    def _raw_labels(self, labels_file: Path, points_file: Path, count: int) -> np.ndarray:
        raw = read_bin(labels_file, columns=1, dtype=np.uint8).reshape(-1)
        if len(raw) != count:
            raise ValueError(f"label file {str(labels_file)!r} has {len(raw)} labels but "
                             f"{str(points_file)!r} has {count} points")
        return raw

    def _read_sweeps(self, index: int) -> Dict[str, object]:
        points_file, labels_file = self.frames[index]
        chain = sweep_chain(self.tables, self.tokens[index], self.sweeps)
        points, key_count, key_finite = merge_sweeps(chain)
        raw = self._raw_labels(labels_file, points_file, len(key_finite))[key_finite]
        labels = np.full(len(points), IGNORE_INDEX, dtype=np.uint8)
        labels[:key_count] = map_labels(raw)
        return {"points": points, "labels": labels, "raw_labels": raw, "file": str(points_file),
                "sweeps": len(chain)}


    def __repr__(self) -> str:
        return (f"NuScenesLidarSeg(root={str(self.root)!r}, split={self.split!r}, frames={len(self)}, "
                f"sweeps={self.sweeps}, {self.voxelize!r})")
