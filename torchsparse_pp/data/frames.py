"""What every reader's items are: its raw frame (``read_frame``) without the raw label ids, run
through the reader's ``transforms`` (if any), then voxelised by its ``voxelize``."""
from __future__ import annotations

from typing import Dict

from torch.utils.data import Dataset

__all__ = ["FrameDataset"]


class FrameDataset(Dataset):
    """Base of the readers: subclasses set ``transforms`` and ``voxelize`` and define ``read_frame``."""

    transforms = None

    def read_frame(self, index: int) -> Dict[str, object]:
        raise NotImplementedError(f"{type(self).__name__} must define read_frame")

    def __getitem__(self, index: int) -> Dict[str, object]:
        frame = self.read_frame(index)
        frame.pop("raw_labels", None)  # the training classes are in "labels"
        if self.transforms is not None:
            frame = self.transforms(frame)
        return self.voxelize(frame)
