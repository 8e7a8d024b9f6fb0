"""Implicit-GEMM dataflow: torch.ops.torchsparse_pp.implicit_gemm_*."""
import torch

from .. import backends
from .gather_scatter import forward_fake, wgrad_fake
from .validate import validate_plan

_ops = torch.ops.torchsparse_pp


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


@torch.library.register_fake("torchsparse_pp::implicit_gemm_wgrad")
def _wgrad_fake(feats, grad_out, table, bounds, order, tile_masks, tile_rows, allow_tf32=False):
    return wgrad_fake(feats, grad_out, table.shape[1])
