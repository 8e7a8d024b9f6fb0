"""fetch_on_demand in Triton: one fused launch over every offset's pairs.

Forward / dgrad: a program takes BLOCK_M pairs of one offset (it finds the offset from a prefix
sum of the per-offset tile counts that it forms itself: nothing is read back to the host and no
tile table is built beforehand), gathers their source rows, multiplies by W[k] with tl.dot and adds the products into a float32 (float64)
accumulator by destination row with atomics. The deterministic variant owns BLOCK_M
destination rows instead, fetches each offset's sources from the output-stationary table and
adds the offsets in a fixed order with plain stores.

wgrad: per offset, the pairs are split into ``splits`` contiguous chunks (split-K); each program
sums feats[src]^T grad[dst] over its chunk in float32 and adds it into dW with atomics. With
one split (deterministic mode) every dW element has a single writer, so the result is exact and
run-to-run identical.
"""
import torch
import triton
import triton.language as tl

from . import runtime
from .common import gathered_dot, gathered_dot_t, owning_tile_segment
from .tiles import choose_tile, choose_wgrad_tile

runtime.mark_defined()


@triton.jit
def fod_forward_kernel(feats_ptr, w_ptr, out_ptr, src_ptr, dst_ptr, pair_offsets_ptr,
                       num_offsets, c_src, c_dst, stride_f, stride_o,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PRECISION: tl.constexpr, UPCAST: tl.constexpr, OFFSETS_P2: tl.constexpr):
    tile = tl.program_id(0)
    k, first_tile = owning_tile_segment(pair_offsets_ptr, tile, num_offsets, BLOCK_M, OFFSETS_P2)
    if k < 0:
        return
    first = tl.load(pair_offsets_ptr + k) + (tile - first_tile) * BLOCK_M
    pairs = first + tl.arange(0, BLOCK_M)
    in_tile = pairs < tl.load(pair_offsets_ptr + k + 1)
    src = tl.load(src_ptr + pairs, mask=in_tile, other=-1)
    dst = tl.load(dst_ptr + pairs, mask=in_tile, other=-1)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
    acc = gathered_dot(acc, feats_ptr, src, stride_f, c_src, w_ptr + k * c_src * c_dst, cols, c_dst,
                       BLOCK_K, PRECISION, UPCAST)
    tl.atomic_add(out_ptr + dst.to(tl.int64)[:, None] * stride_o + cols[None, :], acc,
                  mask=(dst >= 0)[:, None] & (cols < c_dst)[None, :], sem="relaxed")


@triton.jit(do_not_specialize=["num_dst"])
def fod_forward_owned_kernel(feats_ptr, w_ptr, out_ptr, table_ptr, num_dst, num_offsets, c_src, c_dst,
                             stride_f, stride_o,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_dst
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc_type: tl.constexpr = tl.float64 if feats_ptr.dtype.element_ty == tl.float64 else tl.float32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=acc_type)
    table_rows = table_ptr + rows.to(tl.int64) * num_offsets
    for k in range(num_offsets):
        src = tl.load(table_rows + k, mask=row_ok, other=-1)
        if tl.max(src, axis=0) >= 0:  # some row of the block has a neighbour through offset k
            acc = gathered_dot(acc, feats_ptr, src, stride_f, c_src, w_ptr + k * c_src * c_dst, cols, c_dst,
                               BLOCK_K, PRECISION, UPCAST)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_o + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (cols < c_dst)[None, :])


@triton.jit(do_not_specialize=["splits"])
def fod_wgrad_kernel(feats_ptr, grad_ptr, dw_ptr, src_ptr, dst_ptr, pair_offsets_ptr, splits, c_in, c_out,
                     stride_f, stride_g,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    job = tl.program_id(0)
    k = job // splits
    part = job % splits
    first = tl.load(pair_offsets_ptr + k)
    count = tl.load(pair_offsets_ptr + k + 1) - first
    start = first + count * part // splits
    end = first + count * (part + 1) // splits
    in_ch = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    out_ch = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=dw_ptr.dtype.element_ty)
    for p0 in range(start, end, BLOCK_K):
        pairs = p0 + tl.arange(0, BLOCK_K)
        ok = pairs < end
        src = tl.load(src_ptr + pairs, mask=ok, other=-1)
        dst = tl.load(dst_ptr + pairs, mask=ok, other=-1)
        acc = gathered_dot_t(acc, feats_ptr, src, stride_f, in_ch, c_in, grad_ptr, dst, stride_g, out_ch, c_out,
                             PRECISION, UPCAST)
    tl.atomic_add(dw_ptr + k.to(tl.int64) * c_in * c_out + in_ch[:, None] * c_out + out_ch[None, :], acc,
                  mask=(in_ch < c_in)[:, None] & (out_ch < c_out)[None, :], sem="relaxed")


def _launch_options(tile, feats, allow_tf32):
    return dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
                PRECISION=runtime.dot_precision(feats.dtype, allow_tf32), UPCAST=runtime.upcast_dot(feats.dtype),
                num_warps=tile.num_warps, num_stages=tile.num_stages)


def _oriented_weight(weight, transpose_weight):
    """[K, C_src, C_dst], contiguous: W, or W^T per offset for dgrad."""
    return (weight.transpose(1, 2) if transpose_weight else weight).contiguous()


def forward(feats, weight, src_idx, dst_idx, offsets, num_dst, transpose_weight=False, tile=None,
            allow_tf32=False):
    """``out[dst] += feats[src] @ W[k]`` over the pairs of every offset (``W[k]^T`` with
    ``transpose_weight``): one launch, atomic float32 accumulation."""
    runtime.check_operands(feats, weight)
    allow_tf32 = allow_tf32 and runtime.tf32_supported(feats.device)
    feats, w = feats.contiguous(), _oriented_weight(weight, transpose_weight)
    volume, c_src, c_dst = w.shape
    out = torch.zeros(num_dst, c_dst, dtype=runtime.accumulator_dtype(feats.dtype), device=feats.device)
    num_pairs = src_idx.shape[0]
    if num_pairs and c_dst:
        t = choose_tile(tile, num_pairs // volume, c_src, c_dst, runtime.mode(feats.dtype, allow_tf32))
        # At most cdiv(pairs, BLOCK_M) + K tiles; programs past the real count return at once.
        grid = (triton.cdiv(num_pairs, t.block_m) + volume, triton.cdiv(c_dst, t.block_n))
        fod_forward_kernel[grid](feats, w, out, src_idx, dst_idx, offsets, volume, c_src, c_dst,
                                 feats.stride(0), out.stride(0), OFFSETS_P2=triton.next_power_of_2(volume),
                                 **_launch_options(t, feats, allow_tf32))
    return out.to(feats.dtype)


def forward_owned(feats, weight, table, num_dst, transpose_weight=False, tile=None, allow_tf32=False):
    """Deterministic forward: ``out[r] = sum_k feats[table[r, k]] @ W[k]``, offsets in order,
    each output row written by one program."""
    runtime.check_operands(feats, weight)
    allow_tf32 = allow_tf32 and runtime.tf32_supported(feats.device)
    feats, w = feats.contiguous(), _oriented_weight(weight, transpose_weight)
    volume, c_src, c_dst = w.shape
    out = torch.empty(num_dst, c_dst, dtype=feats.dtype, device=feats.device)
    if num_dst and c_dst:
        t = choose_tile(tile, num_dst, c_src, c_dst, runtime.mode(feats.dtype, allow_tf32))
        grid = (triton.cdiv(num_dst, t.block_m), triton.cdiv(c_dst, t.block_n))
        fod_forward_owned_kernel[grid](feats, w, out, table, num_dst, volume, c_src, c_dst, feats.stride(0),
                                       out.stride(0), **_launch_options(t, feats, allow_tf32))
    return out


def wgrad_splits(num_pairs, volume, channel_tiles, deterministic):
    """Chunks per offset: enough programs to fill a large GPU, each still summing >= 256 pairs."""
    if deterministic or num_pairs == 0:
        return 1
    by_work = max(1, num_pairs // (volume * 256))
    by_occupancy = max(1, 1024 // max(1, volume * channel_tiles))
    return int(min(64, by_work, by_occupancy))


def wgrad(feats, grad, src_idx, dst_idx, offsets, tile=None, allow_tf32=False, deterministic=False):
    """``dW[k] = feats[src]^T @ grad[dst]`` over the pairs of offset k, ``[K, C_in, C_out]``."""
    runtime.check_operands(feats, grad)
    allow_tf32 = allow_tf32 and runtime.tf32_supported(feats.device)
    feats, grad = feats.contiguous(), grad.contiguous()
    volume, c_in, c_out = offsets.shape[0] - 1, feats.shape[1], grad.shape[1]
    dw = torch.zeros(volume, c_in, c_out, dtype=runtime.accumulator_dtype(feats.dtype), device=feats.device)
    num_pairs = src_idx.shape[0]
    if num_pairs and c_in and c_out:
        t = choose_wgrad_tile(tile, c_in, c_out, runtime.mode(feats.dtype, allow_tf32))
        grid_c = (triton.cdiv(c_in, t.block_m), triton.cdiv(c_out, t.block_n))
        splits = wgrad_splits(num_pairs, volume, grid_c[0] * grid_c[1], deterministic)
        fod_wgrad_kernel[(volume * splits, *grid_c)](feats, grad, dw, src_idx, dst_idx, offsets, splits, c_in, c_out,
                                                     feats.stride(0), grad.stride(0),
                                                     **_launch_options(t, feats, allow_tf32))
    return dw.to(feats.dtype)
