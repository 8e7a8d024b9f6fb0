"""Autograd for the gather-GEMM-scatter dataflow: forward, dgrad and wgrad kernels."""
import torch

from ... import ops


class GatherScatterConv(torch.autograd.Function):
    """``out[dst] = sum_k feats[src] @ W[k]`` over the pairs of each offset k.

    Forward convs pass (src, dst) = (in_idx, out_idx) of their map; transposed convs pass them
    swapped. dgrad runs the same kernel from dst to src with ``W[k]^T``.
    """

    @staticmethod
    def forward(ctx, feats, weight, src_idx, dst_idx, offsets, identity, num_dst: int):
        ctx.save_for_backward(feats, weight, src_idx, dst_idx, offsets, identity)
        return ops.gather_scatter_forward(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, False)

    @staticmethod
    def backward(ctx, grad_out):
        feats, weight, src_idx, dst_idx, offsets, identity = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_feats = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_feats = ops.gather_scatter_forward(grad_out, weight, dst_idx, src_idx, offsets, identity,
                                                    feats.shape[0], True)
        if ctx.needs_input_grad[1]:
            grad_weight = ops.gather_scatter_wgrad(feats, grad_out, src_idx, dst_idx, offsets, identity)
        return grad_feats, grad_weight, None, None, None, None, None
