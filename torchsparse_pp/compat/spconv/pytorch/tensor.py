"""spconv's SparseConvTensor, carrying torchsparse_pp's kernel-map cache between layers.

Indices are ``[N, ndim + 1]`` int32 ``(batch, spatial...)`` in the caller's axis order, as in
spconv; 1-D and 2-D indices are run as 3-D with size-1 trailing axes.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ....kmap.cache import KernelMapCache
from ....kmap.kernel_map import KernelMap
from ....tensor import SparseTensor
from ..core import ConvAlgo

MAX_NDIM = 3


class PassState:
    """What the tensors of one network pass share: the kernel-map cache and, for 1-/2-D
    indices, the 4-column coordinates made for them (kept by identity so maps are reused)."""

    def __init__(self) -> None:
        self.cache = KernelMapCache()
        self._coords: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def coords4(self, indices: torch.Tensor) -> torch.Tensor:
        if indices.shape[1] == 4:
            return indices
        entry = self._coords.get(id(indices))
        if entry is None or entry[0] is not indices:
            pad = indices.new_zeros(indices.shape[0], 4 - indices.shape[1])
            entry = (indices, torch.cat([indices, pad], 1))
            self._coords[id(indices)] = entry
        return entry[1]

    def indices_of(self, coords4: torch.Tensor, ndim: int) -> torch.Tensor:
        """spconv indices for library coordinates (registered so they map back to ``coords4``)."""
        if ndim == MAX_NDIM:
            return coords4
        indices = coords4[:, :ndim + 1].contiguous()
        self._coords[id(indices)] = (indices, coords4)
        return indices


@dataclass
class IndiceData:
    """What a layer with an ``indice_key`` leaves for later layers (spconv's field names), plus
    the library map, its cache and spconv's row order of the map's outputs."""
    out_indices: torch.Tensor
    indices: torch.Tensor
    spatial_shape: List[int]
    out_spatial_shape: List[int]
    is_subm: bool
    algo: Optional[ConvAlgo]
    ksize: List[int]
    stride: List[int]
    dilation: List[int]
    padding: List[int]
    kmap: Optional[KernelMap] = None
    state: Optional[PassState] = None
    order: Optional[torch.Tensor] = None  # spconv row j is the map's output order[j]
    extra: Dict[str, Any] = field(default_factory=dict)


def expand_nd(ndim: int, value, name: str) -> List[int]:
    if isinstance(value, (int, np.integer)):
        return [int(value)] * ndim
    values = [int(v) for v in value]
    if len(values) != ndim:
        raise ValueError(f"{name} needs {ndim} values, got {value!r}")
    return values


def pad3(values: Sequence[int], fill: int) -> Tuple[int, int, int]:
    return tuple(list(values) + [fill] * (MAX_NDIM - len(values)))  # type: ignore


def _unsupported_flag(name: str, value, why: str) -> None:
    if value:
        raise NotImplementedError(f"SparseConvTensor({name}={value!r}) is not supported: {why}")


class SparseConvTensor:
    """spconv's sparse tensor: ``features [N, C]``, int32 ``indices [N, ndim + 1]``,
    ``spatial_shape`` and ``batch_size``. ``force_algo`` makes every conv and pool run that
    algo's dataflow."""

    def __init__(self, features: torch.Tensor, indices: torch.Tensor, spatial_shape, batch_size: int,
                 grid: Optional[torch.Tensor] = None, voxel_num: Optional[torch.Tensor] = None,
                 indice_dict: Optional[dict] = None, benchmark: bool = False,
                 permanent_thrust_allocator: bool = False, enable_timer: bool = False,
                 force_algo: Optional[ConvAlgo] = None):
        _unsupported_flag("benchmark", benchmark, "spconv's per-layer timing records; use torchsparse-pp bench / tune")
        _unsupported_flag("enable_timer", enable_timer, "spconv's CUDA kernel timer; use torch.profiler")
        _unsupported_flag("permanent_thrust_allocator", permanent_thrust_allocator,
                          "it configures spconv's CUDA sort buffers, which torchsparse_pp does not have")
        self._check(features, indices, spatial_shape, batch_size)
        self._features = features
        self.indices = indices
        self.spatial_shape = [int(v) for v in spatial_shape]
        self.batch_size = int(batch_size)
        self.indice_dict = {} if indice_dict is None else indice_dict
        self.grid = torch.Tensor() if grid is None else grid  # stored, as spconv 2.x does; RemoveGrid drops it
        self.voxel_num = voxel_num
        from .algo import as_algo
        self.force_algo = as_algo(force_algo)
        self.benchmark = False
        self._state = PassState()

    @staticmethod
    def _check(features, indices, spatial_shape, batch_size) -> None:
        if not isinstance(features, torch.Tensor) or features.dim() != 2:
            raise ValueError(f"features must be a [N, C] tensor, got {getattr(features, 'shape', type(features))}")
        if not isinstance(indices, torch.Tensor) or indices.dim() != 2 or indices.dtype != torch.int32:
            raise ValueError("indices must be an int32 [N, ndim + 1] tensor (batch first), got "
                             f"{getattr(indices, 'dtype', type(indices))} {tuple(getattr(indices, 'shape', ()))}")
        ndim = indices.shape[1] - 1
        if not 1 <= ndim <= MAX_NDIM:
            raise NotImplementedError(f"{ndim}-D indices: torchsparse_pp's spconv adapter supports 1-, 2- and 3-D")
        if len(spatial_shape) != ndim:
            raise ValueError(f"spatial_shape {list(spatial_shape)} must have {ndim} entries for these indices")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if features.shape[0] != indices.shape[0]:
            raise ValueError(f"{features.shape[0]} feature rows for {indices.shape[0]} indices")
        if indices.shape[0]:
            low, high = indices.amin(0).tolist(), indices.amax(0).tolist()
            limits = [int(batch_size)] + [int(v) for v in spatial_shape]
            for axis, (lo, hi, n) in enumerate(zip(low, high, limits)):
                if lo < 0 or hi >= n:
                    what = "batch index" if axis == 0 else f"spatial axis {axis - 1}"
                    raise ValueError(f"indices: {what} spans [{lo}, {hi}], outside [0, {n}) "
                                     f"(batch_size={batch_size}, spatial_shape={list(spatial_shape)})")

    @classmethod
    def _derived(cls, source: "SparseConvTensor", features, indices, spatial_shape, indice_dict) -> "SparseConvTensor":
        """A tensor made by a layer from checked parts; it shares ``source``'s pass state."""
        out = cls.__new__(cls)
        out._features = features
        out.indices = indices
        out.spatial_shape = list(spatial_shape)
        out.batch_size = source.batch_size
        out.indice_dict = indice_dict
        out.grid = source.grid
        out.voxel_num = source.voxel_num
        out.force_algo = source.force_algo
        out.benchmark = False
        out._state = source._state
        return out

    # --- spconv's API ---------------------------------------------------------------------------
    @property
    def features(self) -> torch.Tensor:
        return self._features

    @features.setter
    def features(self, value) -> None:
        raise ValueError("features cannot be assigned; use x = x.replace_feature(new_features) (as in spconv 2.x)")

    @property
    def ndim(self) -> int:
        return self.indices.shape[1] - 1

    @property
    def is_quantized(self) -> bool:
        return self._features.dtype == torch.qint8

    @property
    def spatial_size(self) -> int:
        return int(np.prod(self.spatial_shape))

    def replace_feature(self, feature: torch.Tensor) -> "SparseConvTensor":
        """A tensor with these indices and ``feature``. As in spconv, the number of rows may differ
        from the indices' (code such as VoxelNeXt assigns matching ``indices`` next); layers
        check that they agree (check_rows)."""
        if not isinstance(feature, torch.Tensor) or feature.dim() != 2:
            raise ValueError(f"replacement features must be a [N, C] tensor, got {getattr(feature, 'shape', type(feature))}")
        return SparseConvTensor._derived(self, feature, self.indices, self.spatial_shape, self.indice_dict)

    def check_rows(self, layer: str) -> None:
        """Features and indices describe the same sites (replace_feature and assignments to
        ``indices`` may leave them apart)."""
        if self._features.shape[0] != self.indices.shape[0]:
            raise ValueError(f"{layer}: the input has {self._features.shape[0]} feature rows but "
                             f"{self.indices.shape[0]} indices (set matching indices after replace_feature)")

    def shadow_copy(self) -> "SparseConvTensor":
        return SparseConvTensor._derived(self, self._features, self.indices, self.spatial_shape, self.indice_dict)

    def select_by_index(self, valid_indices: torch.Tensor) -> "SparseConvTensor":
        # As in spconv, the shared indice_dict is cleared: its maps were made for other indices.
        self.indice_dict.clear()
        return SparseConvTensor._derived(self, self._features[valid_indices], self.indices[valid_indices],
                                         self.spatial_shape, self.indice_dict)

    def minus(self) -> "SparseConvTensor":
        return self.replace_feature(-self._features)

    def dequantize(self) -> "SparseConvTensor":
        return self.replace_feature(self._features.dequantize())

    def q_scale(self):
        if self.is_quantized:
            return self._features.q_scale()
        raise ValueError("sparse tensor must be quantized")

    def find_indice_pair(self, key) -> Optional[IndiceData]:
        return None if key is None else self.indice_dict.get(key)

    def dense(self, channels_first: bool = True) -> torch.Tensor:
        """Dense ``[B, C, *spatial]`` (or channels last), differentiable."""
        out = self._features.new_zeros([self.batch_size] + self.spatial_shape + [self._features.shape[1]])
        out = out.index_put(tuple(self.indices.long().t()), self._features)
        if not channels_first:
            return out
        return out.permute(0, self.ndim + 1, *range(1, self.ndim + 1)).contiguous()

    @classmethod
    def from_dense(cls, x: torch.Tensor) -> "SparseConvTensor":
        """Sites of a channels-last ``[B, *spatial, C]`` tensor where any channel is non-zero."""
        present = (x != 0).any(-1)
        indices = present.nonzero().int()
        return cls(x[present], indices, list(x.shape[1:-1]), x.shape[0])

    def _other_features(self, other) -> torch.Tensor:
        if isinstance(other, SparseConvTensor):
            return other.features
        if isinstance(other, torch.Tensor):
            return other
        raise TypeError(f"cannot add a {type(other).__name__} to a SparseConvTensor")

    def __add__(self, other) -> "SparseConvTensor":
        return self.replace_feature(self._features + self._other_features(other))

    __radd__ = __add__

    def __iadd__(self, other) -> "SparseConvTensor":
        self._features += self._other_features(other)
        return self

    def __repr__(self) -> str:
        return f"SparseConvTensor[shape={tuple(self._features.shape)}]"

    # --- bridge to the library -------------------------------------------------------------------
    def library_tensor(self, features: Optional[torch.Tensor] = None, indices: Optional[torch.Tensor] = None,
                       stride=(1, 1, 1), spatial_shape: Optional[Sequence[int]] = None,
                       state: Optional[PassState] = None) -> SparseTensor:
        """A torchsparse_pp SparseTensor on these indices (or ``indices``) in ``state``'s cache.
        The tensor stride only matters to transposed convs, which need a whole finer stride."""
        state = self._state if state is None else state
        coords = state.coords4(self.indices if indices is None else indices)
        shape = self.spatial_shape if spatial_shape is None else spatial_shape
        return SparseTensor._derive(self._features if features is None else features, coords, tuple(stride),
                                    pad3(shape, 1), state.cache)
