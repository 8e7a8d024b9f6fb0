"""torchsparse 2.1's functional activations, global pooling and crop."""
import torch
from torch.nn import functional as TF

from ...tensor import SparseTensor
from ..utils import fapply


def relu(input: SparseTensor, inplace: bool = True) -> SparseTensor:
    return fapply(input, TF.relu, inplace=inplace)


def silu(input: SparseTensor, inplace: bool = True) -> SparseTensor:
    return fapply(input, TF.silu, inplace=inplace)


def leaky_relu(input: SparseTensor, negative_slope: float = 0.1, inplace: bool = True) -> SparseTensor:
    return fapply(input, TF.leaky_relu, negative_slope=negative_slope, inplace=inplace)


def _per_sample(input: SparseTensor, reduce) -> torch.Tensor:
    batch = input.coords[:, 0]
    return torch.stack([reduce(input.feats[batch == b]) for b in range(int(batch.max().item()) + 1)])


def global_avg_pool(inputs: SparseTensor) -> torch.Tensor:
    """``[batch_size, C]`` per-sample means."""
    return _per_sample(inputs, lambda f: f.mean(0))


def global_max_pool(inputs: SparseTensor) -> torch.Tensor:
    """``[batch_size, C]`` per-sample maxima."""
    return _per_sample(inputs, lambda f: f.max(0)[0])


def spcrop(input: SparseTensor, coords_min=None, coords_max=None) -> SparseTensor:
    """The rows whose first three coordinate columns lie in [coords_min, coords_max) (2.1 compares
    columns 0-2, i.e. batch, x, y, with its batch-first coordinates; reproduced as is)."""
    coords = input.coords
    keep = torch.ones(coords.shape[0], dtype=torch.bool, device=coords.device)
    if coords_min is not None:
        keep &= (coords[:, :3] >= torch.tensor(coords_min, dtype=coords.dtype, device=coords.device)).all(1)
    if coords_max is not None:
        keep &= (coords[:, :3] < torch.tensor(coords_max, dtype=coords.dtype, device=coords.device)).all(1)
    return SparseTensor(input.feats[keep], coords[keep], input.stride)
