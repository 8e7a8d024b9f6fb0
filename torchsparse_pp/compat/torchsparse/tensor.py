"""torchsparse 2.1's SparseTensor and PointTensor.

As in 2.1 they are mutable containers: ``F`` / ``C`` / ``s`` have setters, ``to`` / ``cpu`` /
``half`` / ``detach`` change the tensor itself and return it. Coordinates are ``[N, 4]``
``(batch, x, y, z)`` int32 for convolutions, or per-sample ``[N, 3]`` to which
``sparse_collate`` adds the batch column. Features may be of any dtype (labels are SparseTensors
too). ``spatial_range``, when set, is ``(batch, x, y, z)`` sizes.
"""
from typing import Optional, Tuple, Union

import torch

from .utils.tensor_cache import new_cache
from .utils.to_dense import to_dense
from .utils.utils import make_ntuple

_allow_negative_coordinates = False


def get_allow_negative_coordinates() -> bool:
    return _allow_negative_coordinates


def set_allow_negative_coordinates(allow: bool) -> None:
    if allow:
        raise NotImplementedError("negative coordinates: torchsparse 2.1 then clips strided outputs to a lower "
                                  "bound computed with float division, which the adapter does not reproduce; "
                                  "shift coordinates to >= 0, or use torchsparse_pp.SparseTensor (any signed range)")


class SparseTensor:
    def __init__(self, feats: torch.Tensor, coords: torch.Tensor, stride: Union[int, Tuple[int, ...]] = 1,
                 spatial_range: Optional[Tuple[int, ...]] = None):
        self.feats = feats
        self.coords = coords
        self.stride = make_ntuple(stride, 3)
        self.spatial_range = None if spatial_range is None else tuple(int(v) for v in spatial_range)
        self._caches = new_cache()

    @property
    def F(self) -> torch.Tensor:
        return self.feats

    @F.setter
    def F(self, feats: torch.Tensor) -> None:
        self.feats = feats

    @property
    def C(self) -> torch.Tensor:
        return self.coords

    @C.setter
    def C(self, coords: torch.Tensor) -> None:
        self.coords = coords

    @property
    def s(self) -> Tuple[int, ...]:
        return self.stride

    @s.setter
    def s(self, stride) -> None:
        self.stride = make_ntuple(stride, 3)

    def cpu(self) -> "SparseTensor":
        return self.to("cpu")

    def cuda(self) -> "SparseTensor":
        return self.to("cuda")

    def half(self) -> "SparseTensor":
        self.feats = self.feats.half()
        return self

    def detach(self) -> "SparseTensor":
        self.coords = self.coords.detach()
        self.feats = self.feats.detach()
        return self

    def to(self, device, non_blocking: bool = True) -> "SparseTensor":
        self.coords = self.coords.to(device, non_blocking=non_blocking)
        self.feats = self.feats.to(device, non_blocking=non_blocking)
        return self

    def dense(self) -> torch.Tensor:
        """Channels-last ``[batch, x, y, z, C]`` over ``spatial_range``."""
        if self.spatial_range is None:
            raise ValueError("dense() needs spatial_range (batch, x, y, z) on the tensor")
        return to_dense(self.feats, self.coords, self.spatial_range)

    def __add__(self, other: "SparseTensor") -> "SparseTensor":
        output = SparseTensor(self.feats + other.feats, self.coords, self.stride, self.spatial_range)
        output._caches = self._caches
        return output

    def __repr__(self) -> str:
        return (f"SparseTensor(feats={tuple(self.feats.shape)}, coords={tuple(self.coords.shape)}, "
                f"stride={self.stride}, spatial_range={self.spatial_range})")


class PointTensor:
    """2.1's point container: float ``C`` with ``F``, and dicts for queries and weights."""

    def __init__(self, feats: torch.Tensor, coords: torch.Tensor, idx_query=None, weights=None):
        self.F = feats
        self.C = coords
        self.idx_query = {} if idx_query is None else idx_query
        self.weights = {} if weights is None else weights
        self.additional_features = {"idx_query": {}, "counts": {}}

    def cuda(self) -> "PointTensor":
        return self.to("cuda")

    def detach(self) -> "PointTensor":
        self.F = self.F.detach()
        self.C = self.C.detach()
        return self

    def to(self, device, non_blocking: bool = True) -> "PointTensor":
        self.F = self.F.to(device, non_blocking=non_blocking)
        self.C = self.C.to(device, non_blocking=non_blocking)
        return self

    def __add__(self, other: "PointTensor") -> "PointTensor":
        tensor = PointTensor(self.F + other.F, self.C, self.idx_query, self.weights)
        tensor.additional_features = self.additional_features
        return tensor
