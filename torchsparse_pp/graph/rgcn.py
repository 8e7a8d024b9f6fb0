"""RGCNConv: the relational graph convolution of Schlichtkrull et al. over the sparse-conv
dataflows, with torch_geometric's parameter names, shapes and semantics.

    out_i = x_i Theta_root + sum_r sum_{j in N_r(i)} c_{i,r} x_j W_r + bias

for edges j -> i (``edge_index[0]`` sources, ``edge_index[1]`` destinations), c = 1/|N_r(i)|
(aggr 'mean') or 1 ('sum' / 'add'). Basis decomposition: W_r = sum_b comp[r, b] V_b
(``weight`` holds the bases); block decomposition: W_r block-diagonal with ``weight [R, blocks,
C_in / blocks, C_out / blocks]``. ``x=None`` (featureless) uses one-hot node inputs: node j's
message is the weight row ``W_r[j]`` and its root term ``root[j]``; a 1-D int64 ``x`` indexes those
rows instead.
"""
import math
from typing import Optional, Tuple, Union

import torch
from torch import nn

from .cache import cached_relational_map
from .functional import DataflowLike, graph_configs, relational_conv, relational_lookup
from .relational_map import AGGREGATIONS, RelationalMap


def _glorot(param: Optional[torch.Tensor]) -> None:
    """Uniform in +-sqrt(6 / (fan_in + fan_out)) over the last two dimensions."""
    if param is not None:
        bound = math.sqrt(6.0 / (param.size(-2) + param.size(-1)))
        with torch.no_grad():
            param.uniform_(-bound, bound)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class RGCNConv(nn.Module):
    """Relational graph convolution (see the module docstring).

    ``in_channels``: input channels, or the number of nodes for featureless input; a pair
    (source, destination) for bipartite graphs. ``dataflow``: the sparse-conv dataflow of the
    relation GEMMs ('gather_scatter', 'fetch_on_demand', 'implicit_gemm', or a ConvConfig /
    PassConfigs for per-pass choices and the Triton backend); None is the measured default
    (functional.DEFAULT_DATAFLOW). torch_geometric's ``aggr='max'``, ``is_sorted=True`` and extra
    MessagePassing options are not implemented and raise NotImplementedError.
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, num_relations: int,
                 num_bases: Optional[int] = None, num_blocks: Optional[int] = None, aggr: str = "mean",
                 root_weight: bool = True, is_sorted: bool = False, bias: bool = True,
                 dataflow: DataflowLike = None, **kwargs):
        super().__init__()
        if kwargs:
            raise NotImplementedError(f"RGCNConv does not implement torch_geometric's MessagePassing options "
                                      f"{sorted(kwargs)}")
        if aggr not in AGGREGATIONS:
            if aggr in ("max", "min", "mul", "std", "var") or not isinstance(aggr, str):
                raise NotImplementedError(f"aggr={aggr!r} is not implemented; supported: {AGGREGATIONS}")
            raise ValueError(f"unknown aggr {aggr!r}; supported: {AGGREGATIONS}")
        if is_sorted:
            raise NotImplementedError("is_sorted=True is not implemented: the relational map sorts the edges itself "
                                      "(leave is_sorted=False)")
        if num_bases is not None and num_blocks is not None:
            raise ValueError("num_bases and num_blocks exclude each other (basis or block decomposition)")
        pair = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        if len(pair) != 2:
            raise ValueError(f"in_channels must be an int or a (source, destination) pair, got {in_channels!r}")
        src_channels = _positive_int(pair[0], "in_channels")
        dst_channels = _positive_int(pair[1], "in_channels (destination)")
        _positive_int(out_channels, "out_channels")
        _positive_int(num_relations, "num_relations")
        graph_configs(dataflow, "cpu")  # rejects an unknown dataflow now
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self.in_channels_l = src_channels
        self.num_bases, self.num_blocks, self.aggr, self.dataflow = num_bases, num_blocks, aggr, dataflow
        if num_bases is not None:
            _positive_int(num_bases, "num_bases")
            self.weight = nn.Parameter(torch.empty(num_bases, src_channels, out_channels))
            self.comp = nn.Parameter(torch.empty(num_relations, num_bases))
        elif num_blocks is not None:
            _positive_int(num_blocks, "num_blocks")
            if src_channels % num_blocks or out_channels % num_blocks:
                raise ValueError(f"num_blocks={num_blocks} must divide in_channels ({src_channels}) and "
                                 f"out_channels ({out_channels})")
            self.weight = nn.Parameter(torch.empty(num_relations, num_blocks, src_channels // num_blocks,
                                                   out_channels // num_blocks))
            self.register_parameter("comp", None)
        else:
            self.weight = nn.Parameter(torch.empty(num_relations, src_channels, out_channels))
            self.register_parameter("comp", None)
        self.root = nn.Parameter(torch.empty(dst_channels, out_channels)) if root_weight else None
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot(self.weight)
        _glorot(self.comp)
        _glorot(self.root)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def relation_weights(self) -> torch.Tensor:
        """W ``[R, C_in, C_out]`` after the basis or block decomposition."""
        w = self.weight
        if self.num_bases is not None:
            return (self.comp @ w.reshape(self.num_bases, -1)).view(self.num_relations, self.in_channels_l,
                                                                   self.out_channels)
        if self.num_blocks is not None:
            # W_r[b * p + s, c * q + t] = weight[r, b, s, t] when b == c, else 0.
            eye = torch.eye(self.num_blocks, dtype=w.dtype, device=w.device)
            full = torch.einsum("rbst,bc->rbsct", w, eye)
            return full.reshape(self.num_relations, self.in_channels_l, self.out_channels)
        return w

    def relational_map(self, edge_index: torch.Tensor, edge_type: torch.Tensor, num_src: int,
                       num_dst: int) -> RelationalMap:
        """The (cached) map of these edges with this layer's aggregation."""
        return cached_relational_map(edge_index, edge_type, self.num_relations, num_src, num_dst, self.aggr)

    def _inputs(self, x):
        x_src, x_dst = x if isinstance(x, tuple) else (x, x)
        for name, value in (("x", x_src), ("x (destination)", x_dst)):
            if value is not None and not isinstance(value, torch.Tensor):
                raise TypeError(f"{name} must be a tensor or None, got {type(value).__name__}")
            if isinstance(value, torch.Tensor) and not value.is_floating_point():
                if value.dtype != torch.int64 or value.dim() != 1:
                    raise TypeError(f"{name} as node indices must be a 1-D int64 tensor, got {value.dtype} "
                                    f"{list(value.shape)}")
        if x_src is None:
            x_src = torch.arange(self.in_channels_l, device=self.weight.device)
        if x_dst is None:
            x_dst = x_src if not isinstance(x, tuple) else None
        if x_dst is None:
            raise ValueError("featureless destination nodes need x = (x_src, x_dst) with x_dst a node index "
                             "tensor or features")
        return x_src, x_dst

    def forward(self, x: Union[Optional[torch.Tensor], Tuple[Optional[torch.Tensor], torch.Tensor]],
                edge_index: Union[torch.Tensor, RelationalMap], edge_type: Optional[torch.Tensor] = None):
        """``[num_dst, out_channels]`` for node features ``x [num_nodes, in_channels]`` (or None /
        node indices, or a (source, destination) pair), edges ``edge_index [2, E]`` and their
        relations ``edge_type [E]`` (or a RelationalMap built beforehand, with edge_type None)."""
        x_src, x_dst = self._inputs(x)
        if isinstance(edge_index, RelationalMap):
            if edge_type is not None:
                raise ValueError("pass edge_type=None with a RelationalMap (the map holds the relations)")
            rmap = edge_index
            if rmap.num_relations != self.num_relations or rmap.aggr != ("sum" if self.aggr == "add" else self.aggr):
                raise ValueError(f"the map has {rmap.num_relations} relations and aggr={rmap.aggr!r}; this layer "
                                 f"{self.num_relations} and aggr={self.aggr!r}")
        else:
            if edge_type is None:
                raise ValueError("edge_type is required with an edge_index tensor")
            if not isinstance(edge_index, torch.Tensor):
                raise TypeError(f"edge_index must be an int64 [2, E] tensor or a RelationalMap, got "
                                f"{type(edge_index).__name__} (sparse adjacency types are not supported)")
            rmap = self.relational_map(edge_index, edge_type, x_src.shape[0], x_dst.shape[0])
        weight = self.relation_weights()
        if x_src.is_floating_point():
            out = relational_conv(x_src, weight, rmap, self.dataflow)
        else:
            if self.num_blocks is not None:
                raise ValueError("block-diagonal decomposition needs float input features (not node indices / None)")
            if rmap.num_src != x_src.shape[0]:
                raise ValueError(f"x has {x_src.shape[0]} nodes but the map has {rmap.num_src} source nodes")
            out = relational_lookup(weight, rmap, None if x is None or (isinstance(x, tuple) and x[0] is None)
                                    else x_src)
        # In place: the relation sum is a fresh tensor its backward does not read, and a graph's
        # [nodes, C] temporaries are a layer's largest buffers after it.
        if self.root is not None:
            if x_dst.is_floating_point():
                out = out.addmm_(x_dst, self.root)
            else:
                out = out.add_(self.root[x_dst])
        if self.bias is not None:
            out = out.add_(self.bias)
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}, aggr={self.aggr!r}"
