"""What follows a conv in an inference layer, ``out = act(out + bias + residual)``, as one launch
in place on the conv's output (three elementwise ops otherwise)."""
import torch
import triton
import triton.language as tl

from . import runtime

runtime.mark_defined()

BLOCK_ROWS = 32
BLOCK_CHANNELS = 64


@triton.jit(do_not_specialize=["rows"])
def bias_residual_act_kernel(out_ptr, bias_ptr, residual_ptr, rows, channels, stride_out, stride_residual,
                             HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, RELU: tl.constexpr,
                             BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (r < rows)[:, None] & (c < channels)[None, :]
    where = out_ptr + r.to(tl.int64)[:, None] * stride_out + c[None, :]
    value = tl.load(where, mask=ok, other=0.0)
    if HAS_BIAS:
        value += tl.load(bias_ptr + c, mask=c < channels, other=0.0)[None, :]
    if HAS_RESIDUAL:
        value += tl.load(residual_ptr + r.to(tl.int64)[:, None] * stride_residual + c[None, :], mask=ok, other=0.0)
    if RELU:
        value = tl.maximum(value, 0.0)
    tl.store(where, value, mask=ok)


def apply_in_place(out: torch.Tensor, bias, residual, relu: bool) -> torch.Tensor:
    """``out`` ([rows, C], contiguous rows) overwritten by ``act(out + bias + residual)``."""
    rows, channels = out.shape
    if rows and channels:
        grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(channels, BLOCK_CHANNELS))
        bias_residual_act_kernel[grid](out, out if bias is None else bias, out if residual is None else residual,
                                       rows, channels, out.stride(0), 0 if residual is None else residual.stride(0),
                                       HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, RELU=relu,
                                       BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_CHANNELS)
    return out
