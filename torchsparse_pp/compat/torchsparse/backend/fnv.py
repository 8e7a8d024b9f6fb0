"""torchsparse 2.1's 64-bit FNV-1a hash of int32 coordinate rows, in int64 torch ops (products
wrap modulo 2^64 as the uint64 ones of its kernels; each column enters as its 32-bit pattern)."""
from typing import Sequence

import torch

FNV_OFFSET = 14695981039346656037 - (1 << 64)  # as a signed int64
FNV_PRIME = 1099511628211


def fnv1a64(columns: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 hashes of the rows whose columns are ``columns`` (integer tensors of one shape)."""
    h = torch.full_like(columns[0], FNV_OFFSET, dtype=torch.int64)
    for column in columns:
        h = (h ^ (column.long() & 0xFFFFFFFF)) * FNV_PRIME
    return h


def low32(h: torch.Tensor) -> torch.Tensor:
    """The int32 a C++ ``(int)`` cast of a 64-bit hash gives (its low 32 bits)."""
    return (((h & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000).int()
