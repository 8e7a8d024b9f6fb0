"""Pooling over kernel-map pairs and over samples: torch.library custom ops in torch code, with
fake kernels and autograd, so torch.compile / export see one node each and no host read.

- ``pool_pairs_max`` / ``pool_pairs_mean``: out[q] = max / mean over the pairs (p, q) of
  feats[p], per channel (outputs without pairs are 0);
- ``segment_max`` / ``segment_mean``: ``[B, C]`` max / mean of the rows of each batch index,
  B = max(batch) + 1 (a data-dependent size: an unbacked SymInt in traced graphs).
"""
import torch

_NS = "torchsparse_pp"
INT32_MAX = (1 << 31) - 1


def _check_num_out(num_out: int) -> None:
    """Pair indices are int32: more outputs cannot be addressed (refused before allocating)."""
    if not 0 <= num_out <= INT32_MAX:
        raise ValueError(f"num_out must be in [0, 2^31 - 1] (pair indices are int32), got {num_out}")


@torch.library.custom_op(f"{_NS}::pool_pairs_max", mutates_args=())
def pool_pairs_max(feats: torch.Tensor, in_idx: torch.Tensor, out_idx: torch.Tensor,
                   num_out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [num_out, C], argmax [num_out, C])``: per channel, the max of feats over each
    output's pairs and the input row that gives it (the first pair in pair order, i.e. the lowest
    offset, on ties; -1 and a 0 output where an output has no pair)."""
    _check_num_out(num_out)
    channels, num_pairs = feats.shape[1], in_idx.shape[0]
    src, dst = in_idx.long(), out_idx.long()
    values = feats[src]
    index = dst[:, None].expand(-1, channels)
    out = feats.new_full((num_out, channels), float("-inf")).scatter_reduce(0, index, values, "amax")
    position = torch.arange(num_pairs, device=feats.device)[:, None].expand(-1, channels)
    candidate = torch.where(values == out[dst], position, num_pairs)
    first = torch.full((num_out, channels), num_pairs, device=feats.device).scatter_reduce(0, index, candidate, "amin")
    found = first < num_pairs
    argmax = torch.where(found, src[first.clamp(max=max(num_pairs - 1, 0))] if num_pairs else first, -1)
    return torch.where(found, out, 0), argmax


@pool_pairs_max.register_fake
def _(feats, in_idx, out_idx, num_out):
    return feats.new_empty(num_out, feats.shape[1]), feats.new_empty(num_out, feats.shape[1], dtype=torch.int64)


def _pairs_max_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.num_in = inputs[0].shape[0]


def _pairs_max_backward(ctx, grad_out, _grad_argmax):
    (argmax,) = ctx.saved_tensors
    channels = argmax.shape[1]
    # Each output element's gradient goes to the input element that gave its max (none: dropped).
    flat = (argmax.clamp(min=0) * channels + torch.arange(channels, device=argmax.device)).reshape(-1)
    grad = torch.where(argmax >= 0, grad_out, 0).reshape(-1)
    grad_in = grad_out.new_zeros(ctx.num_in * channels).index_add_(0, flat, grad)
    return grad_in.view(ctx.num_in, channels), None, None, None


pool_pairs_max.register_autograd(_pairs_max_backward, setup_context=_pairs_max_setup)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Means sum in float32 or better (a bfloat16 / float16 sum of many rows loses digits) and
    return the input's dtype."""
    return torch.promote_types(dtype, torch.float32)


def _pair_counts(out_idx: torch.Tensor, num_out: int, dtype: torch.dtype) -> torch.Tensor:
    ones = torch.ones(out_idx.shape[0], dtype=dtype, device=out_idx.device)
    return torch.zeros(num_out, dtype=dtype, device=out_idx.device).index_add_(0, out_idx.long(), ones).clamp(min=1)


@torch.library.custom_op(f"{_NS}::pool_pairs_mean", mutates_args=())
def pool_pairs_mean(feats: torch.Tensor, in_idx: torch.Tensor, out_idx: torch.Tensor, num_out: int) -> torch.Tensor:
    """``out [num_out, C]``: per channel, the mean of feats over each output's pairs (absent
    neighbours do not count; 0 where an output has no pair)."""
    _check_num_out(num_out)
    dst, compute = out_idx.long(), _accumulation_dtype(feats.dtype)
    sums = feats.new_zeros(num_out, feats.shape[1], dtype=compute).index_add_(0, dst, feats[in_idx.long()].to(compute))
    return (sums / _pair_counts(out_idx, num_out, compute)[:, None]).to(feats.dtype)


@pool_pairs_mean.register_fake
def _(feats, in_idx, out_idx, num_out):
    return feats.new_empty(num_out, feats.shape[1])


def _pairs_mean_setup(ctx, inputs, output):
    feats, in_idx, out_idx, num_out = inputs
    ctx.save_for_backward(in_idx, out_idx)
    ctx.num_in, ctx.num_out = feats.shape[0], num_out


def _pairs_mean_backward(ctx, grad_out):
    in_idx, out_idx = ctx.saved_tensors
    compute = _accumulation_dtype(grad_out.dtype)
    scaled = grad_out.to(compute) / _pair_counts(out_idx, ctx.num_out, compute)[:, None]
    grad_in = grad_out.new_zeros(ctx.num_in, grad_out.shape[1], dtype=compute).index_add_(
        0, in_idx.long(), scaled[out_idx.long()])
    return grad_in.to(grad_out.dtype), None, None, None


pool_pairs_mean.register_autograd(_pairs_mean_backward, setup_context=_pairs_mean_setup)


def num_segments(batch: torch.Tensor) -> int:
    """B = max(batch) + 1 (one host read; inside an op, where a traced graph sees none)."""
    return int(batch.max()) + 1 if batch.numel() else 0


def segment_counts(batch: torch.Tensor, size: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows per batch index, ``[size]`` in ``dtype``."""
    ones = torch.ones(batch.shape[0], dtype=dtype, device=batch.device)
    return torch.zeros(size, dtype=dtype, device=batch.device).index_add_(0, batch, ones)


@torch.library.custom_op(f"{_NS}::segment_mean", mutates_args=())
def segment_mean(feats: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """``[B, C]``: the mean of the rows of each batch index (int64 ``batch``)."""
    size, compute = num_segments(batch), _accumulation_dtype(feats.dtype)
    sums = feats.new_zeros(size, feats.shape[1], dtype=compute).index_add_(0, batch, feats.to(compute))
    return (sums / segment_counts(batch, size, compute).clamp(min=1)[:, None]).to(feats.dtype)


@segment_mean.register_fake
def _(feats, batch):
    return feats.new_empty(torch.library.get_ctx().new_dynamic_size(min=1), feats.shape[1])


def _segment_mean_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _segment_mean_backward(ctx, grad_out):
    (batch,) = ctx.saved_tensors
    # Counts shaped after grad_out (zeros_like, not a size read): under AOT autograd B is an
    # unbacked size of the forward, which the backward graph may not take as an int input.
    compute = _accumulation_dtype(grad_out.dtype)
    counts = torch.zeros_like(grad_out[:, 0], dtype=compute).index_add_(0, batch, torch.ones_like(batch, dtype=compute))
    return (grad_out.to(compute) / counts.clamp(min=1)[:, None])[batch].to(grad_out.dtype), None


segment_mean.register_autograd(_segment_mean_backward, setup_context=_segment_mean_setup)


@torch.library.custom_op(f"{_NS}::segment_max", mutates_args=())
def segment_max(feats: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """``[B, C]``: the per-channel max of the rows of each batch index (0 for an index with no
    rows); the gradient is shared evenly by tied maxima (as torch's scatter_reduce amax)."""
    size = num_segments(batch)
    index = batch[:, None].expand(-1, feats.shape[1])
    return feats.new_zeros(size, feats.shape[1]).scatter_reduce(0, index, feats, "amax", include_self=False)


@segment_max.register_fake
def _(feats, batch):
    return feats.new_empty(torch.library.get_ctx().new_dynamic_size(min=1), feats.shape[1])


def _segment_max_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1], output)


def _segment_max_backward(ctx, grad_out):
    feats, batch, out = ctx.saved_tensors
    hit = (feats == out[batch]).to(grad_out.dtype)
    ties = torch.zeros_like(grad_out).index_add_(0, batch, hit)
    return grad_out[batch] * hit / ties.clamp(min=1)[batch], None


segment_max.register_autograd(_segment_max_backward, setup_context=_segment_max_setup)
