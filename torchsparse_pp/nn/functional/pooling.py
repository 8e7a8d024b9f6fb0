"""Local and global pooling over the same kernel maps as convolution."""
from typing import Optional

import torch

from ...kmap import ConvGeometry, KernelMap, strided_map, submanifold_map
from ...kmap.geometry import IntOr3
from ...tensor import SparseTensor


class _MaxOverPairs(torch.autograd.Function):
    """out[q] = max over the pairs (p, q) of feats[p], per channel; empty outputs are 0.
    The gradient goes to the first input attaining the max (lowest offset index)."""

    @staticmethod
    def forward(ctx, feats, in_idx, out_idx, offsets, num_out: int):
        channels = feats.shape[1]
        out = feats.new_full((num_out, channels), float("-inf"))
        argmax = torch.full((num_out, channels), -1, dtype=torch.long, device=feats.device)
        bounds = offsets.tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            if end == start:
                continue
            src_rows = in_idx[start:end].long()
            dst = out_idx[start:end].long()
            values, current = feats[src_rows], out[dst]
            better = values > current  # strict: ties keep the earlier offset
            out[dst] = torch.where(better, values, current)
            argmax[dst] = torch.where(better, src_rows[:, None].expand(-1, channels), argmax[dst])
        out[argmax < 0] = 0
        ctx.save_for_backward(argmax)
        ctx.num_in = feats.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (argmax,) = ctx.saved_tensors
        channels = argmax.shape[1]
        valid = argmax >= 0
        flat = (argmax * channels + torch.arange(channels, device=argmax.device))[valid]
        grad_in = grad_out.new_zeros(ctx.num_in * channels).index_add_(0, flat, grad_out[valid])
        return grad_in.view(ctx.num_in, channels), None, None, None, None


def _sum_over_pairs(feats: torch.Tensor, kmap: KernelMap) -> torch.Tensor:
    pairs = kmap.pairs
    out = feats.new_zeros(kmap.num_out, feats.shape[1])
    bounds = pairs.offsets.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            out = out.index_add(0, pairs.out_idx[start:end].long(), feats[pairs.in_idx[start:end].long()])
    return out


def _pool_map(input: SparseTensor, kernel_size, stride, dilation, padding, downsample_mode):
    if not isinstance(input, SparseTensor):
        raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
    geometry = ConvGeometry.make(kernel_size, kernel_size if stride is None else stride, dilation, padding)
    if geometry.is_unit_stride:
        return geometry, submanifold_map(input.cache, input.C, geometry, input.spatial_range)
    return geometry, strided_map(input.cache, input.C, geometry, downsample_mode, input.spatial_range)


def _pooled(input: SparseTensor, geometry: ConvGeometry, kmap: KernelMap, feats: torch.Tensor) -> SparseTensor:
    stride = tuple(t * s for t, s in zip(input.s, geometry.stride))
    return SparseTensor._derive(feats, kmap.out_coords, stride, kmap.out_range, input.cache)


def max_pool3d(input: SparseTensor, kernel_size: IntOr3, stride: Optional[IntOr3] = None,
               dilation: IntOr3 = 1, padding: Optional[IntOr3] = None,
               downsample_mode: str = "spconv") -> SparseTensor:
    """Per-channel max over the kernel neighbourhood, on the conv output set of this geometry.
    ``stride`` defaults to ``kernel_size`` as in torch.nn.MaxPool3d."""
    geometry, kmap = _pool_map(input, kernel_size, stride, dilation, padding, downsample_mode)
    pairs = kmap.pairs
    feats = _MaxOverPairs.apply(input.F, pairs.in_idx, pairs.out_idx, pairs.offsets, kmap.num_out)
    return _pooled(input, geometry, kmap, feats)


def avg_pool3d(input: SparseTensor, kernel_size: IntOr3, stride: Optional[IntOr3] = None,
               dilation: IntOr3 = 1, padding: Optional[IntOr3] = None,
               downsample_mode: str = "spconv") -> SparseTensor:
    """Mean over the inputs present in the kernel neighbourhood (absent sites do not count)."""
    geometry, kmap = _pool_map(input, kernel_size, stride, dilation, padding, downsample_mode)
    counts = torch.bincount(kmap.pairs.out_idx.long(), minlength=kmap.num_out)
    feats = _sum_over_pairs(input.F, kmap) / counts.clamp(min=1).to(input.dtype)[:, None]
    return _pooled(input, geometry, kmap, feats)


def _batch_index(input: SparseTensor):
    if not isinstance(input, SparseTensor):
        raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
    batch = input.C[:, 0].long()
    return batch, input.batch_size


def global_avg_pool(input: SparseTensor) -> torch.Tensor:
    """``[B, C]`` mean of each sample's features."""
    batch, size = _batch_index(input)
    sums = input.F.new_zeros(size, input.num_channels).index_add(0, batch, input.F)
    counts = torch.bincount(batch, minlength=size).clamp(min=1).to(input.dtype)
    return sums / counts[:, None]


def global_max_pool(input: SparseTensor) -> torch.Tensor:
    """``[B, C]`` per-channel max of each sample's features."""
    batch, size = _batch_index(input)
    index = batch[:, None].expand(-1, input.num_channels)
    return input.F.new_zeros(size, input.num_channels).scatter_reduce(0, index, input.F, "amax",
                                                                     include_self=False)
