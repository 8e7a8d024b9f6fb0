"""Normalisation of point features: BatchNorm (with its residual add and ReLU fused, CPU kernels
for float32 / float64), and per-sample normalisation (GroupNorm / InstanceNorm semantics)."""
from typing import Optional

import torch

from ... import backends, ops


def sample_group_norm(feats: torch.Tensor, batch: torch.Tensor, batch_size: Optional[int], num_groups: int,
                      weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """Normalises each (sample, channel group) over that sample's points, like
    torch.nn.functional.group_norm on one dense sample. Statistics are computed in float32 or
    better, whatever the feature dtype. ``batch`` holds each row's sample index; ``batch_size``,
    when given, is the number of samples, and a larger index is an error (None: the samples are
    0 .. max(batch); nothing is read to the host then). Runs the custom op
    ``torchsparse_pp::sample_group_norm``."""
    if feats.shape[1] % num_groups:
        raise ValueError(f"{feats.shape[1]} channels cannot be split into {num_groups} groups")
    batch = batch.long()
    if batch_size is not None and batch.numel() and int(batch.max()) >= batch_size:
        raise ValueError(f"batch indices reach {int(batch.max())}, beyond batch_size {batch_size}")
    return ops.sample_group_norm(feats, batch, num_groups, weight, bias, eps)


def batch_norm_running(feats: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
                       weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """``torch.nn.functional.batch_norm`` with running statistics (eval mode) for float32 /
    float64 features, as ``feats * scale + shift`` per channel: one fused pass, about twice the
    speed of ATen's CPU batch_norm on ``[N, C]`` features, same rounding order up to one ulp.
    Other dtypes (bfloat16 under autocast) go to F.batch_norm, which keeps float32 statistics."""
    if feats.dtype not in (torch.float32, torch.float64) or running_mean.dtype != feats.dtype:
        return torch.nn.functional.batch_norm(feats, running_mean, running_var, weight, bias, False, 0.0, eps)
    scale, shift = _running_affine(running_mean, running_var, weight, bias, eps)
    return torch.addcmul(shift, feats, scale)


def _running_affine(running_mean, running_var, weight, bias, eps):
    """(scale, shift) per channel with batch_norm(x) == x * scale + shift under running statistics."""
    scale = torch.rsqrt(running_var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -running_mean * scale
    if bias is not None:
        shift = shift + bias
    return scale, shift


def _native_kernels(feats: torch.Tensor, *others: Optional[torch.Tensor]) -> bool:
    """Whether the C++ BatchNorm kernels take these tensors: contiguous CPU float32 / float64, all
    of one dtype, eager or compiled (a compiled graph traces the same ops, so it rounds as eager
    does: ATen's float32 backward drifts by percents on the few points of a coarse level),
    unless backends.native_batch_norm is off."""
    return (backends.native_batch_norm and backends.decision_device_type(feats.device) == "cpu" and feats.dtype in (torch.float32, torch.float64)
            and feats.dim() == 2
            and feats.is_contiguous()
            and all(t is None or (t.dtype == feats.dtype and t.device == feats.device) for t in others))


class _BatchNormTrain(torch.autograd.Function):
    """``act(batch_norm(feats) * weight + bias + residual)`` with batch statistics; also returns
    (mean, unbiased var) for the running statistics."""

    @staticmethod
    def forward(ctx, feats, weight, bias, residual, eps, relu):
        mean, invstd, var = ops.batch_norm_stats(feats, eps)
        scale = invstd if weight is None else invstd * weight
        shift = -mean * scale if bias is None else bias - mean * scale
        relu_mask = None
        if relu:
            out, relu_mask = ops.batch_norm_apply_masked(feats, scale, shift, residual)
        else:
            out = ops.batch_norm_apply(feats, scale, shift, residual, False)
        # The backward reads the ReLU's mask as bits: no output or residual kept.
        ctx.save_for_backward(feats, mean, invstd, weight, relu_mask)
        ctx.mark_non_differentiable(mean, var)
        return out, mean, var

    @staticmethod
    @torch.autograd.function.once_differentiable  # double backward raises (backends.native_batch_norm)
    def backward(ctx, grad_out, _grad_mean, _grad_var):
        feats, mean, invstd, weight, relu_mask = ctx.saved_tensors
        needs_residual = ctx.needs_input_grad[3]
        grad_feats, grad_weight, grad_bias, grad_masked = ops.batch_norm_backward(
            grad_out.contiguous(), feats, mean, invstd, weight, relu_mask, needs_residual)
        grad_residual = None
        if needs_residual:
            grad_residual = grad_masked if relu_mask is not None else grad_out
        return (grad_feats if ctx.needs_input_grad[0] else None, grad_weight if ctx.needs_input_grad[1] else None,
                grad_bias if ctx.needs_input_grad[2] else None, grad_residual, None, None)


def batch_norm_act(feats: torch.Tensor, running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor],
                   weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], use_batch_stats: bool,
                   momentum: float, eps: float, residual: Optional[torch.Tensor] = None,
                   relu: bool = False) -> torch.Tensor:
    """``act(F.batch_norm(feats, running_mean, running_var, weight, bias, use_batch_stats, momentum,
    eps) + residual)`` (act: ReLU when ``relu``), the running statistics updated in place as
    F.batch_norm does. On the CPU in float32 / float64 this is one pass for the statistics and one
    for the output (the backward: one for the sums, one for the gradients, the ReLU's mask
    kept from the forward as bits); elsewhere it is F.batch_norm, the add and the ReLU."""
    if residual is not None and residual.shape != feats.shape:
        raise ValueError(f"the residual must match the features' shape {list(feats.shape)}, got {list(residual.shape)}")
    native = _native_kernels(feats, running_mean, running_var, weight, bias, residual)
    if native and use_batch_stats and feats.shape[0] > 1:
        out, mean, var = _BatchNormTrain.apply(feats, weight, bias,
                                               None if residual is None else residual.contiguous(), eps, relu)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
                running_var.mul_(1 - momentum).add_(var, alpha=momentum)
        return out
    if native and not use_batch_stats and not (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (feats, weight, bias, residual))):
        scale, shift = _running_affine(running_mean, running_var, weight, bias, eps)
        return ops.batch_norm_apply(feats, scale, shift, None if residual is None else residual.contiguous(), relu)
    if not use_batch_stats:
        out = batch_norm_running(feats, running_mean, running_var, weight, bias, eps)
    else:
        out = torch.nn.functional.batch_norm(feats, running_mean, running_var, weight, bias, True, momentum, eps)
    if residual is not None:
        out = out + residual
    return torch.relu(out) if relu else out


def fold_batchnorm(kernel: torch.Tensor, bias: Optional[torch.Tensor], norm: torch.nn.modules.batchnorm._BatchNorm):
    """(kernel, bias) of conv followed by ``norm`` in eval mode: per output channel,
    scale = gamma / sqrt(var + eps), kernel * scale and (bias - mean) * scale + beta."""
    if not norm.track_running_stats or norm.running_mean is None:
        raise ValueError(f"{type(norm).__name__} without running statistics normalises with batch statistics even "
                         "in eval mode: it cannot be folded into the conv")
    var, mean = norm.running_var.double(), norm.running_mean.double()
    scale = torch.rsqrt(var + norm.eps)
    if norm.affine:
        scale = scale * norm.weight.detach().double()
    shift = -mean * scale + (norm.bias.detach().double() if norm.affine else 0.0)
    folded_bias = shift if bias is None else bias.detach().double() * scale + shift
    return (kernel.detach().double() * scale).to(kernel.dtype), folded_bias.to(kernel.dtype)
