"""Triton kernels of the three dataflows, one module per dataflow (mirroring csrc/cuda), and of
kernel-map building (kmap).

Importing this package does not import triton: ``load(name)`` imports a kernel module on first
use, after ``runtime.require`` has checked that triton can run on the tensors' device (on CPU
tensors only under the Triton interpreter, ``TRITON_INTERPRET=1``).
"""
import importlib

KERNEL_MODULES = ("fetch_on_demand", "implicit_gemm", "gather_scatter", "kmap", "epilogue")


def load(name: str):
    """The kernel module ``name`` (one of KERNEL_MODULES), imported on first use."""
    if name not in KERNEL_MODULES:
        raise ValueError(f"unknown Triton kernel module {name!r}; expected one of {KERNEL_MODULES}")
    return importlib.import_module(f"{__name__}.{name}")


# The kernels' entry points as torch.library custom ops (torch.compile / export see one node per
# launch); defining them imports no triton.
from . import library  # noqa: E402,F401
