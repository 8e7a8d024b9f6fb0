"""Where the Triton interpreter's emulation differs from the GPUs the kernels are written for,
made to round as the hardware does, so the interpreter tests check the kernels' GPU semantics.

- float32 -> bfloat16 (``x.to(tl.bfloat16)``, the store of a float32 accumulator into a bf16
  output): Triton lowers it to a round-to-nearest-even conversion (cvt.rn.bf16.f32 on NVIDIA),
  the interpreter (triton 3.x) drops the low 16 bits, i.e. rounds toward zero: twice the error
  of the kernels' real results. Float16 conversions use numpy's, which round to nearest even.
"""
import numpy as np


def round_float32_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest, ties to even; NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded = np.where(nan, ((bits >> 16) | np.uint32(0x0040)).astype(np.uint16), rounded)
    return rounded


def round_bfloat16_to_nearest() -> None:
    """Makes the interpreter's float32 -> bfloat16 casts round to nearest even (idempotent)."""
    from triton import language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "rounds_bf16_to_nearest", False):
        return
    truncating = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(round_float32_to_bfloat16(src.data), tl.bfloat16)
        return truncating(self, src, dst_type)

    cast_impl.rounds_bf16_to_nearest = True
    builder.cast_impl = cast_impl  # create_fp_trunc and the other casts call self.cast_impl
