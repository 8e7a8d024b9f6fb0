"""Exact coordinate hash table: torch.ops.torchsparse_pp.hash_build / hash_query."""
import torch

_ops = torch.ops.torchsparse_pp


def hash_build(coords: torch.Tensor) -> torch.Tensor:
    """Open-addressing table of int32 ``[N, 4]`` coordinates.

    Returns a ``[capacity, 2]`` int64 tensor of (packed key, row) slots, -1 keys where empty.
    Raises for duplicate coordinates and for coordinates outside the packable range.
    """
    return _ops.hash_build(coords)


def hash_query(table: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Row of every query coordinate in the table, or -1 where absent."""
    return _ops.hash_query(table, query)


@torch.library.register_fake("torchsparse_pp::hash_build")
def _hash_build_fake(coords):
    return coords.new_empty(torch.library.get_ctx().new_dynamic_size(), 2, dtype=torch.int64)


@torch.library.register_fake("torchsparse_pp::hash_query")
def _hash_query_fake(table, query):
    return query.new_empty(query.shape[0], dtype=torch.int32)
