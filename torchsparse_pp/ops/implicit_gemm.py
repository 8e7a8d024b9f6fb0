"""Implicit-GEMM dataflow: torch.ops.torchsparse_pp.implicit_gemm_*."""
import torch

from .gather_scatter import forward_fake, wgrad_fake

_ops = torch.ops.torchsparse_pp


def implicit_gemm_forward(feats: torch.Tensor, weight: torch.Tensor, table: torch.Tensor, num_dst: int,
                          transpose_weight: bool, bounds: torch.Tensor, order: torch.Tensor,
                          tile_masks: torch.Tensor, tile_rows: int, allow_tf32: bool = False) -> torch.Tensor:
    """``out[r] = sum_k feats[table[r, k]] @ W[k]`` over tiles of destination rows, following a
    plan from kmap_plan (offset splits, optional sorted row order, per-tile offset masks).

    ``allow_tf32`` lets CUDA kernels run float32 on TF32 tensor cores; CPU kernels are exact."""
    return _ops.implicit_gemm_forward(feats, weight, table, num_dst, transpose_weight, bounds, order,
                                      tile_masks, tile_rows, allow_tf32)


def implicit_gemm_wgrad(feats: torch.Tensor, grad_out: torch.Tensor, table: torch.Tensor,
                        bounds: torch.Tensor, order: torch.Tensor, tile_masks: torch.Tensor,
                        tile_rows: int, allow_tf32: bool = False) -> torch.Tensor:
    """``dW[k] = sum_r feats[table[r, k]]^T grad_out[r]``, tile by tile."""
    return _ops.implicit_gemm_wgrad(feats, grad_out, table, bounds, order, tile_masks, tile_rows, allow_tf32)


@torch.library.register_fake("torchsparse_pp::implicit_gemm_forward")
def _forward_fake(feats, weight, table, num_dst, transpose_weight, bounds, order, tile_masks, tile_rows,
                  allow_tf32=False):
    return forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.register_fake("torchsparse_pp::implicit_gemm_wgrad")
def _wgrad_fake(feats, grad_out, table, bounds, order, tile_masks, tile_rows, allow_tf32=False):
    return wgrad_fake(feats, grad_out, table.shape[1])
