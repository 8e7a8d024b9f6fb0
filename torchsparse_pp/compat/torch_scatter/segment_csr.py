"""torch_scatter's ``segment_csr(src, indptr, out=None, reduce="sum")``,
``segment_{sum,add,mean,min,max}_csr`` and ``gather_csr(src, indptr, out=None)``.

``indptr`` (int64, non-decreasing along its last dimension, values in [0, src.size(dim)]) is
expanded to ``src``'s leading sizes; segment n of a row is ``[indptr[n], indptr[n + 1])`` along
``dim = indptr.dim() - 1``. The result (written over ``out`` when given) has
``indptr.size(-1) - 1`` positions; elements outside ``[indptr[0], indptr[-1])`` are not read.
Empty segments give 0 (and argument ``src.size(dim)`` for min / max); a non-empty segment whose
elements are all NaN gives the dtype's largest (min) / lowest (max) finite value, as in
torch_scatter, with argument ``src.size(dim)`` (torch_scatter's CPU kernel leaves the previous
segment's there). float16 / bfloat16 are reduced in float32 and rounded once.
"""
from typing import Optional, Tuple

import torch

from .checks import check_index, check_out, check_src, leading_index, trailing
from .reduce import EXTREMES, fresh, reduce_into
from .segment_coo import SEGMENT_REDUCTIONS, compute_dtype


def _check_indptr(indptr: torch.Tensor, top: int) -> None:
    if indptr.numel() == 0:
        return
    if bool((indptr.diff(dim=-1) < 0).any()):
        raise ValueError("indptr must be non-decreasing along its last dimension")
    low, high = int(indptr.min()), int(indptr.max())
    if low < 0 or high > top:
        raise IndexError(f"indptr values must lie in [0, {top}], got [{low}, {high}]")


def segments(indptr: torch.Tensor, length: int) -> torch.Tensor:
    """``[*B, length]``: the segment of each position e of a row, or ``indptr.size(-1) - 1`` for
    positions outside ``[indptr[0], indptr[-1])``."""
    size = max(indptr.shape[-1] - 1, 0)
    at = torch.arange(length, device=indptr.device).expand(tuple(indptr.shape[:-1]) + (length,)).contiguous()
    seg = torch.searchsorted(indptr.contiguous(), at, right=True) - 1
    return seg.masked_fill((seg < 0) | (seg >= size), size)


def _segment_csr(src, indptr, out, reduce: str):
    check_src(src, reduce)
    check_index(indptr, "indptr")
    indptr = leading_index(indptr, src, "indptr")
    dim = indptr.dim() - 1
    size = max(indptr.shape[-1] - 1, 0)
    check_out(out, src, dim)
    if out is not None and src.numel() and out.shape[dim] != size:
        raise ValueError(f"out has {out.shape[dim]} positions along dim {dim}, indptr makes {size} segments")
    _check_indptr(indptr, src.shape[dim])
    wide = compute_dtype(src.dtype)
    start = fresh(src, dim, size + 1, reduce).to(wide)  # position `size` collects what no segment covers
    values, arg = reduce_into(src.to(wide), trailing(segments(indptr, src.shape[dim]), src.shape), dim, start, reduce)
    values = values.narrow(dim, 0, size).to(src.dtype)
    if reduce in EXTREMES:
        arg = arg.narrow(dim, 0, size)
        empty = trailing(indptr.diff(dim=-1) == 0, values.shape)
        values = values.masked_fill(empty, 0)
    return (values if out is None else out.copy_(values)), arg


def segment_csr(src: torch.Tensor, indptr: torch.Tensor, out: Optional[torch.Tensor] = None,
                reduce: str = "sum") -> torch.Tensor:
    if reduce not in SEGMENT_REDUCTIONS:
        raise ValueError(f"reduce must be one of {SEGMENT_REDUCTIONS}, got {reduce!r}")
    return _segment_csr(src, indptr, out, "sum" if reduce == "add" else reduce)[0]


def segment_sum_csr(src: torch.Tensor, indptr: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _segment_csr(src, indptr, out, "sum")[0]


segment_add_csr = segment_sum_csr


def segment_mean_csr(src: torch.Tensor, indptr: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _segment_csr(src, indptr, out, "mean")[0]


def segment_min_csr(src: torch.Tensor, indptr: torch.Tensor,
                    out: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    return _segment_csr(src, indptr, out, "min")


def segment_max_csr(src: torch.Tensor, indptr: torch.Tensor,
                    out: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    return _segment_csr(src, indptr, out, "max")


def gather_csr(src: torch.Tensor, indptr: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``out[..., e, ...] = src[..., n, ...]`` for e in segment n; positions no segment covers
    keep ``out``'s values (0 in a new result: torch_scatter leaves them uninitialised). A new
    result has ``indptr.flatten()[-1]`` positions along ``dim``."""
    check_src(src, "gather")
    check_index(indptr, "indptr")
    indptr = leading_index(indptr, src, "indptr")
    dim = indptr.dim() - 1
    num = src.shape[dim]
    if num and num != indptr.shape[-1] - 1:
        raise ValueError(f"src has {num} rows along dim {dim} but indptr makes {indptr.shape[-1] - 1} segments")
    check_out(out, src, dim)
    if out is not None:
        length = out.shape[dim]
    else:
        length = int(indptr.flatten()[-1]) if src.numel() and indptr.numel() else 0
    _check_indptr(indptr, length)
    shape = list(src.shape)
    shape[dim] = length
    seg = trailing(segments(indptr, length), shape)
    base = src.new_zeros(shape) if out is None else out
    if num == 0:
        return base
    result = torch.where(seg < num, src.gather(dim, seg.clamp(max=num - 1)), base)
    return result if out is None else out.copy_(result)
