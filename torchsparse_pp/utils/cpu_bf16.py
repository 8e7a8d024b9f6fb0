"""Whether ATen multiplies bfloat16 matrices at speed on this CPU, and a float32 route for when
it does not.

ATen's CPU bfloat16 GEMMs go to oneDNN only where oneDNN has bfloat16 kernels (AVX-512 BW/VL/DQ
and newer); elsewhere (AVX2 CPUs such as AMD Zen 2 / 3) they fall back to a reference loop at
about 1 GFLOP/s, some 100x below the float32 rate (measured on a Zen 3 VM: 2048^2 bf16 mm
0.9-1.3 GFLOP/s, float32 140-170 GFLOP/s). There the library multiplies bfloat16 operands in
float32 and rounds the product to bfloat16 (what oneDNN does internally: float32 sums).
"""
from typing import Callable

import torch

from .. import backends


def _onednn_bf16() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# Read once at import: compiled graphs then see a constant.
ONEDNN_BF16 = _onednn_bf16()


def bf16_gemm_emulated(t: torch.Tensor) -> bool:
    """True for a CPU bfloat16 tensor on a CPU where ATen's bfloat16 GEMM is the slow reference loop."""
    return t.dtype == torch.bfloat16 and backends.decision_device_type(t.device) == "cpu" and not ONEDNN_BF16


def _to(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _to(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, dtype) for v in value)
    return value


def dense_autocast(fn: Callable, *inputs):
    """``fn(*inputs)`` for dense torch layers (Linear, Conv2d) inside a model: as CPU bfloat16
    autocast runs it, except where ATen's bfloat16 GEMMs and convolutions are emulated (about
    1.5 GFLOP/s for a 3x3 Conv2d there, 100 GFLOP/s in float32): there it runs in float32 with
    autocast off and returns bfloat16 tensors, the dtype autocast would have given."""
    if ONEDNN_BF16 or not torch.is_autocast_enabled("cpu") or torch.get_autocast_dtype("cpu") != torch.bfloat16:
        return fn(*inputs)
    if not all(x.device.type == "cpu" for x in inputs if isinstance(x, torch.Tensor)):
        return fn(*inputs)
    with torch.autocast("cpu", enabled=False):
        out = fn(*_to(inputs, torch.float32))
    return _to(out, torch.bfloat16)


def linear_float32(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """``x @ weight (+ bias)`` computed in float32 (autocast off, which would take it back to
    bfloat16) and returned in x's dtype; differentiable."""
    with torch.autocast(x.device.type, enabled=False):
        out = x.float() @ weight.float()
        if bias is not None:
            out = out + bias.float()
    return out.to(x.dtype)
