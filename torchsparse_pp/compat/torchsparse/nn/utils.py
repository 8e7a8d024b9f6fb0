"""torchsparse.nn.utils: fapply and get_kernel_offsets (2.1's offset values and order)."""
import itertools
from typing import Callable

import torch

from ..tensor import SparseTensor
from ..utils.utils import make_ntuple


def fapply(input: SparseTensor, fn: Callable[..., torch.Tensor], *args, **kwargs) -> SparseTensor:
    """``fn`` on the features; same coordinates, stride, spatial_range and caches."""
    output = SparseTensor(fn(input.feats, *args, **kwargs), input.coords, input.stride, input.spatial_range)
    output._caches = input._caches
    return output


def get_kernel_offsets(size, stride=1, dilation=1, device="cpu") -> torch.Tensor:
    """2.1's ``[K, 3]`` kernel offsets: ``t - (k-1)//2`` for t in [0, k), times stride and
    dilation, per axis; x-fastest for odd kernel volumes, z-fastest for even ones."""
    size, stride, dilation = make_ntuple(size, 3), make_ntuple(stride, 3), make_ntuple(dilation, 3)
    steps = [[(t - (k - 1) // 2) * s * d for t in range(k)] for k, s, d in zip(size, stride, dilation)]
    if (size[0] * size[1] * size[2]) % 2 == 1:
        offsets = [(x, y, z) for z, y, x in itertools.product(steps[2], steps[1], steps[0])]
    else:
        offsets = list(itertools.product(*steps))
    return torch.tensor(offsets, dtype=torch.int, device=device)
