"""torchsparse 2.1's coordinate hashing: ``sphash`` (its 64-bit FNV-1a of the four int32 columns,
bit for bit) and ``sphashquery`` (position of each query hash among reference hashes)."""
from typing import Optional

import torch

from ...backend.fnv import fnv1a64

_LOW60 = (1 << 60) - 1


def _fnv(columns) -> torch.Tensor:
    h = fnv1a64(columns)
    return ((h >> 60) & 0xF) ^ (h & _LOW60)  # 2.1's sphash folds the top 4 bits into the rest


def sphash(coords: torch.Tensor, offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """int64 hashes ``[N]`` of int32 ``coords [N, 4]``; with ``offsets [K, 3]`` (added to the first
    three columns) ``[K, N]``."""
    if coords.dtype != torch.int32 or coords.dim() != 2 or coords.shape[1] != 4:
        raise ValueError(f"coords must be int32 [N, 4], got {coords.dtype} {tuple(coords.shape)}")
    cols = coords.unbind(1)
    if offsets is None:
        return _fnv(cols)
    if offsets.dtype != torch.int32 or offsets.dim() != 2 or offsets.shape[1] != 3:
        raise ValueError(f"offsets must be int32 [K, 3], got {offsets.dtype} {tuple(offsets.shape)}")
    return torch.stack([_fnv([cols[0] + o[0], cols[1] + o[1], cols[2] + o[2], cols[3]]) for o in offsets])


def sphashquery(queries: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
    """For every int64 hash in ``queries`` (any shape), its int64 index in ``references`` or -1;
    the first of repeated references (2.1's CPU table keeps the first insert)."""
    for name, t in (("queries", queries), ("references", references)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
            raise TypeError(f"sphashquery {name} must be int64 hashes, got {getattr(t, 'dtype', type(t).__name__)}")
    flat = queries.reshape(-1)
    sorted_refs, order = torch.sort(references.reshape(-1), stable=True)
    if sorted_refs.numel() == 0:
        return torch.full_like(queries, -1)
    pos = torch.searchsorted(sorted_refs, flat).clamp(max=sorted_refs.numel() - 1)
    found = sorted_refs[pos] == flat
    return torch.where(found, order[pos], torch.full_like(pos, -1)).view(queries.shape)
