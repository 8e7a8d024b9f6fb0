"""Datasets and loaders for training: the readers of torchsparse_pp.data behind a crop, a point
cap and augmentations whose randomness is a function of (seed, epoch, position) alone, and a
sampler whose order is too. That makes the data stream reproducible on resume and independent of
the worker count."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..data import DetectionDataset, NuScenesLidarSeg, SemanticKITTI
from ..data.nuscenes_detection import DETECTION_CLASSES, NuScenesDetection
from ..data.waymo import DEFAULT_TAG, WAYMO_CLASSES, WaymoDataset
from ..data.transforms import Compose, PointCap, RandomFlip, RandomRotation, RandomScale
from ..utils import sparse_collate_fn
from .config import Config, ConfigError

__all__ = ["build_dataset", "build_loader", "ResumableSampler", "SegmentationData", "PointSegmentationData",
           "DetectionFrames", "class_names", "CropXY", "write_synthetic_data"]

# The synth format that writes each data format.
SYNTH_FORMAT = {"nuscenes_detection": "nuscenes"}


class CropXY:
    """Keeps the points with |x| < half_width and |y| < half_width (per-point arrays alike) and
    the boxes whose centre lies inside."""

    PER_POINT_KEYS = ("labels", "raw_labels", "instances")

    def __init__(self, half_width: float):
        if not half_width > 0:
            raise ValueError(f"crop half width must be positive, got {half_width!r}")
        self.half_width = float(half_width)

    def __call__(self, frame):
        points = frame["points"]
        keep = (np.abs(points[:, 0]) < self.half_width) & (np.abs(points[:, 1]) < self.half_width)
        if not keep.any():
            raise ValueError(f"frame {frame.get('file', '')!r} has no points within the {self.half_width} m crop")
        out = dict(frame)
        out["points"] = points[keep]
        for key in self.PER_POINT_KEYS:
            if key in frame:
                out[key] = np.asarray(frame[key])[keep]
        if frame.get("boxes") is not None:
            boxes = frame["boxes"]
            inside = (np.abs(boxes[:, 0]) < self.half_width) & (np.abs(boxes[:, 1]) < self.half_width)
            out["boxes"] = boxes[inside]
            out["box_labels"] = np.asarray(frame["box_labels"])[inside]
        return out

    def __repr__(self) -> str:
        return f"CropXY({self.half_width})"


class _SeededFrames(Dataset):
    """Wraps a reader: item ``(index, seed)`` reads frame ``index`` and runs the transforms with a
    generator seeded by ``seed`` (the sampler chooses both)."""

    def __init__(self, reader, transforms: List, limit: Optional[int]):
        self.reader = reader
        self.generator = torch.Generator()
        # The random transforms hold this generator; __getitem__ reseeds it per sample.
        self.transforms = Compose(transforms) if transforms else None
        self.length = len(reader) if limit is None else min(limit, len(reader))

    def __len__(self) -> int:
        return self.length

    def frame(self, item) -> Dict[str, object]:
        index, seed = item if isinstance(item, tuple) else (item, 0)
        self.generator.manual_seed(int(seed))
        frame = self.reader.read_frame(index)
        frame.pop("raw_labels", None)
        return self.transforms(frame) if self.transforms is not None else frame


class SegmentationData(_SeededFrames):
    """Voxelised samples of SemanticKITTI / nuScenes-lidarseg (keys as transforms.Voxelize)."""

    def __getitem__(self, item):
        return self.reader.voxelize(self.frame(item))


class PointSegmentationData(SegmentationData):
    """SegmentationData plus the frame's ``points`` (float32 ``[N, F]``, rows as ``point_targets``)
    for point-level models (SPVCNN)."""

    def __getitem__(self, item):
        frame = self.frame(item)
        sample = self.reader.voxelize(frame)
        sample["points"] = torch.from_numpy(np.ascontiguousarray(frame["points"], dtype=np.float32))
        return sample


class DetectionFrames(_SeededFrames):
    """Raw detection frames for CenterPoint, which voxelises on its own grid: ``points`` float32
    tensor [N, F], ``boxes`` [M, 7] or [M, 9] (with velocities), ``box_labels`` [M]."""

    def __getitem__(self, item):
        frame = self.frame(item)
        return {"points": torch.from_numpy(np.ascontiguousarray(frame["points"], dtype=np.float32)),
                "boxes": torch.from_numpy(np.ascontiguousarray(frame["boxes"], dtype=np.float32)),
                "box_labels": torch.from_numpy(np.asarray(frame["box_labels"], dtype=np.int64)),
                "file": frame["file"]}


def _reader(config: Config, split: str):
    data = config.data
    root = Path(data.root)
    if not root.is_dir():
        raise FileNotFoundError(f"data.root {str(root)!r} does not exist; point it at a {data.format} dataset "
                                f"(or write a synthetic one: torchsparse-pp synth --format "
                                f"{SYNTH_FORMAT.get(data.format, data.format)} --out {str(root)})")
    if data.format == "semantickitti":
        reader = SemanticKITTI(root, split, data.voxel_size)
    elif data.format == "nuscenes":
        reader = NuScenesLidarSeg(root, split, data.voxel_size, sweeps=data.sweeps, version=data.version)
    elif data.format == "nuscenes_detection":
        reader = NuScenesDetection(root, data.version, split, data.voxel_size, sweeps=data.sweeps)
    elif data.format == "waymo":
        reader = WaymoDataset(root, split, data.voxel_size, frames=data.sweeps, tag=data.version or DEFAULT_TAG)
    else:
        reader = DetectionDataset(root, split, data.voxel_size)
    if getattr(reader, "point_features", config.point_features) != config.point_features:
        raise RuntimeError(f"{reader!r} gives {reader.point_features} features per point, the config "
                           f"{config.point_features}")  # the two tables of widths disagree: a bug here
    return reader


def write_synthetic_data(config: Config, root: Path, scans: int) -> List[str]:
    """Writes a synthetic set in the layout the config's reader reads (``scans`` per split) and
    returns the overrides that point the config at it."""
    from ..data.synth import write_synthetic
    from ..data.synth_nuscenes import VERSION

    synth_format = SYNTH_FORMAT.get(config.data.format, config.data.format)
    write_synthetic(root, format=synth_format, scans=scans, progress=False)
    overrides = [f"data.root={root}"]
    if config.data.version is not None:  # the synthetic set's own tables / processed folder
        overrides.append(f"data.version={VERSION if synth_format == 'nuscenes' else DEFAULT_TAG}")
    return overrides


def class_names(config: Config, dataset=None) -> Tuple[str, ...]:
    """The training classes of the configured dataset."""
    if config.data.format == "semantickitti":
        from ..data.semantickitti import CLASS_NAMES
        return CLASS_NAMES
    if config.data.format == "nuscenes":
        from ..data.nuscenes import CLASS_NAMES
        return CLASS_NAMES
    if config.data.format == "nuscenes_detection":
        return DETECTION_CLASSES
    if config.data.format == "waymo":
        return WAYMO_CLASSES
    if dataset is not None:
        return tuple(dataset.reader.classes)
    from ..data.synthetic import BOX_CLASSES
    return tuple(BOX_CLASSES)


def build_dataset(config: Config, train: bool) -> _SeededFrames:
    """The train (augmented when data.augment) or val split."""
    data = config.data
    reader = _reader(config, data.train_split if train else data.val_split)
    wrapper = {"centerpoint": DetectionFrames, "spvcnn": PointSegmentationData}.get(config.model.name, SegmentationData)
    dataset = wrapper(reader, [], data.max_scans)
    transforms: List = []
    if data.crop is not None:
        transforms.append(CropXY(data.crop))
    if train and data.augment:
        g = dataset.generator
        transforms += [RandomRotation(generator=g), RandomFlip(generator=g), RandomScale(generator=g)]
    if data.max_points is not None:
        transforms.append(PointCap(data.max_points, generator=dataset.generator))
    dataset.transforms = Compose(transforms) if transforms else None
    return dataset


class ResumableSampler(DistributedSampler):
    """DistributedSampler (rank's share of a permutation drawn from seed + epoch) that yields
    ``(index, sample seed)`` and can start ``skip`` items into the epoch, for exact resume."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, shuffle: bool, seed: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=shuffle)
        self.skip = 0

    def set_position(self, epoch: int, skip: int) -> None:
        self.set_epoch(epoch)
        self.skip = skip

    def _indices(self) -> List[int]:
        if self.shuffle:
            return list(super().__iter__())
        # Evaluation: every sample exactly once over all ranks (no padding repeats).
        return list(range(self.rank, len(self.dataset), self.num_replicas))

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        indices = self._indices()
        for position in range(self.skip, len(indices)):
            # A sample's augmentation depends on the run seed, the epoch and the index only.
            seed = (self.seed * 1_000_003 + self.epoch * 7919 + indices[position]) % (2 ** 63)
            yield indices[position], seed

    def __len__(self) -> int:
        total = super().__len__() if self.shuffle else len(range(self.rank, len(self.dataset), self.num_replicas))
        return total - self.skip


def build_loader(config: Config, dataset: Dataset, train: bool, world_size: int, rank: int):
    data = config.data
    batch_size = data.batch_size if train else data.val_batch_size
    if train and len(dataset) < batch_size * world_size:
        raise ConfigError(f"the train split has {len(dataset)} scans, fewer than one batch "
                          f"({batch_size} x {world_size} processes)")
    sampler = ResumableSampler(dataset, world_size, rank, shuffle=train, seed=config.train.seed)
    # The loader's own generator: creating an iterator must not draw from the global RNG.
    generator = torch.Generator().manual_seed(config.train.seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=data.num_workers,
                      collate_fn=sparse_collate_fn, drop_last=train, generator=generator)
