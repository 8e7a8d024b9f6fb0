"""Implicit-GEMM dataflow: torch.ops.torchsparse_pp.implicit_gemm_*."""
import torch

from .. import backends
from .gather_scatter import forward_fake, wgrad_fake
from .validate import validate_plan

_ops = torch.ops.torchsparse_pp
# Rows per group of the CPU register kernels (kRowGroup in csrc/cpu/pair_gemm.h).
ROW_GROUP_ROWS = 6


def implicit_gemm_forward(feats: torch.Tensor, weight: torch.Tensor, table: torch.Tensor, num_dst: int,
                          transpose_weight: bool, bounds: torch.Tensor, order: torch.Tensor,
                          tile_masks: torch.Tensor, tile_rows: int, allow_tf32: bool = False) -> torch.Tensor:
    """``out[r] = sum_k feats[table[r, k]] @ W[k]`` over tiles of destination rows, following a
    plan from kmap_plan (offset splits, optional sorted row order, per-tile offset masks).

    ``allow_tf32`` lets CUDA kernels run float32 on TF32 tensor cores; CPU kernels are exact.
    On CUDA the table and plan are not checked per call (see ``ops.validate``);
    ``backends.validate_plans = True`` checks them here before every call."""
    if backends.validate_plans:
        validate_plan(table, num_dst, feats.shape[0], bounds, order, tile_masks, tile_rows)
    return _ops.implicit_gemm_forward(feats, weight, table, num_dst, transpose_weight, bounds, order,
                                      tile_masks, tile_rows, allow_tf32)


def implicit_gemm_row_groups(table: torch.Tensor, num_rows: int, bounds: torch.Tensor, order: torch.Tensor,
                             tile_masks: torch.Tensor, tile_rows: int):
    """``(term_begin, term_offsets, term_sources)``: the CPU register kernels' operands of a plan
    of a CPU table. Per group of ROW_GROUP_ROWS consecutive positions of one split (group
    ``s * groups_per_split + pos // ROW_GROUP_ROWS``), its terms ``term_begin[g]:term_begin[g + 1]``
    are the offsets that one of its rows has, ascending; ``term_sources[t, m]`` is the source row
    that row m reads through term t (-1: none). Built once per map and plan
    (``KernelMap.row_groups``) for implicit_gemm_forward_grouped."""
    return _ops.implicit_gemm_row_groups(table, num_rows, bounds, order, tile_masks, tile_rows)


def implicit_gemm_forward_grouped(feats: torch.Tensor, weight: torch.Tensor, table: torch.Tensor, num_dst: int,
                                  transpose_weight: bool, bounds: torch.Tensor, order: torch.Tensor,
                                  tile_masks: torch.Tensor, tile_rows: int, term_begin: torch.Tensor,
                                  term_offsets: torch.Tensor, term_sources: torch.Tensor) -> torch.Tensor:
    """implicit_gemm_forward on the CPU from the plan's row groups (implicit_gemm_row_groups of
    the same table and plan) rather than the table: the same sums, bit for bit, without reading
    the whole table on every call. The table is read only where the tile kernels run (float64,
    CPUs without AVX2, weights with Inf / NaN); groups with terms or sources out of range raise."""
    return _ops.implicit_gemm_forward_grouped(feats, weight, table, num_dst, transpose_weight, bounds, order,
                                              tile_masks, tile_rows, term_begin, term_offsets, term_sources)


def implicit_gemm_wgrad(feats: torch.Tensor, grad_out: torch.Tensor, table: torch.Tensor,
                        bounds: torch.Tensor, order: torch.Tensor, tile_masks: torch.Tensor,
                        tile_rows: int, allow_tf32: bool = False) -> torch.Tensor:
    """``dW[k] = sum_r feats[table[r, k]]^T grad_out[r]`` (checks as in implicit_gemm_forward:
    the plan must belong to the table). CUDA sums tile by tile; the CPU per offset over the
    table's rows that have a neighbour through it, in row order (the fetch_on_demand weight
    gradient on kmap_pairs(table), bit for bit)."""
    if backends.validate_plans:
        validate_plan(table, grad_out.shape[0], feats.shape[0], bounds, order, tile_masks, tile_rows)
    return _ops.implicit_gemm_wgrad(feats, grad_out, table, bounds, order, tile_masks, tile_rows, allow_tf32)


@torch.library.register_fake("torchsparse_pp::implicit_gemm_forward")
def _forward_fake(feats, weight, table, num_dst, transpose_weight, bounds, order, tile_masks, tile_rows,
                  allow_tf32=False):
    return forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.register_fake("torchsparse_pp::implicit_gemm_row_groups")
def _row_groups_fake(table, num_rows, bounds, order, tile_masks, tile_rows):
    ctx = torch.library.get_ctx()
    groups, terms = ctx.new_dynamic_size(), ctx.new_dynamic_size()
    return (table.new_empty(groups, dtype=torch.int64), table.new_empty(terms), table.new_empty(terms, ROW_GROUP_ROWS))


@torch.library.register_fake("torchsparse_pp::implicit_gemm_forward_grouped")
def _forward_grouped_fake(feats, weight, table, num_dst, transpose_weight, bounds, order, tile_masks, tile_rows,
                          term_begin, term_offsets, term_sources):
    return forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.register_fake("torchsparse_pp::implicit_gemm_wgrad")
def _wgrad_fake(feats, grad_out, table, bounds, order, tile_masks, tile_rows, allow_tf32=False):
    return wgrad_fake(feats, grad_out, table.shape[1])
