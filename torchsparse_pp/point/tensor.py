"""PointTensor: features at float point coordinates, plus the point-voxel lookups of a pass."""
from typing import Any, Callable, Dict, Tuple

import torch

from ..checks import all_finite


class PointTensor:
    """Features ``F [N, C]`` at float coordinates ``C [N, 4] = (batch, x, y, z)`` in units of the
    stride-1 voxel grid: point p lies in voxel ``floor(p)``, and in voxel ``floor(p / s)`` of a
    tensor at stride s. Tensors made with ``replace_feats`` share the coordinates and the cache
    of lookups (which voxel rows each point reads at each stride), like a SparseTensor's maps."""

    __slots__ = ("_feats", "_coords", "_lookups")

    def __init__(self, feats: torch.Tensor, coords: torch.Tensor):
        if not isinstance(coords, torch.Tensor) or coords.dim() != 2 or coords.shape[1] != 4:
            raise ValueError(f"coords must be [N, 4] (batch, x, y, z), got {tuple(getattr(coords, 'shape', ()))}")
        if not coords.is_floating_point():
            raise TypeError(f"point coords must be floating point, got {coords.dtype}")
        if not isinstance(feats, torch.Tensor) or feats.dim() != 2 or feats.shape[0] != coords.shape[0]:
            raise ValueError(f"feats must be [{coords.shape[0]}, C], got {tuple(getattr(feats, 'shape', ()))}")
        if feats.device != coords.device:
            raise ValueError(f"feats are on {feats.device}, coords on {coords.device}")
        if not all_finite(coords):
            raise ValueError("point coords contain NaN or Inf")
        batch = coords[:, 0]
        if coords.shape[0] and (bool((batch != batch.floor()).any()) or bool((batch < 0).any())):
            raise ValueError("the batch column of point coords must hold whole numbers >= 0")
        self._feats, self._coords = feats, coords
        self._lookups: Dict[Tuple[Any, ...], Tuple[torch.Tensor, Any]] = {}

    @property
    def F(self) -> torch.Tensor:
        return self._feats

    @property
    def C(self) -> torch.Tensor:
        return self._coords

    @property
    def num_points(self) -> int:
        return self._coords.shape[0]

    def replace_feats(self, feats: torch.Tensor) -> "PointTensor":
        """Same points and lookups, new features ``[N, C']``."""
        if not isinstance(feats, torch.Tensor) or feats.dim() != 2 or feats.shape[0] != self.num_points:
            raise ValueError(f"replacement feats must be [{self.num_points}, C], got {getattr(feats, 'shape', None)}")
        out = PointTensor.__new__(PointTensor)
        out._feats, out._coords, out._lookups = feats, self._coords, self._lookups
        return out

    def lookup(self, key: Tuple[Any, ...], voxels: torch.Tensor, build: Callable[[], Any]) -> Any:
        """Cached ``build()`` for (``key``, the voxel coordinate tensor ``voxels`` by identity)."""
        entry = self._lookups.get((key, id(voxels)))
        if entry is None or entry[0] is not voxels:
            entry = (voxels, build())
            self._lookups[(key, id(voxels))] = entry
        return entry[1]

    def __repr__(self) -> str:
        return f"PointTensor(points={self.num_points}, channels={self._feats.shape[1]}, dtype={self._feats.dtype})"
