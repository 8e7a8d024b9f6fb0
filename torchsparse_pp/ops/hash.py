"""Exact coordinate hash table: torch.ops.torchsparse_pp.hash_build / hash_query."""
from typing import Tuple

import torch

_ops = torch.ops.torchsparse_pp


def hash_build(coords: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Builds an open-addressing table of int32 ``[N, 4]`` coordinates.

    Returns ``(keys, vals)``: packed int64 keys (-1 where empty) and the row index of each key.
    Raises for duplicate coordinates and for coordinates outside the packable range.
    """
    return _ops.hash_build(coords)


def hash_query(keys: torch.Tensor, vals: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Row index of every query coordinate in the table, or -1 where absent."""
    return _ops.hash_query(keys, vals, query)


@torch.library.register_fake("torchsparse_pp::hash_build")
def _hash_build_fake(coords):
    capacity = torch.library.get_ctx().new_dynamic_size()
    return coords.new_empty(capacity, dtype=torch.int64), coords.new_empty(capacity, dtype=torch.int32)


@torch.library.register_fake("torchsparse_pp::hash_query")
def _hash_query_fake(keys, vals, query):
    return query.new_empty(query.shape[0], dtype=torch.int32)
