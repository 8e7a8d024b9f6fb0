"""Kernel-map construction: torch.ops.torchsparse_pp.kmap_*."""
from typing import Optional, Sequence, Tuple

import torch

_ops = torch.ops.torchsparse_pp


def kmap_output_coords(coords: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                       dilation: Sequence[int], padding: Sequence[int], mode: str,
                       out_range: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Sorted unique output coordinates of a strided ('spconv', 'minkowski') or generative conv.

    ``out_range`` clips the spconv and generative sets to ``[0, out_range)`` per axis.
    """
    return _ops.kmap_output_coords(coords, list(kernel_size), list(stride), list(dilation),
                                   list(padding), mode, None if out_range is None else list(out_range))


def kmap_out_in(keys: torch.Tensor, vals: torch.Tensor, out_coords: torch.Tensor,
                kernel_size: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                padding: Sequence[int], pad_rows_to: int, submanifold: bool = False) -> torch.Tensor:
    """Output-stationary map ``[rows, K]``: input row read by each output through each offset.

    -1 where there is no neighbour; rows are padded with -1 to a multiple of ``pad_rows_to``.
    ``submanifold=True`` (stride 1, odd kernels, centred padding, ``out_coords`` = the table's
    coordinates in the same order) looks up half the offsets and mirrors the rest.
    """
    return _ops.kmap_out_in(keys, vals, out_coords, list(kernel_size), list(stride), list(dilation),
                            list(padding), pad_rows_to, submanifold)


def kmap_pairs(out_in: torch.Tensor, num_in: int, num_out: int
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight-stationary view of a map: ``(in_idx, out_idx, offsets, identity)``.

    Pairs of offset k are ``[offsets[k], offsets[k+1])``, ordered by output row; ``identity[k]``
    says that offset k maps every row j to row j.
    """
    return _ops.kmap_pairs(out_in, num_in, num_out)


@torch.library.register_fake("torchsparse_pp::kmap_output_coords")
def _kmap_output_coords_fake(coords, kernel_size, stride, dilation, padding, mode, out_range):
    return coords.new_empty(torch.library.get_ctx().new_dynamic_size(), 4)


@torch.library.register_fake("torchsparse_pp::kmap_out_in")
def _kmap_out_in_fake(keys, vals, out_coords, kernel_size, stride, dilation, padding, pad_rows_to,
                      submanifold=False):
    rows = (out_coords.shape[0] + pad_rows_to - 1) // pad_rows_to * pad_rows_to
    volume = kernel_size[0] * kernel_size[1] * kernel_size[2]
    return out_coords.new_empty(rows, volume)


@torch.library.register_fake("torchsparse_pp::kmap_pairs")
def _kmap_pairs_fake(out_in, num_in, num_out):
    total = torch.library.get_ctx().new_dynamic_size()
    volume = out_in.shape[1]
    return (out_in.new_empty(total), out_in.new_empty(total),
            out_in.new_empty(volume + 1, dtype=torch.int64), out_in.new_empty(volume, dtype=torch.bool))
