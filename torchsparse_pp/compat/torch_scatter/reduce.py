"""The reductions behind every torch_scatter function, on torch's scatter ops.

``index`` has ``src``'s shape: element i of ``src`` goes to position ``index[i]`` along ``dim``
of a result whose other sizes are ``src``'s. ``start`` holds the values a reduction starts from
(``out``'s, or the reduction's identity for a new result). As in torch_scatter's kernels:
- min / max start a new result from the dtype's largest / lowest finite value, and an element
  counts only if it beats the value so far strictly (NaN never does); the argument is the
  position along ``dim`` of the first element that reached the result, ``src.size(dim)`` where
  none did;
- their values are ``src`` gathered at those arguments, so gradients reach the winning elements
  only (torch_scatter's backward), not every tied element as torch's amax backward would.
"""
from typing import Optional, Tuple

import torch

EXTREMES = ("min", "max")


def identity(dtype: torch.dtype, reduce: str):
    """The value a new result starts from (torch_scatter's Reducer::init)."""
    if reduce == "mul":
        return 1
    if reduce in EXTREMES:
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        return info.max if reduce == "min" else info.min
    return 0


def fresh(src: torch.Tensor, dim: int, size: int, reduce: str) -> torch.Tensor:
    shape = list(src.shape)
    shape[dim] = size
    return torch.full(shape, identity(src.dtype, reduce), dtype=src.dtype, device=src.device)


def positions(src: torch.Tensor, dim: int) -> torch.Tensor:
    """Each element's position along ``dim``, shaped like ``src``."""
    shape = [1] * src.dim()
    shape[dim] = src.shape[dim]
    return torch.arange(src.shape[dim], device=src.device).view(shape).expand(src.shape)


def extreme(src: torch.Tensor, index: torch.Tensor, dim: int, start: torch.Tensor,
            reduce: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values, argument) of min or max from ``start`` (see the module docstring)."""
    none = src.shape[dim]
    with torch.no_grad():
        begin = start.gather(dim, index)
        beats = src < begin if reduce == "min" else src > begin
        best = start.scatter_reduce(dim, index, torch.where(beats, src, begin), "amin" if reduce == "min" else "amax")
        reached = beats & (src == best.gather(dim, index))
        where = torch.where(reached, positions(src, dim), torch.full_like(index, none))
        arg = torch.full(start.shape, none, dtype=torch.int64, device=src.device).scatter_reduce(
            dim, index, where, "amin")
    if none == 0:
        return start.clone(), arg
    won = arg < none
    picked = src.gather(dim, arg.clamp(max=none - 1))
    return torch.where(won, picked, start), arg


def counts(index: torch.Tensor, dim: int, size: int, dtype: torch.dtype) -> torch.Tensor:
    """Elements per position, in ``dtype`` (torch_scatter counts in the values' dtype)."""
    shape = list(index.shape)
    shape[dim] = size
    ones = torch.ones(index.shape, dtype=dtype, device=index.device)
    return torch.zeros(shape, dtype=dtype, device=index.device).scatter_add_(dim, index, ones)


def divide_(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The mean, in place, from a sum and its counts (at least 1): true division, floor for
    integers (as torch_scatter divides)."""
    count = count.clamp(min=1)
    if total.is_floating_point():
        return total.true_divide_(count)
    return total.div_(count, rounding_mode="floor")


def reduce_into(src: torch.Tensor, index: torch.Tensor, dim: int, start: torch.Tensor,
                reduce: str) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(values, argument or None): sum, mul and mean reduce into ``start`` in place (the mean
    divides after adding, torch_scatter's order); min / max as ``extreme``, where positions no
    element reached keep their starting value (each caller applies its convention)."""
    if reduce in EXTREMES:
        return extreme(src, index, dim, start, reduce)
    if reduce == "sum":
        return start.scatter_add_(dim, index, src), None
    if reduce == "mul":
        return start.scatter_reduce_(dim, index, src, "prod"), None
    total = start.scatter_add_(dim, index, src)
    return divide_(total, counts(index, dim, start.shape[dim], src.dtype)), None
