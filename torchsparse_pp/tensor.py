"""SparseTensor: features on integer coordinates, plus the caches a network pass shares."""
from typing import Optional, Sequence, Union

import torch

from . import checks
from .kmap.cache import KernelMapCache
from .kmap.geometry import IntOr3, Triple, triple


class SparseTensor:
    """Features ``F [N, C]`` at int32 coordinates ``C [N, 4] = (batch, x, y, z)``.

    ``stride`` is the tensor stride: a coordinate q at stride s covers q*s at stride 1.
    ``spatial_range`` is the optional dense grid size (x, y, z) at this stride; when set, every
    coordinate must lie in [0, size) and strided convs clip their outputs to the dense output size.

    Methods never mutate: ``to``, ``cpu``, ``half`` and friends return new tensors.
    """

    __slots__ = ("_feats", "_coords", "_stride", "_spatial_range", "_cache")

    def __init__(self, feats: torch.Tensor, coords: torch.Tensor, stride: IntOr3 = 1,
                 spatial_range: Optional[Sequence[int]] = None):
        spatial_range = checks.check_spatial_range(spatial_range)
        checks.check_sparse_tensor(coords, feats, spatial_range)
        checks.check_same_device(feats, coords)
        self._feats = feats
        self._coords = coords
        self._stride = triple(stride, "stride", 1)
        self._spatial_range = spatial_range
        self._cache = KernelMapCache()

    @classmethod
    def _derive(cls, feats: torch.Tensor, coords: torch.Tensor, stride: Triple,
                spatial_range: Optional[Triple], cache: KernelMapCache) -> "SparseTensor":
        """A tensor made by the library from checked parts; it shares ``cache``."""
        out = cls.__new__(cls)
        out._feats = feats
        out._coords = coords
        out._stride = stride
        out._spatial_range = spatial_range
        out._cache = cache
        return out

    def replace_feats(self, feats: torch.Tensor) -> "SparseTensor":
        """Same coordinates, stride and caches with new features of the same length."""
        if not isinstance(feats, torch.Tensor) or feats.dim() != 2 or feats.shape[0] != self.num_points:
            raise ValueError(f"replacement feats must be [{self.num_points}, C], "
                             f"got {getattr(feats, 'shape', type(feats).__name__)}")
        checks.check_same_device(feats, self._coords)
        return SparseTensor._derive(feats, self._coords, self._stride, self._spatial_range, self._cache)

    # --- views -------------------------------------------------------------------------------
    @property
    def F(self) -> torch.Tensor:
        return self._feats

    @property
    def C(self) -> torch.Tensor:
        return self._coords

    @property
    def s(self) -> Triple:
        return self._stride

    stride = s

    @property
    def spatial_range(self) -> Optional[Triple]:
        return self._spatial_range

    @property
    def cache(self) -> KernelMapCache:
        return self._cache

    @property
    def num_points(self) -> int:
        return self._coords.shape[0]

    @property
    def num_channels(self) -> int:
        return self._feats.shape[1]

    @property
    def batch_size(self) -> int:
        return int(self._coords[:, 0].max().item()) + 1

    @property
    def device(self) -> torch.device:
        return self._feats.device

    @property
    def dtype(self) -> torch.dtype:
        return self._feats.dtype

    def __len__(self) -> int:
        return self.num_points

    def __repr__(self) -> str:
        return (f"SparseTensor(points={self.num_points}, channels={self.num_channels}, "
                f"stride={self._stride}, spatial_range={self._spatial_range}, dtype={self.dtype}, "
                f"device={self.device})")

    # --- conversions (never mutate) ----------------------------------------------------------
    def to(self, *args, **kwargs) -> "SparseTensor":
        feats = self._feats.to(*args, **kwargs)
        if feats.device == self._coords.device:
            return self.replace_feats(feats)
        # Maps on another device cannot be reused: the moved tensor starts a fresh cache.
        coords = self._coords.to(feats.device, non_blocking=kwargs.get("non_blocking", False))
        return SparseTensor._derive(feats, coords, self._stride, self._spatial_range, KernelMapCache())

    def cpu(self) -> "SparseTensor":
        return self.to("cpu")

    def cuda(self, device: Union[int, str, torch.device, None] = None) -> "SparseTensor":
        if device is None:
            device = "cuda"
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        return self.to(device)

    def half(self) -> "SparseTensor":
        return self.to(torch.float16)

    def float(self) -> "SparseTensor":
        return self.to(torch.float32)

    def double(self) -> "SparseTensor":
        return self.to(torch.float64)

    def bfloat16(self) -> "SparseTensor":
        return self.to(torch.bfloat16)

    def detach(self) -> "SparseTensor":
        return self.replace_feats(self._feats.detach())

    def dense(self) -> torch.Tensor:
        """Dense ``[B, C, X, Y, Z]`` tensor (differentiable); see nn.functional.to_dense."""
        from .nn.functional.dense import to_dense
        return to_dense(self)

    @classmethod
    def from_dense(cls, dense: torch.Tensor, stride: IntOr3 = 1) -> "SparseTensor":
        """Sparse tensor of the non-zero sites of a dense ``[B, C, X, Y, Z]`` tensor."""
        from .nn.functional.dense import from_dense
        return from_dense(dense, stride)

    # --- arithmetic --------------------------------------------------------------------------
    def __add__(self, other: "SparseTensor") -> "SparseTensor":
        if not isinstance(other, SparseTensor):
            return NotImplemented
        require_same_coords(self, other, "+")
        return self.replace_feats(self._feats + other._feats)


def require_same_coords(a: SparseTensor, b: SparseTensor, op: str) -> None:
    """Raises unless ``a`` and ``b`` have the same coordinates in the same order and stride."""
    if a.C.device != b.C.device:
        raise ValueError(f"'{op}' got tensors on {a.C.device} and {b.C.device}")
    if a.s != b.s:
        raise ValueError(f"'{op}' needs equal strides, got {a.s} and {b.s}")
    if a.C is b.C:
        return
    if a.C.shape != b.C.shape or not torch.equal(a.C, b.C):
        raise ValueError(f"'{op}' needs both tensors on the same coordinates in the same order "
                         f"(got {a.num_points} and {b.num_points} points that differ)")


def _flatten(x: SparseTensor):
    return [x._feats, x._coords], (x._stride, x._spatial_range)


def _flatten_with_keys(x: SparseTensor):
    from torch.utils._pytree import GetAttrKey
    return [(GetAttrKey("F"), x._feats), (GetAttrKey("C"), x._coords)], (x._stride, x._spatial_range)


def _unflatten(children, context) -> SparseTensor:
    feats, coords = children
    stride, spatial_range = context
    return SparseTensor._derive(feats, coords, stride, spatial_range, KernelMapCache())


# A pytree node: torch.export (and torch.utils._pytree users) take SparseTensors as inputs and
# outputs, as their features and coordinates (stride and spatial range are static); a rebuilt
# tensor starts an empty kernel-map cache.
torch.utils._pytree.register_pytree_node(
    SparseTensor, _flatten, _unflatten, serialized_type_name="torchsparse_pp.SparseTensor",
    flatten_with_keys_fn=_flatten_with_keys)
