"""The kernel-map builders in plain torch ops (torchsparse_pp.kmap.torch_ops, the "torch"
backend of ``backends.kmap_backend``) as torch.library custom ops, ``torchsparse_pp::torch_kmap_*``,
with the fake kernels of the compiled ``kmap_*`` ops (same results, same shapes).

Inside a torch.compile / export graph each build is then one node with unbacked sizes, instead
of a trace through sorts, uniques and host-side checks. The functions here have the signatures
of those in ops/kmap.py, so kmap.dispatch serves either module as a backend.
"""
from typing import List, Optional, Sequence, Tuple

import torch

from . import kmap as native

_NS = "torchsparse_pp"


def _impl():
    from ..kmap import torch_ops  # imported at first use: kmap imports ops
    return torch_ops


@torch.library.custom_op(f"{_NS}::torch_kmap_submanifold", mutates_args=())
def _submanifold(coords: torch.Tensor, kernel_size: List[int], dilation: List[int], padding: List[int],
                 pad_rows_to: int) -> torch.Tensor:
    return _impl().kmap_submanifold(coords, kernel_size, dilation, padding, pad_rows_to)


@torch.library.custom_op(f"{_NS}::torch_kmap_downsample", mutates_args=())
def _downsample(coords: torch.Tensor, kernel_size: List[int], stride: List[int], dilation: List[int],
                padding: List[int], mode: str, out_range: Optional[List[int]],
                pad_rows_to: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return _impl().kmap_downsample(coords, kernel_size, stride, dilation, padding, mode, out_range, pad_rows_to)


@torch.library.custom_op(f"{_NS}::torch_kmap_generative", mutates_args=())
def _generative(coords: torch.Tensor, kernel_size: List[int], stride: List[int], dilation: List[int],
                padding: List[int], out_range: Optional[List[int]], pad_rows_to: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return _impl().kmap_generative(coords, kernel_size, stride, dilation, padding, out_range, pad_rows_to)


@torch.library.custom_op(f"{_NS}::torch_kmap_pairs", mutates_args=())
def _pairs(out_in: torch.Tensor, num_in: int, num_out: int
           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _impl().kmap_pairs(out_in, num_in, num_out)


@torch.library.custom_op(f"{_NS}::torch_kmap_transpose", mutates_args=())
def _transpose(out_in: torch.Tensor, num_out: int, num_in: int, pad_rows_to: int) -> torch.Tensor:
    return _impl().kmap_transpose(out_in, num_out, num_in, pad_rows_to)


@torch.library.custom_op(f"{_NS}::torch_kmap_plan", mutates_args=())
def _plan(table: torch.Tensor, num_rows: int, split_mask_num: int, tile_rows: int,
          sort_window: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _impl().kmap_plan(table, num_rows, split_mask_num, tile_rows, sort_window)


_submanifold.register_fake(native._kmap_submanifold_fake)
_downsample.register_fake(native._kmap_downsample_fake)
_generative.register_fake(native._kmap_generative_fake)
_pairs.register_fake(native._kmap_pairs_fake)
_transpose.register_fake(native._kmap_transpose_fake)
_plan.register_fake(native._kmap_plan_fake)


def _opt(values: Optional[Sequence[int]]) -> Optional[List[int]]:
    return None if values is None else list(values)


def kmap_submanifold(coords, kernel_size, dilation, padding, pad_rows_to):
    """As ops.kmap_submanifold, in torch ops."""
    return _submanifold(coords, list(kernel_size), list(dilation), list(padding), pad_rows_to)


def kmap_downsample(coords, kernel_size, stride, dilation, padding, mode, out_range, pad_rows_to):
    """As ops.kmap_downsample, in torch ops."""
    return _downsample(coords, list(kernel_size), list(stride), list(dilation), list(padding), mode, _opt(out_range),
                       pad_rows_to)


def kmap_generative(coords, kernel_size, stride, dilation, padding, out_range, pad_rows_to):
    """As ops.kmap_generative, in torch ops."""
    return _generative(coords, list(kernel_size), list(stride), list(dilation), list(padding), _opt(out_range),
                       pad_rows_to)


def kmap_pairs(out_in, num_in, num_out):
    """As ops.kmap_pairs, in torch ops."""
    return _pairs(out_in, num_in, num_out)


def kmap_transpose(out_in, num_out, num_in, pad_rows_to):
    """As ops.kmap_transpose, in torch ops."""
    return _transpose(out_in, num_out, num_in, pad_rows_to)


def kmap_plan(table, num_rows, split_mask_num, tile_rows, sort_window=0):
    """As ops.kmap_plan, in torch ops."""
    return _plan(table, num_rows, split_mask_num, tile_rows, sort_window)
