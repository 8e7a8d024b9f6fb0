"""torchsparse 2.1's tensor operators: ``cat`` (features side by side) and ``generative_add``."""
from typing import List

import torch

from .tensor import SparseTensor


def cat(inputs: List[SparseTensor]) -> SparseTensor:
    """Features of tensors on the same coordinates, concatenated along channels (the first
    tensor's coordinates, stride and caches)."""
    first = inputs[0]
    for x in inputs[1:]:
        if x.coords is not first.coords and not (x.coords.shape == first.coords.shape
                                                 and torch.equal(x.coords, first.coords)):
            raise ValueError("cat needs tensors on the same coordinates in the same order")
    output = SparseTensor(torch.cat([x.feats for x in inputs], 1), first.coords, first.stride)
    output._caches = first._caches
    return output


def generative_add(a: SparseTensor, b: SparseTensor) -> SparseTensor:
    """Sum on the union of both coordinate sets (rows sorted), with the larger tensor's stride,
    spatial_range and caches."""
    big, small = (a, b) if a.feats.shape[0] >= b.feats.shape[0] else (b, a)
    coords, rows = torch.unique(torch.cat([big.coords, small.coords]), dim=0, return_inverse=True)
    feats = torch.cat([big.feats, small.feats])
    summed = feats.new_zeros(coords.shape[0], feats.shape[1]).index_add(0, rows, feats)
    output = SparseTensor(summed, coords, big.stride, big.spatial_range)
    output._caches = big._caches
    return output
