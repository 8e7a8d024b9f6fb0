"""Kernel-map construction: torch.ops.torchsparse_pp.kmap_*."""
from typing import Optional, Sequence, Tuple

import torch

_ops = torch.ops.torchsparse_pp
Tensors2 = Tuple[torch.Tensor, torch.Tensor]
Tensors3 = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def kmap_out_in(table: torch.Tensor, out_coords: torch.Tensor, kernel_size: Sequence[int],
                stride: Sequence[int], dilation: Sequence[int], padding: Sequence[int],
                pad_rows_to: int, submanifold: bool = False) -> torch.Tensor:
    """Output-stationary map ``[rows, K]``: the input row (a value of ``table``) that each output
    reads through each offset, -1 where there is none; rows padded with -1 to ``pad_rows_to``.

    ``submanifold=True`` (stride 1, odd kernels, centred padding, ``out_coords`` = the table's
    coordinates in the same order) looks up half the offsets and mirrors the rest.
    """
    return _ops.kmap_out_in(table, out_coords, list(kernel_size), list(stride), list(dilation),
                            list(padding), pad_rows_to, submanifold)


def kmap_submanifold(coords: torch.Tensor, kernel_size: Sequence[int], dilation: Sequence[int],
                     padding: Sequence[int], pad_rows_to: int) -> torch.Tensor:
    """Submanifold map ``out_in`` (outputs = ``coords``, stride 1) by sort and merge, rows padded
    with -1 to ``pad_rows_to``. Raises for duplicate coordinates."""
    return _ops.kmap_submanifold(coords, list(kernel_size), list(dilation), list(padding), pad_rows_to)


def kmap_downsample(coords: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                    dilation: Sequence[int], padding: Sequence[int], mode: str,
                    out_range: Optional[Sequence[int]], pad_rows_to: int) -> Tensors2:
    """Strided conv map: ``(out_coords, out_in)``.

    The output set is 'spconv' (every q some input reaches, clipped to ``[0, out_range)`` when
    given) or 'minkowski' (``unique(floor(p / s))``), sorted by (batch, x, y, z).
    """
    return _ops.kmap_downsample(coords, list(kernel_size), list(stride), list(dilation), list(padding), mode,
                                None if out_range is None else list(out_range), pad_rows_to)


def kmap_generative(coords: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                    dilation: Sequence[int], padding: Sequence[int], out_range: Optional[Sequence[int]],
                    pad_rows_to: int) -> Tensors2:
    """Generative transposed conv map: ``(fine_coords, out_in)``.

    ``fine_coords`` is every site ``p*s - pad + t*d`` that conv_transpose3d writes (clipped to
    ``[0, out_range)`` when given), sorted; ``out_in`` has one row per coarse input p and holds
    the fine rows, i.e. it is the map of the strided conv from the fine set back to ``coords``.
    """
    return _ops.kmap_generative(coords, list(kernel_size), list(stride), list(dilation), list(padding),
                                None if out_range is None else list(out_range), pad_rows_to)


def kmap_pairs(out_in: torch.Tensor, num_in: int, num_out: int
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight-stationary view of a map: ``(in_idx, out_idx, offsets, identity)``.

    Pairs of offset k are ``[offsets[k], offsets[k+1])``, ordered by output row; ``identity[k]``
    says that offset k maps every row j to row j.
    """
    return _ops.kmap_pairs(out_in, num_in, num_out)


def kmap_transpose(out_in: torch.Tensor, num_out: int, num_in: int, pad_rows_to: int) -> torch.Tensor:
    """``in_out[p, k] = q`` wherever ``out_in[q, k] = p``: the table of the transposed map."""
    return _ops.kmap_transpose(out_in, num_out, num_in, pad_rows_to)


def kmap_plan(table: torch.Tensor, num_rows: int, split_mask_num: int, tile_rows: int,
              sort_window: int = 0) -> Tensors3:
    """Execution plan of an output-stationary table: ``(bounds, order, tile_masks)``.

    The offsets split into ``max(1, split_mask_num)`` contiguous ranges (``bounds``). With
    ``split_mask_num > 0`` the rows are sorted per split by their neighbour bitmask, descending
    (``order``, -1 padded to whole tiles); otherwise ``order`` is empty. ``tile_masks`` holds,
    per split and tile of ``tile_rows`` rows, the OR of the rows' bitmasks in 64-bit words.
    ``sort_window > 0`` sorts within consecutive windows of that many rows only.
    """
    return _ops.kmap_plan(table, num_rows, split_mask_num, tile_rows, sort_window)


def _padded(rows, pad_rows_to):
    return (rows + pad_rows_to - 1) // pad_rows_to * pad_rows_to


def _new_set_fake(coords, kernel_size, pad_rows_to, rows_of_map):
    # A new coordinate set is data-dependent: an unbacked size, at least 1 (a SparseTensor has
    # points; compiled code asserts it when it runs).
    new_rows = torch.library.get_ctx().new_dynamic_size(min=1)
    volume = kernel_size[0] * kernel_size[1] * kernel_size[2]
    map_rows = new_rows if rows_of_map is None else rows_of_map
    return coords.new_empty(new_rows, 4), coords.new_empty(_padded(map_rows, pad_rows_to), volume)


@torch.library.register_fake("torchsparse_pp::kmap_out_in")
def _kmap_out_in_fake(table, out_coords, kernel_size, stride, dilation, padding, pad_rows_to, submanifold=False):
    volume = kernel_size[0] * kernel_size[1] * kernel_size[2]
    return out_coords.new_empty(_padded(out_coords.shape[0], pad_rows_to), volume)


@torch.library.register_fake("torchsparse_pp::kmap_submanifold")
def _kmap_submanifold_fake(coords, kernel_size, dilation, padding, pad_rows_to):
    volume = kernel_size[0] * kernel_size[1] * kernel_size[2]
    return coords.new_empty(_padded(coords.shape[0], pad_rows_to), volume)


@torch.library.register_fake("torchsparse_pp::kmap_downsample")
def _kmap_downsample_fake(coords, kernel_size, stride, dilation, padding, mode, out_range, pad_rows_to):
    return _new_set_fake(coords, kernel_size, pad_rows_to, None)


@torch.library.register_fake("torchsparse_pp::kmap_generative")
def _kmap_generative_fake(coords, kernel_size, stride, dilation, padding, out_range, pad_rows_to):
    return _new_set_fake(coords, kernel_size, pad_rows_to, coords.shape[0])


@torch.library.register_fake("torchsparse_pp::kmap_transpose")
def _kmap_transpose_fake(out_in, num_out, num_in, pad_rows_to):
    return out_in.new_empty(_padded(num_in, pad_rows_to), out_in.shape[1])


@torch.library.register_fake("torchsparse_pp::kmap_plan")
def _kmap_plan_fake(table, num_rows, split_mask_num, tile_rows, sort_window=0):
    volume = table.shape[1]
    splits = max(1, split_mask_num)
    tiles = (num_rows + tile_rows - 1) // tile_rows
    words = (-(-volume // splits) + 63) // 64
    order_rows = splits if split_mask_num > 0 else 0
    return (table.new_empty(splits + 1, dtype=torch.int64), table.new_empty(order_rows, tiles * tile_rows),
            table.new_empty(splits, tiles, words, dtype=torch.int64))


@torch.library.register_fake("torchsparse_pp::kmap_pairs")
def _kmap_pairs_fake(out_in, num_in, num_out):
    total = torch.library.get_ctx().new_dynamic_size()
    volume = out_in.shape[1]
    return (out_in.new_empty(total), out_in.new_empty(total),
            out_in.new_empty(volume + 1, dtype=torch.int64), out_in.new_empty(volume, dtype=torch.bool))
