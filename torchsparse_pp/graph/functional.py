"""Relational graph convolution over a RelationalMap, functional form.

``out = sum_r sum_{j in N_r(i)} c_{i,r} x_j W_r``: the scaled neighbour rows summed per
(relation, destination) segment (``A @ x``), then one pass of the sparse-conv dataflows over the
relation pairs (segment u = (r, i) -> node i through W_r). Autograd runs the dataflows' dgrad and
wgrad over the same pairs, and ``A^T`` for the input gradient.
"""
from typing import Optional, Union

import torch

from .. import backends
from ..nn.functional.config import ConfigLike, ConvConfig, resolve_for_call
from ..nn.functional.dataflows import OrientedMap, sparse_conv
from .aggregate import sparse_row_sums
from .relational_map import RelationalMap

FLOAT_DTYPES = (torch.float32, torch.float64)

# The fastest of the three in 8 of 12 cases measured: AIFB-, MUTAG- and BGS-like graphs at 16 and
# 64 channels, forward and training step (benchmarks/rgcn_cpu.py; docs/graph.md has the numbers;
# gather_scatter wins on the larger graphs at 64 channels).
DEFAULT_DATAFLOW = "fetch_on_demand"

DataflowLike = Union[str, ConfigLike, None]


def graph_configs(dataflow: DataflowLike, device):
    """(PassConfigs, text) for a dataflow name, a ConvConfig / PassConfigs, or None (the default),
    on tensors on ``device``."""
    if dataflow is None:
        dataflow = DEFAULT_DATAFLOW
    if isinstance(dataflow, str):
        dataflow = ConvConfig(dataflow)
    return resolve_for_call(dataflow, torch.device(device))


def _check_weight(weight: torch.Tensor, rmap: RelationalMap, channels: Optional[int], name: str = "weight"):
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
        raise ValueError(f"{name} must be a [num_relations, C_in, C_out] tensor, got "
                         f"{list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.shape[0] != rmap.num_relations:
        raise ValueError(f"{name} has {weight.shape[0]} relations but the map has {rmap.num_relations}")
    if channels is not None and weight.shape[1] != channels:
        raise ValueError(f"channel mismatch: x has {channels} channels but {name} expects {weight.shape[1]}")
    if weight.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {weight.dtype}")


def relational_conv(x: torch.Tensor, weight: torch.Tensor, rmap: RelationalMap,
                    dataflow: DataflowLike = None) -> torch.Tensor:
    """``[num_dst, C_out]``: the relation sum of R-GCN (no root term, no bias) of node features
    ``x [num_src, C_in]`` with per-relation weights ``weight [R, C_in, C_out]``."""
    if not isinstance(rmap, RelationalMap):
        raise TypeError(f"rmap must be a RelationalMap, got {type(rmap).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a [num_nodes, C_in] tensor, got "
                         f"{list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.shape[0] != rmap.num_src:
        raise ValueError(f"x has {x.shape[0]} rows but the map has {rmap.num_src} source nodes")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be float32 or float64, got {x.dtype}")
    _check_weight(weight, rmap, x.shape[1])
    if weight.dtype != x.dtype:
        raise TypeError(f"weight dtype {weight.dtype} does not match x dtype {x.dtype}")
    if weight.device != x.device or rmap.edge_src.device != x.device:
        raise ValueError(f"x ({x.device}), weight ({weight.device}) and the map ({rmap.edge_src.device}) must "
                         "share one device")
    configs, text = graph_configs(dataflow, x.device)
    segments = sparse_row_sums(x, *rmap.matrices(x.dtype))
    return sparse_conv(segments, weight.contiguous(), OrientedMap(rmap.pairs, False), configs, text,
                       backends.deterministic, backends.allow_tf32)


def relational_lookup(weight: torch.Tensor, rmap: RelationalMap, node_index: Optional[torch.Tensor] = None):
    """The relation sum for featureless nodes: node j's input is a one-hot row, so its message
    through relation r is the weight row ``weight[r, j]`` (``weight[r, node_index[j]]`` with a
    node index input), ``[num_dst, C_out]``."""
    _check_weight(weight, rmap, None)
    rows = weight.shape[1]
    if node_index is None:
        if rows != rmap.num_src:
            raise ValueError(f"featureless input needs one weight row per source node: weight has {rows} rows "
                             f"per relation, the map {rmap.num_src} source nodes")
    elif node_index.numel() and (int(node_index.min()) < 0 or int(node_index.max()) >= rows):
        raise ValueError(f"node index input has values outside [0, {rows}) (the weight's rows per relation)")
    b, b_t = rmap.lookup_matrices(weight.dtype, rows, node_index)
    return sparse_row_sums(weight.reshape(-1, weight.shape[2]), b, b_t)
