"""gather_scatter in Triton: Triton gathers and scatter-adds around torch GEMMs (cuBLAS / rocBLAS).

Per offset (or per adaptive group of offsets, the same grouping as the native ops): gather the
source rows into a contiguous buffer, one torch.mm (one torch.bmm per padded group), scatter-add
the products into a float32 (float64) accumulator by destination row. Within one offset each
destination appears at most once, so the scatters need no atomics: launches run in offset order,
which makes the dataflow deterministic by construction, as the native one. Offsets that map every
row j to row j multiply the features as they are. The weight gradient gathers features and
gradients per offset and runs one torch.mm each.

The loop over offsets runs on the host: ``offsets`` and ``identity`` are best given as the host
(CPU) copies a KernelMap keeps beside each pair view (``OrientedMap.host_counts``), which the conv
path passes, so that a call reads nothing back from the device; device tensors are copied back
(one synchronisation).
"""
from typing import List, Sequence, Tuple

import torch
import triton
import triton.language as tl

from . import runtime

runtime.mark_defined()

BLOCK_ROWS = 32
BLOCK_CHANNELS = 64


@triton.jit(do_not_specialize=["count", "rows_out"])
def gather_rows_kernel(src_ptr, idx_ptr, out_ptr, count, rows_out, channels, stride_src, stride_out,
                       BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[i] = src[idx[i]] for i < count, zeros for count <= i < rows_out (group padding)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = (c < channels)[None, :]
    idx = tl.load(idx_ptr + r, mask=r < count, other=-1)
    values = tl.load(src_ptr + idx.to(tl.int64)[:, None] * stride_src + c[None, :], mask=(idx >= 0)[:, None] & c_ok,
                     other=0.0)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * stride_out + c[None, :], values, mask=(r < rows_out)[:, None] & c_ok)


@triton.jit(do_not_specialize=["count"])
def scatter_add_rows_kernel(values_ptr, idx_ptr, out_ptr, count, channels, stride_values, stride_out,
                            BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[idx[i]] += values[i] for i < count; the indices of one launch are distinct."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (r < count)[:, None] & (c < channels)[None, :]
    idx = tl.load(idx_ptr + r, mask=r < count, other=0)
    values = tl.load(values_ptr + r.to(tl.int64)[:, None] * stride_values + c[None, :], mask=ok, other=0.0)
    target = out_ptr + idx.to(tl.int64)[:, None] * stride_out + c[None, :]
    tl.store(target, tl.load(target, mask=ok, other=0.0) + values.to(out_ptr.dtype.element_ty), mask=ok)


def gather_rows(src: torch.Tensor, idx: torch.Tensor, rows_out: int, out: torch.Tensor = None) -> torch.Tensor:
    """``src[idx]`` as ``[rows_out, C]``, zero rows past ``len(idx)``."""
    channels = src.shape[1]
    if out is None:
        out = torch.empty(rows_out, channels, dtype=src.dtype, device=src.device)
    if rows_out and channels:
        grid = (triton.cdiv(rows_out, BLOCK_ROWS), triton.cdiv(channels, BLOCK_CHANNELS))
        gather_rows_kernel[grid](src, idx, out, idx.shape[0], rows_out, channels, src.stride(0), out.stride(0),
                                 BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_CHANNELS)
    return out


def scatter_add_rows(values: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> None:
    """``out[idx[i]] += values[i]``; ``idx`` must not repeat."""
    count, channels = idx.shape[0], values.shape[1]
    if count and channels:
        grid = (triton.cdiv(count, BLOCK_ROWS), triton.cdiv(channels, BLOCK_CHANNELS))
        scatter_add_rows_kernel[grid](values, idx, out, count, channels, values.stride(0), out.stride(0),
                                      BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_CHANNELS)


def offset_groups(offsets: Sequence[int], identity: Sequence[bool], epsilon: float,
                  mm_thresh: int) -> List[Tuple[List[int], int]]:
    """(members, rows) per GEMM, the native ops' adaptive grouping (csrc/common/offset_groups.h):
    offsets (largest first) under mm_thresh pairs join the open group while padding them to its
    row count wastes at most epsilon of it; identity and empty offsets are left out."""
    counts = [offsets[k + 1] - offsets[k] for k in range(len(identity))]
    order = sorted((k for k in range(len(identity)) if not identity[k] and counts[k] > 0), key=lambda k: -counts[k])
    groups: List[Tuple[List[int], int]] = []
    open_group = False
    for k in order:
        n = counts[k]
        batchable = epsilon > 0 and n < mm_thresh
        if open_group and batchable and groups[-1][1] - n <= epsilon * groups[-1][1]:
            groups[-1][0].append(k)
            continue
        groups.append(([k], n))
        open_group = batchable
    return groups


def _host_pairs(offsets: torch.Tensor, identity: torch.Tensor):
    """Offsets and identity flags as Python lists: free for host tensors, one read for device ones."""
    host = torch.cat([offsets.cpu(), identity.cpu().to(offsets.dtype)]).tolist()
    volume = identity.shape[0]
    return host[:volume + 1], [bool(v) for v in host[volume + 1:]]


def forward(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, transpose_weight=False, epsilon=0.0,
            mm_thresh=0):
    """``out[dst] += feats[src] @ W[k]`` per offset (``W[k]^T`` with ``transpose_weight``)."""
    runtime.check_operands(feats, weight)
    feats = feats.contiguous()
    w = (weight.transpose(1, 2) if transpose_weight else weight).contiguous()
    c_src, c_dst = w.shape[1], w.shape[2]
    off, ident = _host_pairs(offsets, identity)
    out = torch.zeros(num_dst, c_dst, dtype=runtime.accumulator_dtype(feats.dtype), device=feats.device)
    for k, is_identity in enumerate(ident):
        if is_identity and off[k + 1] > off[k]:
            out += feats @ w[k]
    groups = offset_groups(off, ident, epsilon, mm_thresh)
    largest = max((rows * len(members) for members, rows in groups), default=0)
    gathered = torch.empty(largest, c_src, dtype=feats.dtype, device=feats.device)
    products = torch.empty(largest, c_dst, dtype=feats.dtype, device=feats.device)
    for members, rows in groups:
        for j, k in enumerate(members):
            gather_rows(feats, src_idx[off[k]:off[k + 1]], rows, gathered[j * rows:(j + 1) * rows])
        if len(members) == 1:
            torch.mm(gathered[:rows], w[members[0]], out=products[:rows])
        else:
            # Stacked on the device: an index tensor would need a host-to-device copy, which
            # synchronises and cannot be captured in a CUDA graph.
            torch.bmm(gathered[:rows * len(members)].view(len(members), rows, c_src),
                      torch.stack([w[k] for k in members]),
                      out=products[:rows * len(members)].view(len(members), rows, c_dst))
        for j, k in enumerate(members):
            scatter_add_rows(products[j * rows:(j + 1) * rows], dst_idx[off[k]:off[k + 1]], out)
    return out.to(feats.dtype)


def wgrad(feats, grad, src_idx, dst_idx, offsets, identity):
    """``dW[k] = feats[src]^T @ grad[dst]`` per offset, ``[K, C_in, C_out]``."""
    runtime.check_operands(feats, grad)
    feats, grad = feats.contiguous(), grad.contiguous()
    off, ident = _host_pairs(offsets, identity)
    dw = torch.zeros(len(ident), feats.shape[1], grad.shape[1], dtype=feats.dtype, device=feats.device)
    largest = max((off[k + 1] - off[k] for k in range(len(ident)) if not ident[k]), default=0)
    gathered_src = torch.empty(largest, feats.shape[1], dtype=feats.dtype, device=feats.device)
    gathered_dst = torch.empty(largest, grad.shape[1], dtype=grad.dtype, device=grad.device)
    for k, is_identity in enumerate(ident):
        n = off[k + 1] - off[k]
        if n == 0:
            continue
        if is_identity:
            torch.mm(feats.t(), grad, out=dw[k])
            continue
        gather_rows(feats, src_idx[off[k]:off[k + 1]], n, gathered_src[:n])
        gather_rows(grad, dst_idx[off[k]:off[k + 1]], n, gathered_dst[:n])
        torch.mm(gathered_src[:n].t(), gathered_dst[:n], out=dw[k])
    return dw
