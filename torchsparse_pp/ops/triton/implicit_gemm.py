"""implicit_gemm in Triton: output-stationary tiles over the neighbour table, following the
same plans as the native path (kmap_plan: offset splits, bitmask-sorted row order, per-tile
OR-reduced offset masks).

Forward / dgrad: a program owns BLOCK_M row slots of one split (rows in plan order when sorted)
and BLOCK_N output channels. It ORs the masks of the plan tiles under its slots and walks only
the offsets some of its rows have: gather the rows' neighbours through the table (missing
neighbours masked), tl.dot with W[k], accumulate in float32. One split writes the output
directly; several write float32 partial buffers that are summed in split order.

A missing neighbour's zero row times a weight holding Inf or NaN would be NaN, where the gather
dataflows add nothing. So each call flags the offsets whose weight is not finite (one small
kernel on the device, no host read, run once per weight version: the flags are cached beside the
weight); the forward kernel skips them, and ig_nonfinite_kernel then adds them to the rows that
have those neighbours, by rank-1 updates masked per row. With finite weights (the common case)
its programs read the flags and return. (Folding those updates into the forward kernel spills
registers at several tiles and targets; two launches keep every tile spill-free.)

wgrad: a program owns one offset, a (C_in, C_out) tile and a chunk of row slots; it walks the
chunk BLOCK_K slots at a time, skipping plan tiles whose mask lacks the offset, and sums
feats[table[r, k]]^T grad[r]. Chunks add into dW with atomics; one chunk per offset
(deterministic mode) leaves a single writer per element.
"""
import torch
import triton
import triton.language as tl
from torch.utils.weak import WeakIdKeyDictionary

from . import runtime
from .common import gathered_dot, gathered_dot_t, gathered_outer, nonfinite_rows_kernel
from .tiles import choose_tile, choose_wgrad_tile

runtime.mark_defined()

# The plan the Triton kernels read (the native CUDA path's): 64-row plan tiles, one global sort.
PLAN_TILE_ROWS = 64
PLAN_SORT_WINDOW = 0
# ig_nonfinite_kernel's program: SUBTILES tiles of BLOCK_M rows by BLOCK_N channels (few programs:
# with finite weights each only reads the flags).
NONFINITE_BLOCK_M = 32
NONFINITE_BLOCK_N = 32
NONFINITE_SUBTILES = 8
FLAG_BLOCK = 1024
# weight -> (version, data pointer, flags): a weight's flags are computed once per version.
_flags_of = WeakIdKeyDictionary()


def nonfinite_offsets(weight: torch.Tensor) -> torch.Tensor:
    """int32 [K]: 1 where W[k] holds Inf or NaN (one launch on weight's device, or none when this
    weight, unchanged since, was flagged before: in-place updates bump its version)."""
    stamp = (weight._version, weight.data_ptr())
    cached = _flags_of.get(weight)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    w = weight.contiguous()
    volume = w.shape[0]
    flags = torch.empty(volume, dtype=torch.int32, device=w.device)
    if volume:
        nonfinite_rows_kernel[(volume,)](w, flags, w[0].numel(), BLOCK=FLAG_BLOCK)
    if not torch.compiler.is_compiling():
        _flags_of[weight] = (stamp, flags)
    return flags


@triton.jit
def _tile_has(split_masks, first_tile, num_tiles, num_words, bit, TILES_PER_PROGRAM: tl.constexpr):
    """Whether offset bit ``bit`` of the split is set in the mask of any plan tile under the program."""
    word = bit // 64
    present = tl.load(split_masks + first_tile * num_words + word)
    for t in tl.static_range(1, TILES_PER_PROGRAM):
        present |= tl.load(split_masks + (first_tile + t) * num_words + word, mask=first_tile + t < num_tiles,
                           other=0)
    return ((present >> (bit % 64).to(tl.int64)) & 1) != 0


@triton.jit(do_not_specialize=["num_dst", "num_tiles", "order_stride", "split_stride"])
def ig_forward_kernel(feats_ptr, w_ptr, out_ptr, table_ptr, order_ptr, masks_ptr, bounds_ptr, nonfinite_ptr,
                      num_dst, num_offsets, num_tiles, num_words, order_stride, split_stride,
                      c_src, c_dst, stride_f, stride_o,
                      SORTED: tl.constexpr, PLAN_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    split = tl.program_id(2)
    slot0 = tl.program_id(0) * BLOCK_M
    slots = slot0 + tl.arange(0, BLOCK_M)
    if SORTED:
        rows = tl.load(order_ptr + split.to(tl.int64) * order_stride + slots, mask=slots < num_dst, other=-1)
    else:
        rows = tl.where(slots < num_dst, slots, -1)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc_type: tl.constexpr = tl.float64 if feats_ptr.dtype.element_ty == tl.float64 else tl.float32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=acc_type)
    # The plan tiles under this program's slots (BLOCK_M and PLAN_ROWS are powers of two).
    first_tile = slot0 // PLAN_ROWS
    TILES_PER_PROGRAM: tl.constexpr = (BLOCK_M + PLAN_ROWS - 1) // PLAN_ROWS
    split_masks = masks_ptr + split * num_tiles * num_words
    table_rows = table_ptr + rows.to(tl.int64) * num_offsets
    k_begin = tl.load(bounds_ptr + split).to(tl.int32)
    k_end = tl.load(bounds_ptr + split + 1).to(tl.int32)
    for k in range(k_begin, k_end):
        # Offsets whose weight is not finite are left to ig_nonfinite_kernel.
        if tl.load(nonfinite_ptr + k) == 0:
            if _tile_has(split_masks, first_tile, num_tiles, num_words, k - k_begin, TILES_PER_PROGRAM):
                src = tl.load(table_rows + k, mask=rows >= 0, other=-1)
                acc = gathered_dot(acc, feats_ptr, src, stride_f, c_src, w_ptr + k * c_src * c_dst, cols,
                                   c_dst, BLOCK_K, PRECISION, UPCAST)
    out_rows = out_ptr + split.to(tl.int64) * split_stride + rows.to(tl.int64) * stride_o
    tl.store(out_rows[:, None] + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows >= 0)[:, None] & (cols < c_dst)[None, :])


@triton.jit(do_not_specialize=["num_dst", "num_tiles", "order_stride", "split_stride"])
def ig_nonfinite_kernel(feats_ptr, w_ptr, out_ptr, table_ptr, order_ptr, masks_ptr, bounds_ptr, nonfinite_ptr,
                        num_dst, num_offsets, num_tiles, num_words, order_stride, split_stride,
                        c_src, c_dst, stride_f, stride_o,
                        SORTED: tl.constexpr, PLAN_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        SUBTILES: tl.constexpr):
    """Adds the offsets whose weight is not finite (flagged in nonfinite_ptr, skipped by the
    forward kernel) to out, for the rows that have those neighbours only. A program owns
    SUBTILES x BLOCK_M row slots of one split and BLOCK_N channels; it returns at once when the
    split has no flagged offset."""
    split = tl.program_id(2)
    k_begin = tl.load(bounds_ptr + split).to(tl.int32)
    k_end = tl.load(bounds_ptr + split + 1).to(tl.int32)
    flagged = tl.full((), 0, tl.int32)
    for k in range(k_begin, k_end):
        flagged += tl.load(nonfinite_ptr + k)
    if flagged != 0:
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc_type: tl.constexpr = tl.float64 if feats_ptr.dtype.element_ty == tl.float64 else tl.float32
        split_masks = masks_ptr + split * num_tiles * num_words
        TILES_PER_SUBTILE: tl.constexpr = (BLOCK_M + PLAN_ROWS - 1) // PLAN_ROWS
        for sub in range(0, SUBTILES):
            slot0 = (tl.program_id(0) * SUBTILES + sub) * BLOCK_M
            slots = slot0 + tl.arange(0, BLOCK_M)
            if SORTED:
                rows = tl.load(order_ptr + split.to(tl.int64) * order_stride + slots, mask=slots < num_dst, other=-1)
            else:
                rows = tl.where(slots < num_dst, slots, -1)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=acc_type)
            touched = tl.full((), 0, tl.int32)
            for k in range(k_begin, k_end):
                if tl.load(nonfinite_ptr + k) != 0:
                    if _tile_has(split_masks, slot0 // PLAN_ROWS, num_tiles, num_words, k - k_begin,
                                 TILES_PER_SUBTILE):
                        src = tl.load(table_ptr + rows.to(tl.int64) * num_offsets + k, mask=rows >= 0, other=-1)
                        acc = gathered_outer(acc, feats_ptr, src, stride_f, c_src, w_ptr + k * c_src * c_dst,
                                             cols, c_dst)
                        touched = tl.full((), 1, tl.int32)
            if touched != 0:
                out_tile = (out_ptr + split.to(tl.int64) * split_stride + rows.to(tl.int64)[:, None] * stride_o
                            + cols[None, :])
                mask = (rows >= 0)[:, None] & (cols < c_dst)[None, :]
                total = tl.load(out_tile, mask=mask, other=0.0).to(acc_type) + acc
                tl.store(out_tile, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_rows", "num_tiles", "order_stride", "chunks", "slots_per_chunk"])
def ig_wgrad_kernel(feats_ptr, grad_ptr, dw_ptr, table_ptr, order_ptr, masks_ptr, bounds_ptr, split_of_offset_ptr,
                    num_rows, num_offsets, num_tiles, num_words, order_stride, chunks, slots_per_chunk,
                    c_in, c_out, stride_f, stride_g,
                    SORTED: tl.constexpr, PLAN_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    job = tl.program_id(0)
    k = job // chunks
    chunk = job % chunks
    split = tl.load(split_of_offset_ptr + k)
    bit = (k - tl.load(bounds_ptr + split)).to(tl.int32)
    split_masks = masks_ptr + split * num_tiles * num_words + bit // 64
    in_ch = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    out_ch = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=dw_ptr.dtype.element_ty)
    slot_begin = chunk * slots_per_chunk
    slot_end = tl.minimum(num_rows, slot_begin + slots_per_chunk)
    # BLOCK_K divides PLAN_ROWS, so a step never straddles two plan tiles.
    for slot0 in range(slot_begin, slot_end, BLOCK_K):
        present = tl.load(split_masks + (slot0 // PLAN_ROWS) * num_words)
        if ((present >> (bit % 64).to(tl.int64)) & 1) != 0:
            slots = slot0 + tl.arange(0, BLOCK_K)
            if SORTED:
                rows = tl.load(order_ptr + split * order_stride + slots, mask=slots < slot_end, other=-1)
            else:
                rows = tl.where(slots < slot_end, slots, -1)
            src = tl.load(table_ptr + rows.to(tl.int64) * num_offsets + k, mask=rows >= 0, other=-1)
            acc = gathered_dot_t(acc, feats_ptr, src, stride_f, in_ch, c_in, grad_ptr, rows, stride_g, out_ch, c_out,
                                 PRECISION, UPCAST)
    tl.atomic_add(dw_ptr + k.to(tl.int64) * c_in * c_out + in_ch[:, None] * c_out + out_ch[None, :], acc,
                  mask=(in_ch < c_in)[:, None] & (out_ch < c_out)[None, :], sem="relaxed")


def _launch_options(tile, feats, allow_tf32, is_sorted, tile_rows):
    return dict(SORTED=is_sorted, PLAN_ROWS=tile_rows, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
                PRECISION=runtime.dot_precision(feats.dtype, allow_tf32), UPCAST=runtime.upcast_dot(feats.dtype),
                num_warps=tile.num_warps, num_stages=tile.num_stages)


def _check_plan(table, bounds, order, tile_masks, tile_rows):
    splits = bounds.shape[0] - 1
    if tile_masks.dim() != 3 or tile_masks.shape[0] != splits:
        raise ValueError(f"tile_masks must be [splits={splits}, tiles, words], got {list(tile_masks.shape)}")
    if order.numel() and (order.dim() != 2 or order.shape[0] != splits):
        raise ValueError(f"order must be empty or [splits={splits}, rows], got {list(order.shape)}")
    if tile_rows <= 0 or tile_rows & (tile_rows - 1):
        raise ValueError(f"tile_rows must be a power of two, got {tile_rows}")
    if table.dim() != 2:
        raise ValueError(f"the table must be [rows, K], got {list(table.shape)}")


def forward(feats, weight, table, num_dst, transpose_weight, bounds, order, tile_masks, tile_rows, tile=None,
            allow_tf32=False):
    """``out[r] = sum_k feats[table[r, k]] @ W[k]`` (``W[k]^T`` with ``transpose_weight``)."""
    runtime.check_operands(feats, weight)
    allow_tf32 = allow_tf32 and runtime.tf32_supported(feats.device)
    _check_plan(table, bounds, order, tile_masks, tile_rows)
    feats = feats.contiguous()
    w = (weight.transpose(1, 2) if transpose_weight else weight).contiguous()
    volume, c_src, c_dst = w.shape
    splits, is_sorted = bounds.shape[0] - 1, order.numel() > 0
    if splits == 1:
        out = torch.empty(num_dst, c_dst, dtype=feats.dtype, device=feats.device)
    else:
        out = torch.empty(splits, num_dst, c_dst, dtype=runtime.accumulator_dtype(feats.dtype), device=feats.device)
    if num_dst and c_dst:
        t = choose_tile(tile, num_dst, c_src, c_dst, runtime.mode(feats.dtype, allow_tf32))
        grid = (triton.cdiv(num_dst, t.block_m), triton.cdiv(c_dst, t.block_n), splits)
        nonfinite = nonfinite_offsets(weight)
        ig_forward_kernel[grid](feats, w, out, table, order if is_sorted else table, tile_masks, bounds, nonfinite,
                                num_dst,
                                volume, tile_masks.shape[1], tile_masks.shape[2], order.shape[1] if is_sorted else 0,
                                num_dst * c_dst, c_src, c_dst, feats.stride(0), c_dst,
                                **_launch_options(t, feats, allow_tf32, is_sorted, tile_rows))
        fix_grid = (triton.cdiv(num_dst, NONFINITE_BLOCK_M * NONFINITE_SUBTILES), triton.cdiv(c_dst, NONFINITE_BLOCK_N),
                    splits)
        ig_nonfinite_kernel[fix_grid](feats, w, out, table, order if is_sorted else table, tile_masks, bounds,
                                      nonfinite, num_dst, volume, tile_masks.shape[1], tile_masks.shape[2],
                                      order.shape[1] if is_sorted else 0, num_dst * c_dst, c_src, c_dst,
                                      feats.stride(0), c_dst, SORTED=is_sorted, PLAN_ROWS=tile_rows,
                                      BLOCK_M=NONFINITE_BLOCK_M, BLOCK_N=NONFINITE_BLOCK_N,
                                      SUBTILES=NONFINITE_SUBTILES, num_warps=4, num_stages=1)
    elif splits > 1:
        out.zero_()
    return out if splits == 1 else out.sum(0).to(feats.dtype)


def wgrad_chunks(num_rows, volume, channel_tiles, tile_rows, deterministic):
    """(chunks per offset, row slots per chunk): a multiple of the plan tile, enough programs
    to fill a large GPU, each summing >= 512 rows; one chunk in deterministic mode."""
    whole = triton.cdiv(max(num_rows, 1), tile_rows) * tile_rows
    if deterministic:
        return 1, whole
    chunks = max(1, min(64, num_rows // 512, 1024 // max(1, volume * channel_tiles)))
    per_chunk = triton.cdiv(triton.cdiv(whole, chunks), tile_rows) * tile_rows
    return triton.cdiv(whole, per_chunk), per_chunk


def wgrad(feats, grad, table, bounds, order, tile_masks, tile_rows, tile=None, allow_tf32=False,
          deterministic=False):
    """``dW[k] = sum_r feats[table[r, k]]^T grad[r]``, ``[K, C_in, C_out]``."""
    runtime.check_operands(feats, grad)
    allow_tf32 = allow_tf32 and runtime.tf32_supported(feats.device)
    _check_plan(table, bounds, order, tile_masks, tile_rows)
    feats, grad = feats.contiguous(), grad.contiguous()
    volume, c_in, c_out, num_rows = table.shape[1], feats.shape[1], grad.shape[1], grad.shape[0]
    is_sorted = order.numel() > 0
    dw = torch.zeros(volume, c_in, c_out, dtype=runtime.accumulator_dtype(feats.dtype), device=feats.device)
    if num_rows and c_in and c_out:
        t = choose_wgrad_tile(tile, c_in, c_out, runtime.mode(feats.dtype, allow_tf32))
        if tile_rows % t.block_k:
            raise ValueError(f"the plan's tile_rows ({tile_rows}) must be a multiple of the tile's BLOCK_K "
                             f"({t.block_k})")
        grid_c = (triton.cdiv(c_in, t.block_m), triton.cdiv(c_out, t.block_n))
        chunks, per_chunk = wgrad_chunks(num_rows, volume, grid_c[0] * grid_c[1], tile_rows, deterministic)
        split_of_offset = torch.bucketize(torch.arange(volume, device=bounds.device), bounds[1:], right=True)
        ig_wgrad_kernel[(volume * chunks, *grid_c)](
            feats, grad, dw, table, order if is_sorted else table, tile_masks, bounds, split_of_offset, num_rows, volume,
            tile_masks.shape[1], tile_masks.shape[2], order.shape[1] if is_sorted else 0, chunks, per_chunk,
            c_in, c_out, feats.stride(0), grad.stride(0), **_launch_options(t, feats, allow_tf32, is_sorted, tile_rows))
    return dw.to(feats.dtype)
