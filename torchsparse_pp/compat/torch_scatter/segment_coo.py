"""torch_scatter's ``segment_coo(src, index, out=None, dim_size=None, reduce="sum")``,
``segment_{sum,add,mean,min,max}_coo`` and ``gather_coo(src, index, out=None)``.

``index`` (int64, sorted along its last dimension, which is the reduced dimension of ``src``)
is expanded to ``src``'s leading sizes; a new result has ``dim_size`` positions, or 1 + the
largest last index; with ``out`` the reduction starts from ``out``'s values. float16 / bfloat16
values are reduced in float32 and rounded once (torch_scatter's CPU kernels do the same).
Conventions of the reductions as in ``scatter``; an unsorted index raises (torch_scatter's
kernels assume sorted runs).
"""
from typing import Optional, Tuple

import torch

from .checks import (check_dim_size, check_index, check_out, check_range, check_sorted, check_src, leading_index,
                     trailing)
from .reduce import EXTREMES, fresh, identity, reduce_into

SEGMENT_REDUCTIONS = ("sum", "add", "mean", "min", "max")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the segment kernels accumulate in (ATen's opmath type)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _segment_coo(src, index, out, dim_size, reduce: str):
    check_src(src, reduce)
    check_index(index)
    index = leading_index(index, src, "index")
    if index.shape[-1] != src.shape[index.dim() - 1]:
        raise ValueError(f"index has {index.shape[-1]} entries but src has {src.shape[index.dim() - 1]} along "
                         f"dim {index.dim() - 1}")
    dim = index.dim() - 1
    check_out(out, src, dim)
    check_dim_size(dim_size)
    check_sorted(index, dim, "segment_coo")
    if out is not None:
        size = out.shape[dim]
    elif dim_size is not None:
        size = dim_size
    else:
        size = 1 + int(index.select(dim, -1).max()) if index.numel() else 0
    check_range(index, size)
    wide = compute_dtype(src.dtype)
    start = (fresh(src, dim, size, reduce) if out is None else out).to(wide)
    values, arg = reduce_into(src.to(wide), trailing(index, src.shape), dim, start, reduce)
    values = values.to(src.dtype)
    if reduce in EXTREMES and out is None:
        values = values.masked_fill(values == identity(src.dtype, reduce), 0)
    return (values if out is None else out.copy_(values)), arg


def segment_coo(src: torch.Tensor, index: torch.Tensor, out: Optional[torch.Tensor] = None,
                dim_size: Optional[int] = None, reduce: str = "sum") -> torch.Tensor:
    if reduce not in SEGMENT_REDUCTIONS:
        raise ValueError(f"reduce must be one of {SEGMENT_REDUCTIONS}, got {reduce!r}")
    return _segment_coo(src, index, out, dim_size, "sum" if reduce == "add" else reduce)[0]


def segment_sum_coo(src: torch.Tensor, index: torch.Tensor, out: Optional[torch.Tensor] = None,
                    dim_size: Optional[int] = None) -> torch.Tensor:
    return _segment_coo(src, index, out, dim_size, "sum")[0]


segment_add_coo = segment_sum_coo


def segment_mean_coo(src: torch.Tensor, index: torch.Tensor, out: Optional[torch.Tensor] = None,
                     dim_size: Optional[int] = None) -> torch.Tensor:
    return _segment_coo(src, index, out, dim_size, "mean")[0]


def segment_min_coo(src: torch.Tensor, index: torch.Tensor, out: Optional[torch.Tensor] = None,
                    dim_size: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    return _segment_coo(src, index, out, dim_size, "min")


def segment_max_coo(src: torch.Tensor, index: torch.Tensor, out: Optional[torch.Tensor] = None,
                    dim_size: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    return _segment_coo(src, index, out, dim_size, "max")


def gather_coo(src: torch.Tensor, index: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``out[..., e, ...] = src[..., index[..., e], ...]`` along the index's last dimension
    (``index`` sorted, its leading sizes those of ``src``)."""
    check_src(src, "gather")
    check_index(index)
    if index.dim() == 0 or index.dim() > src.dim() or tuple(index.shape[:-1]) != tuple(src.shape[:index.dim() - 1]):
        raise ValueError(f"index of shape {tuple(index.shape)} must have src's leading sizes "
                         f"{tuple(src.shape[:max(index.dim() - 1, 0)])}")
    dim = index.dim() - 1
    check_sorted(index, dim, "gather_coo")
    check_range(index, src.shape[dim])
    shape = list(src.shape)
    shape[dim] = index.shape[-1]
    result = src.gather(dim, trailing(index, shape))
    if out is None:
        return result
    check_out(out, src, dim)
    if out.shape[dim] < shape[dim]:
        raise ValueError(f"out has {out.shape[dim]} positions along dim {dim}, the index {shape[dim]}")
    out.narrow(dim, 0, shape[dim]).copy_(result)
    return out
