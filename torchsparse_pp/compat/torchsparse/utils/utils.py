"""torchsparse 2.1's small helpers: tuples, tensors, rounding up."""
from functools import lru_cache
from typing import Tuple

import torch


def make_ntuple(x, ndim: int) -> Tuple[int, ...]:
    """An int repeated ``ndim`` times, or a list / tuple / tensor of ``ndim`` ints as a tuple."""
    if isinstance(x, bool):
        raise TypeError(f"expected an int or {ndim} ints, got {x!r}")
    if isinstance(x, int):
        return (x,) * ndim
    if isinstance(x, torch.Tensor):
        x = x.view(-1).tolist()
    x = tuple(x)
    if len(x) != ndim:
        raise ValueError(f"expected {ndim} values, got {x!r}")
    return x


@lru_cache()
def make_tensor(x: Tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A (cached) tensor of the tuple ``x``: callers must not modify it in place."""
    return torch.tensor(x, dtype=dtype, device=device)


def make_divisible(x: int, divisor: int) -> int:
    return (x + divisor - 1) // divisor * divisor
