"""torchsparse.backend: the parts of 2.1's compiled backend that client code calls directly
(SPVNAS: the coordinate hash table), in plain torch ops."""
from .hash_table import GPUHashTable, GPUHashTable32

__all__ = ["GPUHashTable", "GPUHashTable32"]
