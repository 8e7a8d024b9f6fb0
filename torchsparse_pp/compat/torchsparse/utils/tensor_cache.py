"""torchsparse 2.1's tensor caches: what the tensors of one pass share.

``library`` is the torchsparse_pp kernel-map cache the adapter's convs use; ``kmaps`` records
those maps under 2.1's keys ``(tensor stride, kernel size, stride, dilation)`` (transposed convs
look them up there), ``cmaps`` the coordinates per tensor stride. Other attributes may be set
freely (SPVNAS stores its point-voxel queries here)."""
import copy
from enum import Enum
from typing import Any, Dict, Tuple

from ....kmap.cache import KernelMapCache


class TensorCacheMode(Enum):
    SEPARATE_TENSOR_CACHE = 0
    GLOBAL_TENSOR_CACHE = 1


class _KernelMaps(dict):
    """2.1's kmaps dict; clearing it also drops the library maps behind it."""

    def __init__(self, library: KernelMapCache):
        super().__init__()
        self.library = library

    def clear(self) -> None:
        super().clear()
        self.library.clear()


class TensorCache:
    def __init__(self) -> None:
        self.library = KernelMapCache()
        self.cmaps: Dict[Tuple[int, ...], Tuple[Any, Any]] = {}
        self.kmaps: Dict[Tuple[Any, ...], Any] = _KernelMaps(self.library)
        self.hashmaps: Dict[Tuple[int, ...], Any] = {}


_mode = TensorCacheMode.SEPARATE_TENSOR_CACHE
_global_cache = None


def set_tensor_cache_mode(mode: TensorCacheMode) -> None:
    """GLOBAL_TENSOR_CACHE: every new SparseTensor shares one cache until
    ``clear_global_tensor_cache()`` (call it after each forward / backward)."""
    global _mode
    if not isinstance(mode, TensorCacheMode):
        raise TypeError(f"mode must be a TensorCacheMode, got {mode!r}")
    _mode = mode


def get_tensor_cache_mode() -> TensorCacheMode:
    return copy.deepcopy(_mode)


def get_global_tensor_cache():
    return _global_cache


def set_global_tensor_cache(tensor_cache) -> None:
    global _global_cache
    _global_cache = tensor_cache


def clear_global_tensor_cache() -> None:
    global _global_cache
    _global_cache = None


def new_cache() -> TensorCache:
    """The cache a new SparseTensor starts with under the current mode."""
    if _mode == TensorCacheMode.GLOBAL_TENSOR_CACHE:
        if _global_cache is None:
            set_global_tensor_cache(TensorCache())
        return _global_cache
    return TensorCache()
