"""Device functions shared by the Triton kernels: gathered GEMM steps and offset lookup.

Row indices below 0 mean "no row": the gathered operand row is zero. A zero row times a weight
holding Inf or NaN would be NaN, so a missing neighbour must not meet such a weight in a dot:
the implicit GEMM leaves offsets whose weight is not finite (``nonfinite_rows_kernel`` flags
them on the device) out of its tl.dot loop and adds them in a separate launch through
``gathered_outer`` (rank-1 updates masked per row; masking the dot's accumulator per row would
cost a second accumulator's registers, which spills at the large tiles). The weight gradient
masks both operands per pair, so it never forms such a product. Row offsets are formed in int64,
so tensors past 2^31 elements are addressed correctly.

Conventions of every kernel: atomics are relaxed (sums need no ordering; the default acq_rel puts
a memory barrier before each one); integer arguments that are data-dependent counts (rows, pairs,
plan tiles, chunks) are marked do_not_specialize, so a scan with another voxel count reuses the
compiled kernel instead of compiling a variant for its divisibility by 16.
"""
import triton
import triton.language as tl


@triton.jit
def gathered_dot(acc, feats_ptr, rows, stride_f, c_src, w_ptr, cols, c_dst,
                 BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc[i, :] += feats[rows[i], :] @ w[:, cols] (w is [c_src, c_dst], row-major), in BLOCK_K
    steps over c_src; rows < 0 read zeros."""
    valid = rows >= 0
    row_base = feats_ptr + rows.to(tl.int64) * stride_f
    col_ok = cols < c_dst
    for c0 in range(0, c_src, BLOCK_K):
        c = c0 + tl.arange(0, BLOCK_K)
        c_ok = c < c_src
        a = tl.load(row_base[:, None] + c[None, :], mask=valid[:, None] & c_ok[None, :], other=0.0)
        b = tl.load(w_ptr + c[:, None].to(tl.int64) * c_dst + cols[None, :],
                    mask=c_ok[:, None] & col_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=acc.dtype)
    return acc


@triton.jit
def gathered_outer(acc, feats_ptr, rows, stride_f, c_src, w_ptr, cols, c_dst):
    """What gathered_dot adds, for rows >= 0 only: one rank-1 update per input channel, masked
    per row, so a row without this neighbour adds nothing even where w holds Inf or NaN. Exact
    products in the accumulator's type; for offsets whose weight is not finite."""
    for c in range(0, c_src):
        a = tl.load(feats_ptr + rows.to(tl.int64) * stride_f + c, mask=rows >= 0, other=0.0).to(acc.dtype)
        b = tl.load(w_ptr + c * c_dst + cols, mask=cols < c_dst, other=0.0).to(acc.dtype)
        acc += tl.where((rows >= 0)[:, None], a[:, None] * b[None, :], 0.0)
    return acc


@triton.jit
def nonfinite_rows_kernel(values_ptr, flags_ptr, row_len, BLOCK: tl.constexpr):
    """flags[r] = 1 when row r of a contiguous [rows, row_len] tensor holds Inf or NaN, else 0
    (x - x is 0 exactly for every finite x); one program per row."""
    row = tl.program_id(0)
    base = values_ptr + row.to(tl.int64) * row_len
    found = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, row_len, BLOCK):
        i = start + tl.arange(0, BLOCK)
        x = tl.load(base + i, mask=i < row_len, other=0.0)
        found |= ((x - x) != 0).to(tl.int32)
    tl.store(flags_ptr + row, tl.max(found, 0))


@triton.jit
def gathered_dot_t(acc, feats_ptr, src_rows, stride_f, in_ch, c_in, grad_ptr, dst_rows, stride_g, out_ch, c_out,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc[ci, co] += sum_j feats[src_rows[j], ci] * grad[dst_rows[j], co] over the pairs j
    where both rows exist (the weight-gradient step)."""
    pair_ok = (src_rows >= 0) & (dst_rows >= 0)
    a = tl.load(feats_ptr + src_rows.to(tl.int64)[None, :] * stride_f + in_ch[:, None],
                mask=pair_ok[None, :] & (in_ch < c_in)[:, None], other=0.0)
    g = tl.load(grad_ptr + dst_rows.to(tl.int64)[:, None] * stride_g + out_ch[None, :],
                mask=pair_ok[:, None] & (out_ch < c_out)[None, :], other=0.0)
    if UPCAST:
        a = a.to(tl.float32)
        g = g.to(tl.float32)
    return tl.dot(a, g, acc, input_precision=PRECISION, out_dtype=acc.dtype)


@triton.jit
def owning_tile_segment(pair_offsets_ptr, tile, num_offsets, BLOCK_M: tl.constexpr, OFFSETS_P2: tl.constexpr):
    """``(k, first)``: the offset whose pairs tile ``tile`` covers, when each offset's pairs
    ``[pair_offsets[k], pair_offsets[k + 1])`` are cut into tiles of BLOCK_M, and the index of
    its first tile; k = -1 past the last tile. The K + 1 offsets are read as one vector
    (OFFSETS_P2 >= K, a power of two) and prefix-summed in the program: no tile table is built
    beforehand, so a conv is one launch."""
    k = tl.arange(0, OFFSETS_P2)
    present = k < num_offsets
    begin = tl.load(pair_offsets_ptr + k, mask=present, other=0)
    end = tl.load(pair_offsets_ptr + k + 1, mask=present, other=0)
    tiles = (end - begin + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(tiles, 0)
    starts = ends - tiles
    hit = (tile >= starts) & (tile < ends)
    return tl.max(tl.where(hit, k, -1), 0), tl.max(tl.where(hit, starts, 0), 0)
