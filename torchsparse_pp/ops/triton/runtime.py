"""When and how the Triton kernels can run, and the per-dtype launch constants.

No triton import here: ``require`` is called before any kernel module is imported.
"""
import importlib.util
import os

import torch

from .tiles import mode_of

INTERPRET_VARIABLE = "TRITON_INTERPRET"
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# The interpreter state the kernel modules were defined under (set when the first one loads):
# triton reads the variable when a kernel is defined, so a later change would not take effect.
_defined_interpreted = None


def interpreter_requested() -> bool:
    return os.environ.get(INTERPRET_VARIABLE, "0") not in ("", "0")


def installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def require(device: torch.device) -> None:
    """Raises a clear error when the Triton kernels cannot run on ``device`` in this process."""
    if not installed():
        raise RuntimeError("backend='triton' needs the triton package: pip install 'torchsparse-pp[triton]' "
                           "(or use backend='native')")
    if device.type == "cpu" and not interpreter_requested():
        raise RuntimeError(f"backend='triton' on CPU tensors runs only under the Triton interpreter: set "
                           f"{INTERPRET_VARIABLE}=1 in the environment before torchsparse_pp's Triton kernels "
                           "are first used (or use backend='native' on the CPU)")
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"backend='triton' supports CUDA / ROCm tensors (and CPU tensors under the "
                           f"interpreter), got a tensor on {device}")
    if _defined_interpreted is not None and _defined_interpreted != interpreter_requested():
        raise RuntimeError(f"{INTERPRET_VARIABLE} changed after torchsparse_pp's Triton kernels were defined "
                           f"(they were defined with interpretation {'on' if _defined_interpreted else 'off'}); "
                           "set it before their first use, in a fresh process")
    if device.type == "cuda" and interpreter_requested():
        raise RuntimeError(f"{INTERPRET_VARIABLE}=1 is set, so Triton would interpret the kernels on the "
                           "host instead of running them on the GPU; unset it for CUDA tensors")


def mark_defined() -> bool:
    """Records the interpreter state when a kernel module is imported; returns it."""
    global _defined_interpreted
    if _defined_interpreted is None:
        _defined_interpreted = interpreter_requested()
    return _defined_interpreted


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Products are summed in float32 (float64 for float64 inputs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def tf32_supported(device: torch.device) -> bool:
    """Whether tl.dot can take input_precision='tf32' on ``device``: NVIDIA GPUs from sm_80 on
    (all that Triton supports) and AMD CDNA3 and later; the interpreter accepts it."""
    if device.type != "cuda" or torch.version.hip is None:
        return True
    arch = torch.cuda.get_device_properties(device).gcnArchName
    return arch.startswith(("gfx94", "gfx95"))


def dot_precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    """tl.dot's input_precision: TF32 tensor cores for float32 only when allowed (the callers
    pass allow_tf32 and tf32_supported(device))."""
    return "tf32" if dtype == torch.float32 and allow_tf32 else "ieee"


def mode(dtype: torch.dtype, allow_tf32: bool) -> str:
    """The tile table's compute mode (tiles.MODES) of a call."""
    return mode_of(dtype, dot_precision(dtype, allow_tf32))


def upcast_dot(dtype: torch.dtype) -> bool:
    """Whether dot operands are cast to float32 first: only bfloat16 under the interpreter,
    whose tl.dot returns garbage for bfloat16 operands (triton 3.9); compiled kernels keep
    bfloat16 tensor-core dots."""
    return dtype == torch.bfloat16 and bool(_defined_interpreted)


def check_operands(*tensors: torch.Tensor) -> None:
    """Same device, a supported float dtype, 2-D or 3-D."""
    first = tensors[0]
    if first.dtype not in DTYPES:
        raise TypeError(f"the Triton kernels support {[str(d) for d in DTYPES]}, got {first.dtype}")
    for t in tensors[1:]:
        if t.device != first.device:
            raise ValueError(f"operands on different devices: {first.device} and {t.device}")
        if t.dtype != first.dtype:
            raise TypeError(f"operand dtypes differ: {first.dtype} and {t.dtype}")
