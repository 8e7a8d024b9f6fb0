"""torch_scatter's scatter functions: ``scatter(src, index, dim=-1, out=None, dim_size=None,
reduce="sum")`` and ``scatter_{sum,add,mul,mean,min,max}``.

As in torch_scatter: ``index`` (int64) is broadcast to ``src`` (a 1-D index runs along ``dim``);
a new result has ``dim_size`` positions along ``dim``, or ``index.max() + 1`` (0 for an empty
index); with ``out`` the reduction starts from ``out``'s values and writes into ``out``
(``dim_size`` is then not read, as in torch_scatter). Positions no element reaches are 0
(sum, mean, and min / max of a new result, whose argument is then ``src.size(dim)``) or 1 (mul).
The mean divides by the element count (in the values' dtype, at least 1; floor division for
integers); with ``out`` it divides the accumulated ``out``, as torch_scatter does. Gradients of
mul are torch's exact ones (torch_scatter's backward divides by ``src``: 0 where an element is 0).
"""
from typing import Optional, Tuple

import torch

from .checks import broadcast, check_dim_size, check_index, check_out, check_range, check_src, normalized_dim
from .reduce import EXTREMES, fresh, identity, reduce_into

SCATTER_REDUCTIONS = ("sum", "add", "mul", "mean", "min", "max")


def _scatter(src, index, dim, out, dim_size, reduce: str):
    """(result, argument or None)."""
    check_src(src, reduce)
    check_index(index)
    dim = normalized_dim(dim, src.dim())
    check_out(out, src, dim)
    check_dim_size(dim_size)
    full = broadcast(index, src, dim)
    if out is not None:
        size = out.shape[dim]
    elif dim_size is not None:
        size = dim_size
    else:
        size = int(index.max()) + 1 if index.numel() else 0
    check_range(full, size)
    start = fresh(src, dim, size, reduce) if out is None else out
    values, arg = reduce_into(src, full, dim, start, reduce)
    if reduce not in EXTREMES:
        return values, None
    if out is not None:
        return out.copy_(values), arg
    # A new result: positions left at the starting value (no element beat it) read 0.
    return values.masked_fill(values == identity(src.dtype, reduce), 0), arg


def scatter_sum(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: Optional[torch.Tensor] = None,
                dim_size: Optional[int] = None) -> torch.Tensor:
    return _scatter(src, index, dim, out, dim_size, "sum")[0]


scatter_add = scatter_sum  # torch_scatter's other name of the sum


def scatter_mul(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: Optional[torch.Tensor] = None,
                dim_size: Optional[int] = None) -> torch.Tensor:
    return _scatter(src, index, dim, out, dim_size, "mul")[0]


def scatter_mean(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: Optional[torch.Tensor] = None,
                 dim_size: Optional[int] = None) -> torch.Tensor:
    return _scatter(src, index, dim, out, dim_size, "mean")[0]


def scatter_min(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: Optional[torch.Tensor] = None,
                dim_size: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(minima, argmin along ``dim``); ties go to the first element."""
    return _scatter(src, index, dim, out, dim_size, "min")


def scatter_max(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: Optional[torch.Tensor] = None,
                dim_size: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(maxima, argmax along ``dim``); ties go to the first element."""
    return _scatter(src, index, dim, out, dim_size, "max")


def scatter(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: Optional[torch.Tensor] = None,
            dim_size: Optional[int] = None, reduce: str = "sum") -> torch.Tensor:
    if reduce not in SCATTER_REDUCTIONS:
        raise ValueError(f"reduce must be one of {SCATTER_REDUCTIONS}, got {reduce!r}")
    return _scatter(src, index, dim, out, dim_size, "sum" if reduce == "add" else reduce)[0]
