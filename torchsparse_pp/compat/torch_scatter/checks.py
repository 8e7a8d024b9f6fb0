"""Argument checks and index broadcasting of torch_scatter's functions, with the errors its
kernels give (or, where its kernels would read or write out of bounds, an error instead)."""
from typing import Optional

import torch


def normalized_dim(dim: int, ndim: int, what: str = "dim") -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ValueError(f"{what} {dim!r} is out of range for a tensor of {ndim} dimensions")
    return dim + ndim if dim < 0 else dim


def check_src(src: torch.Tensor, reduce: str) -> None:
    if not isinstance(src, torch.Tensor):
        raise TypeError(f"src must be a tensor, got {type(src).__name__}")
    # torch_scatter's own kernels (everything but the sum, which is torch's scatter_add_) take
    # real numbers only.
    if reduce != "sum" and (src.dtype == torch.bool or src.is_complex()):
        raise TypeError(f"reduce={reduce!r} takes real number tensors, got {src.dtype}")


def check_index(index: torch.Tensor, name: str = "index") -> None:
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(index).__name__}")
    if index.dtype != torch.int64:
        raise TypeError(f"{name} must be int64 (torch.long), got {index.dtype}")


def broadcast(index: torch.Tensor, src: torch.Tensor, dim: int) -> torch.Tensor:
    """torch_scatter's broadcast: a 1-D index runs along ``dim``; a shorter index gets trailing
    dimensions; then it is expanded to ``src``'s shape."""
    if index.dim() == 1:
        index = index.view((1,) * dim + (-1,))
    index = index.view(tuple(index.shape) + (1,) * (src.dim() - index.dim()))
    try:
        return index.expand(src.shape)
    except RuntimeError:
        raise ValueError(f"index of shape {tuple(index.shape)} cannot be broadcast to src of shape "
                         f"{tuple(src.shape)} along dim {dim}") from None


def check_range(index: torch.Tensor, size: int, name: str = "index") -> None:
    """Every value in [0, size): the kernels do not check, they would write out of bounds."""
    if index.numel() == 0:
        return
    low, high = int(index.min()), int(index.max())
    if low < 0 or high >= size:
        raise IndexError(f"{name} values must lie in [0, {size}), got [{low}, {high}]")


def check_sorted(index: torch.Tensor, dim: int, what: str) -> None:
    if index.shape[dim] > 1 and bool((index.diff(dim=dim) < 0).any()):
        raise ValueError(f"{what} needs index sorted (non-decreasing) along dim {dim}")


def check_out(out: Optional[torch.Tensor], src: torch.Tensor, dim: int) -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a tensor, got {type(out).__name__}")
    if out.dtype != src.dtype or out.device != src.device:
        raise TypeError(f"out is {out.dtype} on {out.device}, src is {src.dtype} on {src.device}")
    if out.dim() != src.dim() or any(o != s for i, (o, s) in enumerate(zip(out.shape, src.shape)) if i != dim):
        raise ValueError(f"out of shape {tuple(out.shape)} must match src {tuple(src.shape)} except in dim {dim}")


def check_dim_size(dim_size: Optional[int]) -> None:
    if dim_size is not None and (not isinstance(dim_size, int) or isinstance(dim_size, bool) or dim_size < 0):
        raise ValueError(f"dim_size must be an int >= 0, got {dim_size!r}")


def leading_index(index: torch.Tensor, src: torch.Tensor, name: str) -> torch.Tensor:
    """An ``index`` / ``indptr`` of at most ``src``'s dimensions, expanded to ``src``'s sizes in
    all but its last dimension (the segment functions' broadcasting)."""
    if index.dim() == 0 or index.dim() > src.dim():
        raise ValueError(f"{name} needs 1 to {src.dim()} dimensions (src has {src.dim()}), got {index.dim()}")
    try:
        return index.expand(tuple(src.shape[:index.dim() - 1]) + (index.shape[-1],))
    except RuntimeError:
        raise ValueError(f"{name} of shape {tuple(index.shape)} cannot be broadcast to src of shape "
                         f"{tuple(src.shape)}") from None


def trailing(index: torch.Tensor, shape) -> torch.Tensor:
    """``index`` with ``shape``'s trailing dimensions added and expanded to ``shape``."""
    return index.view(tuple(index.shape) + (1,) * (len(shape) - index.dim())).expand(tuple(shape))
