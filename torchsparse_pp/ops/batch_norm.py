"""BatchNorm over ``[N, C]`` point features (CPU, float32 / float64): the operators behind
``nn.functional.batch_norm_act``, with fake kernels."""
from typing import Optional, Tuple

import torch


def batch_norm_stats(feats: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mean, 1 / sqrt(var + eps), unbiased var)`` per channel of ``feats [N, C]`` (N > 1), var
    the biased batch variance; summed in double per fixed part of rows, so the result does not
    depend on the thread count."""
    return torch.ops.torchsparse_pp.batch_norm_stats(feats, eps)


def batch_norm_apply(feats: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, residual: Optional[torch.Tensor],
                     relu: bool) -> torch.Tensor:
    """``act(feats * scale + shift + residual)`` with per-channel ``scale`` / ``shift`` and act the
    ReLU when ``relu``, in one pass."""
    return torch.ops.torchsparse_pp.batch_norm_apply(feats, scale, shift, residual, relu)


def batch_norm_apply_masked(feats: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                            residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(relu(feats * scale + shift + residual), relu_mask)`` in one pass: the ReLU's mask as bits,
    int16 ``[N, ceil(C / 16)]`` with bit ``j % 16`` of word ``j // 16`` set where output channel
    ``j`` is positive; the backward reads it instead of the residual."""
    return torch.ops.torchsparse_pp.batch_norm_apply_masked(feats, scale, shift, residual)


def batch_norm_backward(grad_out: torch.Tensor, feats: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                        weight: Optional[torch.Tensor], relu_mask: Optional[torch.Tensor], residual_grad: bool):
    """Gradients ``(feats, weight, bias, residual)`` of ``out = act(bn(feats) * weight + bias + residual)``
    with batch statistics ``mean`` / ``invstd``. ``relu_mask`` (batch_norm_apply_masked's) is given
    when act is the ReLU; the residual's gradient (``grad_out`` under the mask) is returned when
    ``residual_grad`` and act is the ReLU, else an empty tensor."""
    return torch.ops.torchsparse_pp.batch_norm_backward(grad_out, feats, mean, invstd, weight, relu_mask, residual_grad)


@torch.library.register_fake("torchsparse_pp::batch_norm_stats")
def _stats_fake(feats, eps):
    stats = feats.new_empty(feats.shape[1])
    return stats, stats.clone(), stats.clone()


@torch.library.register_fake("torchsparse_pp::batch_norm_apply")
def _apply_fake(feats, scale, shift, residual, relu):
    return torch.empty_like(feats)


@torch.library.register_fake("torchsparse_pp::batch_norm_apply_masked")
def _apply_masked_fake(feats, scale, shift, residual):
    return torch.empty_like(feats), feats.new_empty((feats.shape[0], (feats.shape[1] + 15) // 16), dtype=torch.int16)


@torch.library.register_fake("torchsparse_pp::batch_norm_backward")
def _backward_fake(grad_out, feats, mean, invstd, weight, relu_mask, residual_grad):
    stats = feats.new_empty(feats.shape[1])
    masked = torch.empty_like(feats) if residual_grad and relu_mask is not None else feats.new_empty(0)
    return torch.empty_like(feats), stats, stats.clone(), masked
