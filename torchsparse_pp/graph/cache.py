"""Relational maps cached by the edge tensors they were built from, so the layers of a model
(and every epoch) that pass the same edge_index / edge_type share one map.

The key is the tensors' identity and version counters plus what defines the map (node counts,
relation count, aggregation): an in-place edit of the edges bumps the version and builds anew.
Entries hold weak references, so a freed edge tensor never matches a new one at the same id.
"""
import weakref
from collections import OrderedDict
from typing import Optional

import torch

from .relational_map import RelationalMap, relational_map

MAX_ENTRIES = 8
_entries: "OrderedDict[tuple, tuple]" = OrderedDict()


def cached_relational_map(edge_index: torch.Tensor, edge_type: torch.Tensor, num_relations: int,
                          num_nodes: int, num_dst: Optional[int], aggr: str) -> RelationalMap:
    """relational_map(...) of these tensors, built once while they live unchanged."""
    if not isinstance(edge_index, torch.Tensor) or not isinstance(edge_type, torch.Tensor):
        return relational_map(edge_index, edge_type, num_relations, num_nodes, num_dst, aggr)  # raises
    if edge_index.is_inference() or edge_type.is_inference():  # no version counter to key on: not cached
        return relational_map(edge_index, edge_type, num_relations, num_nodes, num_dst, aggr)
    key = (id(edge_index), id(edge_type), edge_index._version, edge_type._version, num_relations, num_nodes,
           num_dst, aggr)
    entry = _entries.get(key)
    if entry is not None and entry[0]() is edge_index and entry[1]() is edge_type:
        _entries.move_to_end(key)
        return entry[2]
    rmap = relational_map(edge_index, edge_type, num_relations, num_nodes, num_dst, aggr)
    _entries[key] = (weakref.ref(edge_index), weakref.ref(edge_type), rmap)
    while len(_entries) > MAX_ENTRIES:
        _entries.popitem(last=False)
    return rmap


def clear() -> None:
    _entries.clear()
