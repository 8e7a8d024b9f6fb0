"""Fetch-on-demand dataflow: torch.ops.torchsparse_pp.fetch_on_demand_*."""
import torch

from .gather_scatter import forward_fake, wgrad_fake

_ops = torch.ops.torchsparse_pp


def fetch_on_demand_forward(feats: torch.Tensor, weight: torch.Tensor, src_idx: torch.Tensor,
                            dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor,
                            num_dst: int, transpose_weight: bool = False) -> torch.Tensor:
    """Same result as gather_scatter_forward, computed chunk by chunk in thread-local tiles."""
    return _ops.fetch_on_demand_forward(feats, weight, src_idx, dst_idx, offsets, identity, num_dst,
                                        transpose_weight)


def fetch_on_demand_wgrad(feats: torch.Tensor, grad_out: torch.Tensor, src_idx: torch.Tensor,
                          dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor) -> torch.Tensor:
    """Weight gradient over pair chunks with fixed-order partial sums."""
    return _ops.fetch_on_demand_wgrad(feats, grad_out, src_idx, dst_idx, offsets, identity)


@torch.library.register_fake("torchsparse_pp::fetch_on_demand_forward")
def _forward_fake(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, transpose_weight):
    return forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.register_fake("torchsparse_pp::fetch_on_demand_wgrad")
def _wgrad_fake(feats, grad_out, src_idx, dst_idx, offsets, identity):
    return wgrad_fake(feats, grad_out, identity.shape[0])
