"""Device functions shared by the Triton kernels: gathered GEMM steps and offset lookup.

Row indices below 0 mean "no row": the gathered operand row is zero. As in every implicit GEMM
(the native kernels and spconv's alike), a weight holding Inf or NaN then gives NaN in rows
that lack that neighbour; masking the accumulator per row instead costs a second accumulator's
registers (spills at large tiles) and does not compile for tf32 on sm_100 (triton 3.9).
Row offsets are formed in int64, so tensors past 2^31 elements are addressed correctly.
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
def owning_segment(starts_ptr, item, num_segments):
    """The segment s with starts[s] <= item < starts[s + 1] (starts is non-decreasing, has
    num_segments + 1 entries and item < starts[num_segments]); empty segments are skipped."""
    lo = 0
    hi = num_segments
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tl.load(starts_ptr + mid) <= item:
            lo = mid
        else:
            hi = mid
    return lo
