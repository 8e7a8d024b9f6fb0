"""SemanticKITTI reader.

On-disk layout (the official one)::

    ROOT/sequences/XX/velodyne/NNNNNN.bin   float32 (x, y, z, intensity) per point
    ROOT/sequences/XX/labels/NNNNNN.label   uint32 per point: semantic id in the lower 16 bits,
                                            instance id in the upper 16

Raw semantic ids map to 19 training classes 0..18 (the official learning map, shifted down by
one); ids the map sends to "unlabeled" become ``IGNORE_INDEX`` (255). A raw id outside the
official table is an error, not a silent ignore.

Standard split: train 00-07 and 09-10, val 08, test 11-21 (the test split has no labels).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..io import drop_nonfinite, read_bin
from .frames import FrameDataset
from .transforms import Voxelize

__all__ = ["SemanticKITTI", "SPLITS", "CLASS_NAMES", "LEARNING_MAP", "LEARNING_MAP_INV", "IGNORE_INDEX",
           "map_labels", "read_labels"]

IGNORE_INDEX = 255

CLASS_NAMES = ("car", "bicycle", "motorcycle", "truck", "other-vehicle", "person", "bicyclist",
               "motorcyclist", "road", "parking", "sidewalk", "other-ground", "building", "fence",
               "vegetation", "trunk", "terrain", "pole", "traffic-sign")

#: raw SemanticKITTI id -> learning class (0 = unlabeled, 1..19 = CLASS_NAMES[c - 1])
LEARNING_MAP: Dict[int, int] = {
    0: 0, 1: 0,                                   # unlabeled, outlier
    10: 1, 11: 2, 13: 5, 15: 3, 16: 5, 18: 4, 20: 5,  # vehicles (bus, on-rails -> other-vehicle)
    30: 6, 31: 7, 32: 8,                          # person, bicyclist, motorcyclist
    40: 9, 44: 10, 48: 11, 49: 12,                # road, parking, sidewalk, other-ground
    50: 13, 51: 14, 52: 0,                        # building, fence, other-structure
    60: 9,                                        # lane-marking -> road
    70: 15, 71: 16, 72: 17, 80: 18, 81: 19,       # vegetation, trunk, terrain, pole, traffic-sign
    99: 0,                                        # other-object
    252: 1, 253: 7, 254: 6, 255: 8,               # moving car, bicyclist, person, motorcyclist
    256: 5, 257: 5, 258: 4, 259: 5,               # moving on-rails, bus, truck, other-vehicle
}

#: learning class -> the canonical raw id (what a prediction file stores)
LEARNING_MAP_INV: Dict[int, int] = {0: 0, 1: 10, 2: 11, 3: 15, 4: 18, 5: 20, 6: 30, 7: 31, 8: 32, 9: 40,
                                    10: 44, 11: 48, 12: 49, 13: 50, 14: 51, 15: 70, 16: 71, 17: 72,
                                    18: 80, 19: 81}

SPLITS: Dict[str, Tuple[str, ...]] = {
    "train": ("00", "01", "02", "03", "04", "05", "06", "07", "09", "10"),
    "val": ("08",),
    "test": tuple(f"{i:02d}" for i in range(11, 22)),
}

# Lookup table raw id -> training class; -1 marks ids outside the official table.
_LUT = np.full(max(LEARNING_MAP) + 1, -1, dtype=np.int32)
for _raw, _cls in LEARNING_MAP.items():
    _LUT[_raw] = IGNORE_INDEX if _cls == 0 else _cls - 1


def map_labels(raw: np.ndarray) -> np.ndarray:
    """Training classes (uint8, 0..18 or IGNORE_INDEX) of raw semantic ids (the lower 16 bits)."""
    raw = np.asarray(raw)
    if not np.issubdtype(raw.dtype, np.integer):
        raise TypeError(f"raw labels must be integers, got {raw.dtype}")
    semantic = raw.astype(np.int64) & 0xFFFF
    mapped = np.where(semantic < len(_LUT), _LUT[np.minimum(semantic, len(_LUT) - 1)], -1)
    if (mapped < 0).any():
        unknown = np.unique(semantic[mapped < 0])
        raise ValueError(f"raw SemanticKITTI ids {unknown[:10].tolist()} are not in the learning map "
                         "(the labels are corrupt or not SemanticKITTI)")
    return mapped.astype(np.uint8)


def read_labels(path: Union[str, Path], num_points: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(raw semantic ids uint16, instance ids uint16) from a ``.label`` file; checks the count."""
    raw = read_bin(path, columns=1, dtype=np.uint32).reshape(-1)
    if num_points is not None and len(raw) != num_points:
        raise ValueError(f"label file {str(path)!r} has {len(raw)} labels but its scan has {num_points} points")
    return (raw & 0xFFFF).astype(np.uint16), (raw >> 16).astype(np.uint16)


def _sequence_name(seq: Union[int, str]) -> str:
    if isinstance(seq, bool) or not isinstance(seq, (int, str)):
        raise TypeError(f"sequences are ints or strings like '08', got {seq!r}")
    text = str(seq)
    if not text.isdigit():
        raise ValueError(f"sequence names are digits (e.g. '08'), got {seq!r}")
    return f"{int(text):02d}"


class SemanticKITTI(FrameDataset):
    """SemanticKITTI scans as voxelised samples (see ``transforms.Voxelize`` for the keys).

    Args:
        root: the directory holding ``sequences/``.
        split: "train", "val" or "test"; selects the standard sequences among those present
            under ``ROOT/sequences`` (``self.sequences`` lists them; none present is an error).
        voxel_size: voxel edge in metres (scalar or per axis).
        transforms: callable on the frame dict before voxelisation (e.g. ``transforms.Compose``).
        sequences: explicit sequences instead of the split's; each must exist (``split`` then
            only names the set and sets the ``with_labels`` default).
        with_labels: read ``.label`` files; default: every split but "test".
    """

    def __init__(self, root: Union[str, Path], split: str = "train", voxel_size: Union[float, Sequence[float]] = 0.05,
                 transforms: Optional[Callable] = None, *, sequences: Optional[Iterable[Union[int, str]]] = None,
                 with_labels: Optional[bool] = None):
        self.root = Path(root)
        seq_dir = self.root / "sequences"
        if not seq_dir.is_dir():
            raise FileNotFoundError(f"SemanticKITTI root {str(self.root)!r} has no 'sequences' directory "
                                    "(expected ROOT/sequences/XX/velodyne/*.bin)")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLITS)}")
        present = sorted(p.name for p in seq_dir.iterdir() if p.is_dir())
        if sequences is None:
            self.sequences = [s for s in SPLITS[split] if s in present]
            if not self.sequences:
                raise FileNotFoundError(f"none of the {split} sequences {list(SPLITS[split])} exist under "
                                        f"{str(seq_dir)!r} (present: {present})")
        else:
            if isinstance(sequences, (str, int)):
                raise TypeError(f"sequences must be a list of sequences, e.g. ['08'], got {sequences!r}")
            self.sequences = [_sequence_name(s) for s in sequences]
            if not self.sequences:
                raise ValueError("sequences is empty")
            missing = [s for s in self.sequences if s not in present]
            if missing:
                raise FileNotFoundError(f"sequences {missing} do not exist under {str(seq_dir)!r} "
                                        f"(present: {present})")
        self.split = split
        self.with_labels = (split != "test") if with_labels is None else bool(with_labels)
        self.transforms = transforms
        self.voxelize = Voxelize(voxel_size)
        self.scans: List[Path] = []
        for seq in self.sequences:
            velodyne = seq_dir / seq / "velodyne"
            if not velodyne.is_dir():
                raise FileNotFoundError(f"sequence {seq} has no velodyne directory {str(velodyne)!r}")
            self.scans += sorted(velodyne.glob("*.bin"))
        if not self.scans:
            raise FileNotFoundError(f"no .bin scans in sequences {self.sequences} under {str(seq_dir)!r}")

    def __len__(self) -> int:
        return len(self.scans)

    def label_path(self, scan: Path) -> Path:
        return scan.parent.parent / "labels" / (scan.stem + ".label")

    def read_frame(self, index: int) -> Dict[str, object]:
        """The raw frame: ``points`` [N, 4] and, with labels, ``labels`` (training classes),
        ``raw_labels`` (raw semantic ids) and ``instances``. Points holding NaN or Inf are
        dropped with their labels (a NonFiniteWarning counts them)."""
        scan = self.scans[index]
        points = read_bin(scan, columns=4)
        frame: Dict[str, object] = {"file": str(scan)}
        if self.with_labels:
            label_file = self.label_path(scan)
            if not label_file.is_file():
                raise FileNotFoundError(f"scan {str(scan)!r} has no label file {str(label_file)!r} "
                                        "(pass with_labels=False to read scans only)")
            raw, instances = read_labels(label_file, len(points))
            labels = map_labels(raw)
            points, labels, raw, instances = drop_nonfinite(points, scan, "drop", labels, raw, instances)
            frame.update(points=points, labels=labels, raw_labels=raw, instances=instances)
        else:
            frame["points"] = drop_nonfinite(points, scan)
        return frame


    def __repr__(self) -> str:
        return (f"SemanticKITTI(root={str(self.root)!r}, split={self.split!r}, sequences={self.sequences}, "
                f"scans={len(self)}, {self.voxelize!r})")
