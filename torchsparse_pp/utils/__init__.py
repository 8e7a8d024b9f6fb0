"""Utilities: voxelisation and batching."""
from .collate import sparse_collate, sparse_collate_fn
from .quantize import sparse_quantize

__all__ = ["sparse_quantize", "sparse_collate", "sparse_collate_fn"]
