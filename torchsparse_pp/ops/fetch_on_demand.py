"""Fetch-on-demand dataflow: torch.ops.torchsparse_pp.fetch_on_demand_*."""
import torch

from .. import backends
from .gather_scatter import forward_fake, wgrad_fake
from .validate import validate_pairs

_ops = torch.ops.torchsparse_pp


def fetch_on_demand_forward(feats: torch.Tensor, weight: torch.Tensor, src_idx: torch.Tensor,
                            dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor,
                            num_dst: int, transpose_weight: bool = False, deterministic: bool = False,
                            allow_tf32: bool = False) -> torch.Tensor:
    """Same result as gather_scatter_forward, with no gathered matrix in memory. The pairs of
    each offset must ascend by destination (kmap_pairs' order).

    CPU: destination blocks, each offset's pairs chunk by chunk through thread-local tiles;
    deterministic and exact whatever the flags say. CUDA: one fused launch over every offset's
    pairs with atomic float adds, or with ``deterministic`` the owned-rows kernel (each output row
    summed by one CTA, offsets in order: run-to-run identical); ``allow_tf32`` lets float32 run on
    TF32 tensor cores. On CUDA the indices are not checked per call (see ``ops.validate``);
    ``backends.validate_plans = True`` checks them here before every call.
    """
    if backends.validate_plans:
        validate_pairs(src_idx, dst_idx, offsets, identity, feats.shape[0], num_dst, sorted_by="dst")
    return _ops.fetch_on_demand_forward(feats, weight, src_idx, dst_idx, offsets, identity, num_dst,
                                        transpose_weight, deterministic, allow_tf32)


def fetch_on_demand_wgrad(feats: torch.Tensor, grad_out: torch.Tensor, src_idx: torch.Tensor,
                          dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor,
                          allow_tf32: bool = False) -> torch.Tensor:
    """Weight gradient over pair chunks with fixed-order partial sums (deterministic on every
    device); ``allow_tf32`` as in fetch_on_demand_forward."""
    if backends.validate_plans:
        validate_pairs(src_idx, dst_idx, offsets, identity, feats.shape[0], grad_out.shape[0])
    return _ops.fetch_on_demand_wgrad(feats, grad_out, src_idx, dst_idx, offsets, identity, allow_tf32)


@torch.library.register_fake("torchsparse_pp::fetch_on_demand_forward")
def _forward_fake(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, transpose_weight,
                  deterministic=False, allow_tf32=False):
    return forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.register_fake("torchsparse_pp::fetch_on_demand_wgrad")
def _wgrad_fake(feats, grad_out, src_idx, dst_idx, offsets, identity, allow_tf32=False):
    return wgrad_fake(feats, grad_out, identity.shape[0])
