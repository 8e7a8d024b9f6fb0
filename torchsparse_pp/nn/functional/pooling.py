"""Local and global pooling over the same kernel maps as convolution (custom ops: ops/pooling.py)."""
from typing import Optional

import torch

from ... import ops
from ...kmap import ConvGeometry, KernelMap, strided_map, submanifold_map
from ...kmap.geometry import IntOr3
from ...tensor import SparseTensor


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
    in_idx, out_idx = kmap.pairs.exact()
    feats, _ = ops.pool_pairs_max(input.F, in_idx, out_idx, kmap.num_out)
    return _pooled(input, geometry, kmap, feats)


def avg_pool3d(input: SparseTensor, kernel_size: IntOr3, stride: Optional[IntOr3] = None,
               dilation: IntOr3 = 1, padding: Optional[IntOr3] = None,
               downsample_mode: str = "spconv") -> SparseTensor:
    """Mean over the inputs present in the kernel neighbourhood (absent sites do not count)."""
    geometry, kmap = _pool_map(input, kernel_size, stride, dilation, padding, downsample_mode)
    in_idx, out_idx = kmap.pairs.exact()
    feats = ops.pool_pairs_mean(input.F, in_idx, out_idx, kmap.num_out)
    return _pooled(input, geometry, kmap, feats)


def _batch_index(input: SparseTensor) -> torch.Tensor:
    if not isinstance(input, SparseTensor):
        raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
    return input.C[:, 0].long()


def global_avg_pool(input: SparseTensor) -> torch.Tensor:
    """``[B, C]`` mean of each sample's features (B = the largest batch index + 1)."""
    batch = _batch_index(input)  # checks the input's type first
    return ops.segment_mean(input.F, batch)


def global_max_pool(input: SparseTensor) -> torch.Tensor:
    """``[B, C]`` per-channel max of each sample's features."""
    batch = _batch_index(input)  # checks the input's type first
    return ops.segment_max(input.F, batch)
