"""Utilities: voxelisation, batching and the process's malloc settings."""
from .collate import sparse_collate, sparse_collate_fn
from .malloc import keep_freed_memory, malloc_settings
from .quantize import sparse_quantize

__all__ = ["sparse_quantize", "sparse_collate", "sparse_collate_fn", "keep_freed_memory", "malloc_settings"]
