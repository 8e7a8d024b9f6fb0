"""A relational map: a graph's typed edges as the kernel-map views the dataflows read.

Relation r plays the part of kernel offset r. The edges (src j -> dst i) are sorted stably by
relation, then destination, then source. A *segment* is one (relation, destination) pair with at
least one edge; its edges are N_r(i). The map has two parts:

- the **aggregation** ``A [num_segments, num_src]`` (CSR): row u = (r, i) holds the per-pair
  scales c_{i,r} of i's r-neighbours (1/|N_r(i)| for mean, 1 for sum; repeated edges add up);
  ``A @ x`` sums the scaled gathered rows per segment;
- the **relation pairs**, a KernelMap whose offset r pairs segment u = (r, i) (source row) with
  node i (destination row). Within one relation each segment and each node appears at most once,
  as in a point-cloud map, so every dataflow (gather_scatter, fetch_on_demand and implicit_gemm,
  native and Triton) runs forward, dgrad and wgrad over these pairs unchanged.

The convolution is then ``out = pairs_conv(A @ x, W)``: per relation one GEMM over its segments,
``sum_r sum_{i} (sum_{j in N_r(i)} c_{i,r} x_j) W_r``, which is the R-GCN sum with
|segments| <= |edges| rows multiplied instead of one per edge.
"""
import warnings
from typing import List, Optional, Tuple

import torch

from ..kmap.geometry import ConvGeometry
from ..kmap.kernel_map import OUT_IN_ROW_PADDING, KernelMap, PairsView, validates_views
from ..ops.validate import validate_pairs

AGGREGATIONS = ("mean", "sum", "add")  # "add" is PyG's name for "sum"
INT32_MAX = (1 << 31) - 1


def _index_vector(value, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != torch.int64:
        raise TypeError(f"{name} must be int64 (torch.long), got {value.dtype}")
    return value


def check_edges(edge_index: torch.Tensor, edge_type: torch.Tensor, num_src: int, num_dst: int,
                num_relations: int) -> None:
    """Raises TypeError / ValueError naming the first problem with a typed edge list."""
    _index_vector(edge_index, "edge_index")
    _index_vector(edge_type, "edge_type")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {list(edge_index.shape)}")
    if edge_type.dim() != 1 or edge_type.shape[0] != edge_index.shape[1]:
        raise ValueError(f"edge_type must have shape [E] = [{edge_index.shape[1]}] (one relation per edge), "
                         f"got {list(edge_type.shape)}")
    if edge_index.device != edge_type.device:
        raise ValueError(f"edge_index is on {edge_index.device} but edge_type is on {edge_type.device}")
    for name, value, low in (("num_src", num_src, 0), ("num_dst", num_dst, 0), ("num_relations", num_relations, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT32_MAX:
            raise ValueError(f"{name} must be an int in [{low}, 2^31 - 1], got {value!r}")
    if edge_type.numel() == 0:
        return
    bounds = torch.stack([edge_index[0].min(), edge_index[0].max(), edge_index[1].min(), edge_index[1].max(),
                          edge_type.min(), edge_type.max()]).tolist()
    for (lo, hi), name, size in zip((bounds[0:2], bounds[2:4], bounds[4:6]),
                                    ("source index edge_index[0]", "destination index edge_index[1]", "edge_type"),
                                    (num_src, num_dst, num_relations)):
        if lo < 0:
            raise ValueError(f"{name} has a negative value ({lo})")
        if hi >= size:
            limit = "num_relations" if name == "edge_type" else ("the number of source nodes" if "source" in name
                                                                  else "the number of destination nodes")
            raise ValueError(f"{name} has value {hi}, out of range for {limit} = {size}")


def _sort_edges(src: torch.Tensor, dst: torch.Tensor, rel: torch.Tensor, num_src: int,
                num_dst: int) -> torch.Tensor:
    """The permutation that sorts edges by (relation, destination, source), ties kept in order."""
    if (rel.max().item() + 1) * num_dst * max(num_src, 1) < (1 << 62):
        return torch.sort((rel * num_dst + dst) * num_src + src, stable=True).indices
    order = torch.sort(src, stable=True).indices  # too wide for one key: two stable passes
    return order[torch.sort((rel * num_dst + dst)[order], stable=True).indices]


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: Tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():  # torch calls CSR tensors beta on every construction
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def _crow(rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    crow = torch.zeros(num_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(torch.bincount(rows, minlength=num_rows), 0, out=crow[1:])
    return crow


class RelationPairsMap(KernelMap):
    """The relation pairs as a KernelMap: offset r pairs segment rows (inputs) with nodes
    (outputs). The pairs are made from the sorted edges; the output-stationary table ``out_in
    [num_dst padded, R]`` that implicit_gemm walks is built only when first asked for (it has
    one int32 per node and relation)."""

    def __init__(self, seg_rel: torch.Tensor, seg_dst: torch.Tensor, num_segments: int, num_dst: int,
                 num_relations: int):
        geometry = ConvGeometry((num_relations, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0))
        self._num_segments, self._num_dst = num_segments, num_dst
        self._table: Optional[torch.Tensor] = None
        super().__init__(seg_dst.new_empty(0, 0), seg_dst.new_empty(0, 0), geometry, "relational", None,
                         None, None, 0.0, backend="native")
        offsets = _crow(seg_rel, num_relations)
        segments = torch.arange(num_segments, dtype=torch.int32, device=seg_dst.device)
        identity = torch.zeros(num_relations, dtype=torch.bool, device=seg_dst.device)
        # Segments are numbered in (relation, destination) order: within one relation both sides
        # ascend, so these pairs are sorted by output and by input at once.
        dst = seg_dst.int()
        host = None
        if validates_views(dst.device, self.backend):  # GPU kernels check nothing per call: check the pairs once
            host = validate_pairs(segments, dst, offsets, identity, num_segments, num_dst, sorted_by="dst",
                                  unique_src=True)
        view = PairsView(segments, dst, offsets, identity, host)
        self._pairs["out"] = self._pairs["in"] = view
        self._seg_rel = seg_rel

    @property
    def out_in(self) -> torch.Tensor:
        if self._table is None:
            rows = -(-max(self._num_dst, 1) // OUT_IN_ROW_PADDING) * OUT_IN_ROW_PADDING
            view = self._pairs["out"]
            table = torch.full((rows, self.geometry.volume), -1, dtype=torch.int32, device=view.in_idx.device)
            table[view.out_idx.long(), self._seg_rel] = view.in_idx
            self._table = table
        return self._table

    @out_in.setter
    def out_in(self, value):  # KernelMap.__init__ assigns it; the table is built lazily instead
        if value is not None:
            raise ValueError("a relational map builds its table itself")

    @property
    def num_in(self) -> int:
        return self._num_segments

    @property
    def num_out(self) -> int:
        return self._num_dst

    def __repr__(self) -> str:
        return (f"RelationPairsMap(relations={self.geometry.volume}, {self.num_in} segments -> "
                f"{self.num_out} nodes)")


class RelationalMap:
    """The map of one typed edge list (see the module docstring). Build it with
    ``relational_map``; ``pairs`` is the RelationPairsMap the dataflows read, ``aggregation`` /
    ``aggregation_t`` are A and A^T (CSR), ``edge_order`` the permutation that sorted the edges
    and ``edge_scale`` the sorted edges' scales c_{i,r}."""

    def __init__(self, edge_index: torch.Tensor, edge_type: torch.Tensor, num_src: int, num_dst: int,
                 num_relations: int, aggr: str):
        device = edge_index.device
        src, dst, rel = edge_index[0], edge_index[1], edge_type
        if rel.numel():
            order = _sort_edges(src, dst, rel, num_src, num_dst)
        else:
            order = torch.zeros(0, dtype=torch.int64, device=device)
        src, dst, rel = src[order], dst[order], rel[order]
        keys = rel * num_dst + dst
        seg_keys, seg_of_edge, seg_sizes = torch.unique_consecutive(keys, return_inverse=True, return_counts=True)
        self.num_src, self.num_dst, self.num_relations, self.aggr = num_src, num_dst, num_relations, aggr
        self.num_segments = seg_keys.numel()
        self.edge_order = order
        self.edge_src, self.edge_rel = src, rel
        self.edge_segment = seg_of_edge
        self.edge_scale_float64 = (1.0 / seg_sizes.double())[seg_of_edge] if aggr == "mean" else \
            torch.ones(src.numel(), dtype=torch.float64, device=device)
        self.segment_sizes = seg_sizes
        self.pairs = RelationPairsMap(seg_keys // max(num_dst, 1), seg_keys % max(num_dst, 1), self.num_segments,
                                      num_dst, num_relations)
        self._crow = _crow(seg_of_edge, self.num_segments)
        order_t = torch.sort(src * max(self.num_segments, 1) + seg_of_edge, stable=True).indices
        self._order_t, self._crow_t = order_t, _crow(src, num_src)
        self._matrices = {}

    @property
    def relation_counts(self) -> List[int]:
        """Relation pairs (segments) per relation."""
        return self.pairs.pairs.counts

    def edge_scale(self, dtype: torch.dtype) -> torch.Tensor:
        return self.edge_scale_float64.to(dtype)

    def matrices(self, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """(A, A^T) as CSR tensors of ``dtype`` (cached per dtype)."""
        if dtype not in self._matrices:
            values = self.edge_scale(dtype)
            a = _csr(self._crow, self.edge_src, values, (self.num_segments, self.num_src))
            a_t = _csr(self._crow_t, self.edge_segment[self._order_t], values[self._order_t],
                       (self.num_src, self.num_segments))
            self._matrices[dtype] = (a, a_t)
        return self._matrices[dtype]

    def lookup_matrices(self, dtype: torch.dtype, rows_per_relation: int,
                        row_of_src: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, B^T) for featureless input: B [num_dst, R * rows_per_relation] holds c_{i,r} at
        column r * rows_per_relation + row(j) for each edge j -> i of relation r, so that
        ``B @ W.view(-1, C_out)`` sums the scaled weight rows each node looks up (row(j) = j, or
        ``row_of_src[j]`` for a node index input; cached only without one)."""
        key = ("lookup", dtype, rows_per_relation)
        if row_of_src is not None or key not in self._matrices:
            rows = self.edge_src if row_of_src is None else row_of_src[self.edge_src]
            cols = self.edge_rel * rows_per_relation + rows
            dst = self.pairs.pairs.out_idx.long()[self.edge_segment]
            values = self.edge_scale(dtype)
            width = self.num_relations * rows_per_relation
            # Edges are sorted by (relation, destination): re-sort by destination for B's rows.
            by_dst = torch.sort(dst * max(width, 1) + cols, stable=True).indices
            b = _csr(_crow(dst, self.num_dst), cols[by_dst], values[by_dst], (self.num_dst, width))
            by_col = torch.sort(cols * max(self.num_dst, 1) + dst, stable=True).indices
            b_t = _csr(_crow(cols, width), dst[by_col], values[by_col], (width, self.num_dst))
            if row_of_src is not None:
                return b, b_t
            self._matrices[key] = (b, b_t)
        return self._matrices[key]

    def __repr__(self) -> str:
        return (f"RelationalMap({self.num_src} -> {self.num_dst} nodes, {self.num_relations} relations, "
                f"{self.edge_src.numel()} edges, {self.num_segments} segments, aggr={self.aggr})")


def relational_map(edge_index: torch.Tensor, edge_type: torch.Tensor, num_relations: int,
                   num_nodes: Optional[int] = None, num_dst: Optional[int] = None,
                   aggr: str = "mean") -> RelationalMap:
    """The RelationalMap of edges ``edge_index [2, E]`` (row 0 sources j, row 1 destinations i,
    int64) with relations ``edge_type [E]`` (int64, < num_relations). ``num_nodes``: source
    nodes (default: 1 + the largest index); ``num_dst``: destination nodes (default num_nodes).
    ``aggr``: 'mean' (c = 1/|N_r(i)|) or 'sum' ('add'; c = 1)."""
    if aggr not in AGGREGATIONS:
        raise ValueError(f"aggr must be one of {AGGREGATIONS}, got {aggr!r}")
    _index_vector(edge_index, "edge_index")
    if num_nodes is None:
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"edge_index must have shape [2, E], got {list(edge_index.shape)}")
        num_nodes = int(edge_index.max().item()) + 1 if edge_index.numel() else 0
    num_dst = num_nodes if num_dst is None else num_dst
    check_edges(edge_index, edge_type, num_nodes, num_dst, num_relations)
    return RelationalMap(edge_index, edge_type, num_nodes, num_dst, num_relations, "sum" if aggr == "add" else aggr)
