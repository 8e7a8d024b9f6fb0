"""Kernel maps: construction, caching and the output-stationary / weight-stationary views.

Built by the compiled ops or by torch_ops (plain torch ops, any device), as
``backends.kmap_backend`` chooses (see dispatch.py)."""
from .build import DOWNSAMPLE_MODES, generative_map, strided_map, submanifold_map, transposed_source_map
from .cache import KernelMapCache, KernelMapKey
from .dispatch import kmap_backend_for, kmap_ops
from .geometry import ConvGeometry
from .kernel_map import OUT_IN_ROW_PADDING, KernelMap, PairsView

__all__ = [
    "ConvGeometry", "KernelMap", "KernelMapCache", "KernelMapKey", "PairsView", "OUT_IN_ROW_PADDING",
    "DOWNSAMPLE_MODES", "submanifold_map", "strided_map", "generative_map", "transposed_source_map",
    "kmap_backend_for", "kmap_ops",
]
