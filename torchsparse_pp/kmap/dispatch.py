"""Which implementation builds a kernel map and its views: the compiled ops, torch_ops or
triton_ops.

``backends.kmap_backend`` is read at every call; a KernelMap keeps the name it was built with
so that its lazily built views come from the same implementation.
"""
from types import ModuleType

import torch

from .. import backends, ops
from ..ops import kmap_torch
from ..ops.triton import runtime as triton_runtime
from . import torch_ops


def kmap_backend_for(device: torch.device) -> str:
    """The backend name for maps of tensors on ``device``: ``backends.kmap_backend``, or when
    that is None, "native" on the CPU, "triton" on CUDA where Triton runs (no host read for
    submanifold and transposed maps, one per strided map), else "torch"."""
    device = torch.device(device)
    name = backends.kmap_backend
    if name is None:
        if backends.decision_device_type(device) == "cpu":
            return "native"
        return "triton" if _triton_runs(device) else "torch"
    if name == "native":
        if device.type == "cuda" and not torch.ops.torchsparse_pp.cuda_built():
            raise RuntimeError("torchsparse_pp.backends.kmap_backend = 'native' needs the CUDA kernels for maps "
                               "of CUDA tensors, but this build of torchsparse_pp has none; set "
                               "backends.kmap_backend to None or 'torch'")
        if device.type not in ("cpu", "cuda"):
            raise RuntimeError(f"torchsparse_pp.backends.kmap_backend = 'native' has no kernels for {device.type} "
                               f"tensors; set backends.kmap_backend to None or 'torch'")
    if name == "triton":
        try:
            triton_runtime.require(device)
        except RuntimeError as error:
            raise RuntimeError(f"torchsparse_pp.backends.kmap_backend = 'triton' cannot build maps of {device.type} "
                               f"tensors here: {error}") from None
    return name


def _triton_runs(device: torch.device) -> bool:
    try:
        triton_runtime.require(device)
    except RuntimeError:
        return False
    return True


def kmap_ops(name: str) -> ModuleType:
    """The module with the kernel-map functions of backend ``name`` (same signatures). "torch"
    and "triton" under torch.compile / export: torch_ops' builders behind custom ops
    (ops/kmap_torch.py), one graph node each with unbacked sizes, rather than a trace through
    their sorts, checks and kernel launches."""
    if name == "native":
        return ops
    if name in ("torch", "triton") and torch.compiler.is_compiling():
        return kmap_torch
    if name == "torch":
        return torch_ops
    if name == "triton":
        from . import triton_ops  # imports no triton: its kernels load at first use
        return triton_ops
    raise ValueError(f"unknown kernel-map backend {name!r}; expected 'native', 'torch' or 'triton'")
