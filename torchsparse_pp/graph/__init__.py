"""Relational graph convolution (R-GCN) on the sparse-convolution dataflows: relations are
kernel offsets, each with its own weight (see relational_map.py)."""
from .functional import DEFAULT_DATAFLOW, relational_conv, relational_lookup
from .relational_map import RelationalMap, RelationPairsMap, relational_map
from .rgcn import RGCNConv

__all__ = ["DEFAULT_DATAFLOW", "RGCNConv", "RelationalMap", "RelationPairsMap", "relational_conv",
           "relational_lookup", "relational_map"]
