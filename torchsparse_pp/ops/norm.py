"""Per-sample group normalisation of point features: the custom op
``torchsparse_pp::sample_group_norm`` (torch code, fake kernel, hand-written backward), so a
traced graph sees one node and no host read of the number of samples."""
from typing import Optional, Tuple

import torch

from .pooling import num_segments, segment_counts


def _grouped(feats: torch.Tensor, num_groups: int) -> torch.Tensor:
    n, channels = feats.shape
    if channels % num_groups:
        raise ValueError(f"{channels} channels cannot be split into {num_groups} groups")
    compute = torch.promote_types(feats.dtype, torch.float32)
    return feats.to(compute).view(n, num_groups, channels // num_groups)


def _group_sums(values: torch.Tensor, batch: torch.Tensor, size) -> torch.Tensor:
    """Per (sample, group) sums ``[size, G]`` of ``values [N, G, C/G]``."""
    return values.new_zeros(size, values.shape[1]).index_add_(0, batch, values.sum(-1))


def _counts(x: torch.Tensor, batch: torch.Tensor, size) -> torch.Tensor:
    """Elements per (sample, group): points of the sample x channels of a group, ``[size, 1]``."""
    return (segment_counts(batch, size, x.dtype).clamp(min=1) * x.shape[2])[:, None]


@torch.library.custom_op("torchsparse_pp::sample_group_norm", mutates_args=())
def sample_group_norm_op(feats: torch.Tensor, batch: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor],
                         bias: Optional[torch.Tensor], eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out [N, C], mean [B, G], rstd [B, G])``: each (sample, channel group) normalised over
    the sample's points and the group's channels (statistics in float32 or better), then
    ``* weight + bias`` per channel; ``batch`` is the int64 sample index of each row, B = its
    max + 1. The statistics are what the backward reads."""
    x = _grouped(feats, num_groups)
    size = num_segments(batch)
    counts = _counts(x, batch, size)
    mean = _group_sums(x, batch, size) / counts
    centred = x - mean[batch][:, :, None]
    rstd = torch.rsqrt(_group_sums(centred.square(), batch, size) / counts + eps)
    out = (centred * rstd[batch][:, :, None]).reshape(feats.shape)
    if weight is not None:
        out = out * weight.to(out.dtype) + bias.to(out.dtype)
    return out.to(feats.dtype), mean, rstd


@sample_group_norm_op.register_fake
def _(feats, batch, num_groups, weight, bias, eps):
    if feats.shape[1] % num_groups:
        raise ValueError(f"{feats.shape[1]} channels cannot be split into {num_groups} groups")
    size = torch.library.get_ctx().new_dynamic_size(min=1)
    compute = torch.promote_types(feats.dtype, torch.float32)
    stats = feats.new_empty(size, num_groups, dtype=compute)
    return torch.empty_like(feats), stats, stats.clone()


def _setup(ctx, inputs, output):
    feats, batch, num_groups, weight, bias, eps = inputs
    ctx.save_for_backward(feats, batch, weight, output[1], output[2])
    ctx.num_groups, ctx.has_bias = num_groups, bias is not None


def _backward(ctx, grad_out, _grad_mean, _grad_rstd):
    feats, batch, weight, mean, rstd = ctx.saved_tensors
    x = _grouped(feats, ctx.num_groups)
    size = mean.shape[0]
    counts = _counts(x, batch, size)
    rstd_rows = rstd[batch][:, :, None]
    x_hat = (x - mean[batch][:, :, None]) * rstd_rows
    dy = grad_out.to(x.dtype).view_as(x)
    grad_weight = grad_bias = None
    if weight is not None:
        flat_dy, flat_hat = dy.reshape(feats.shape), x_hat.reshape(feats.shape)
        if ctx.needs_input_grad[3]:
            grad_weight = (flat_dy * flat_hat).sum(0).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[4]:
            grad_bias = flat_dy.sum(0).to(weight.dtype)
        dy = dy * weight.to(dy.dtype).view(1, x.shape[1], x.shape[2])
    grad_feats = None
    if ctx.needs_input_grad[0]:
        # d x = rstd * (d x̂ - mean(d x̂) - x̂ * mean(d x̂ * x̂)), means over each (sample, group).
        mean_dy = (_group_sums(dy, batch, size) / counts)[batch][:, :, None]
        mean_dy_hat = (_group_sums(dy * x_hat, batch, size) / counts)[batch][:, :, None]
        grad_feats = (rstd_rows * (dy - mean_dy - x_hat * mean_dy_hat)).reshape(feats.shape).to(feats.dtype)
    return grad_feats, None, None, grad_weight, grad_bias, None


sample_group_norm_op.register_autograd(_backward, setup_context=_setup)


def sample_group_norm(feats: torch.Tensor, batch: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor],
                      bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """The normalised features of ``sample_group_norm_op``."""
    return sample_group_norm_op(feats, batch, num_groups, weight, bias, eps)[0]
