"""Gather-GEMM-scatter dataflow: torch.ops.torchsparse_pp.gather_scatter_*."""
import torch

_ops = torch.ops.torchsparse_pp


def gather_scatter_forward(feats: torch.Tensor, weight: torch.Tensor, src_idx: torch.Tensor,
                           dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor,
                           num_dst: int, transpose_weight: bool = False) -> torch.Tensor:
    """``out[dst] += feats[src] @ W[k]`` over the pairs of every offset k.

    With ``transpose_weight`` it multiplies by ``W[k]^T``, which is the input gradient (dgrad).
    """
    return _ops.gather_scatter_forward(feats, weight, src_idx, dst_idx, offsets, identity, num_dst,
                                       transpose_weight)


def gather_scatter_wgrad(feats: torch.Tensor, grad_out: torch.Tensor, src_idx: torch.Tensor,
                         dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor
                         ) -> torch.Tensor:
    """Weight gradient ``dW[k] = feats[src]^T @ grad_out[dst]``, shape ``[K, C_in, C_out]``."""
    return _ops.gather_scatter_wgrad(feats, grad_out, src_idx, dst_idx, offsets, identity)


@torch.library.register_fake("torchsparse_pp::gather_scatter_forward")
def _forward_fake(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, transpose_weight):
    channels = weight.shape[1] if transpose_weight else weight.shape[2]
    return feats.new_empty(num_dst, channels)


@torch.library.register_fake("torchsparse_pp::gather_scatter_wgrad")
def _wgrad_fake(feats, grad_out, src_idx, dst_idx, offsets, identity):
    return feats.new_empty(identity.shape[0], feats.shape[1], grad_out.shape[1])
