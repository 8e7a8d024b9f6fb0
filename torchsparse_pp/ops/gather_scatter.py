"""Gather-GEMM-scatter dataflow: torch.ops.torchsparse_pp.gather_scatter_*."""
import torch

from .. import backends
from .validate import validate_pairs

_ops = torch.ops.torchsparse_pp


def gather_scatter_forward(feats: torch.Tensor, weight: torch.Tensor, src_idx: torch.Tensor,
                           dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor,
                           num_dst: int, transpose_weight: bool = False, epsilon: float = 0.0,
                           mm_thresh: int = 0, deterministic: bool = False) -> torch.Tensor:
    """``out[dst] += feats[src] @ W[k]`` over the pairs of every offset k.

    With ``transpose_weight`` it multiplies by ``W[k]^T``, which is the input gradient (dgrad).
    Offsets under ``mm_thresh`` pairs whose counts differ by at most ``epsilon`` (relative) are
    padded and batched into one GEMM. ``deterministic``: on the CPU, fixed single-threaded row
    tiles; on CUDA the dataflow is deterministic by construction (fixed offset order, no atomics,
    cuBLAS with fixed shapes on one stream), so the flag changes nothing there.

    On CUDA the loop over offsets runs on the host: pass ``offsets`` and ``identity`` as host
    (CPU) copies (``KernelMap`` keeps them beside each pair view) and the call never
    synchronises; device tensors are read back. The indices are not checked per call on CUDA
    (see ``ops.validate``); ``backends.validate_plans = True`` checks them here before every call.
    """
    if backends.validate_plans:
        validate_pairs(src_idx, dst_idx, offsets, identity, feats.shape[0], num_dst)
    return _ops.gather_scatter_forward(feats, weight, src_idx, dst_idx, offsets, identity, num_dst,
                                       transpose_weight, epsilon, mm_thresh, deterministic)


def gather_scatter_wgrad(feats: torch.Tensor, grad_out: torch.Tensor, src_idx: torch.Tensor,
                         dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor,
                         deterministic: bool = False) -> torch.Tensor:
    """Weight gradient ``dW[k] = feats[src]^T @ grad_out[dst]``, shape ``[K, C_in, C_out]``
    (``offsets`` / ``identity`` as in gather_scatter_forward)."""
    if backends.validate_plans:
        validate_pairs(src_idx, dst_idx, offsets, identity, feats.shape[0], grad_out.shape[0])
    return _ops.gather_scatter_wgrad(feats, grad_out, src_idx, dst_idx, offsets, identity, deterministic)


def forward_fake(feats, weight, num_dst, transpose_weight):
    """Output of any forward/dgrad dataflow op: [num_dst, C_dst] in the feats' dtype."""
    channels = weight.shape[1] if transpose_weight else weight.shape[2]
    return feats.new_empty(num_dst, channels)


def wgrad_fake(feats, grad_out, volume):
    return feats.new_empty(volume, feats.shape[1], grad_out.shape[1])


@torch.library.register_fake("torchsparse_pp::gather_scatter_forward")
def _forward_fake(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, transpose_weight,
                  epsilon=0.0, mm_thresh=0, deterministic=False):
    return forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.register_fake("torchsparse_pp::gather_scatter_wgrad")
def _wgrad_fake(feats, grad_out, src_idx, dst_idx, offsets, identity, deterministic=False):
    return wgrad_fake(feats, grad_out, identity.shape[0])
