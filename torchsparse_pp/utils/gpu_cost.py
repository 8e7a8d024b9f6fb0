"""Counts what a piece of work would cost a GPU: device ops, kernel launches and host syncs.

On a GPU each eager op is a launch of some microseconds and each read of a device value on the
host (``.item()``, ``.tolist()``, ``.cpu()``, a size that depends on the data) stalls the host
until the device has caught up. Under ``backends.device_policy("cuda")`` CPU tensors take the
CUDA path's decisions, so counting its ops on the CPU counts what the GPU would pay:

    with backends.device_policy("cuda"), count_gpu_cost() as cost:
        model(x)
    print(cost.device_ops, cost.host_syncs, cost.syncs)

- ``device_ops``: ATen ops that are not views (what the dispatcher runs: each is at least one
  launch on a GPU) plus Triton launches; ops inside the library's Triton custom ops count too;
- ``allocations``: ``empty`` and its kin, apart: they launch nothing (the caching allocator
  hands out memory on the host);
- ``launches``: the Triton launches alone (``kernel[grid](...)``); what a kernel does inside
  (under the interpreter: numpy) is not counted;
- ``host_syncs``: ``.item()`` and every scalar read (``int(t)``, ``bool(t)``), ``.tolist()``,
  ``.cpu()`` / ``.numpy()`` of a device tensor, ops whose output size depends on the data
  (``nonzero``, ``unique``, ``masked_select``, indexing with a boolean mask, ``repeat_interleave``
  without ``output_size``), ``torch.equal`` and ``torch.cuda.synchronize``.

Host copies that the library keeps on purpose are made by ``torchsparse_pp.host.to_host`` (one
sync, counted) and are host tensors from then on: reading them again is free, as on a GPU. Tensors made from Python
values (``torch.tensor([...])``) count as one op (a host-to-device copy), not a sync.
"""
import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch._library.custom_ops import _maybe_get_opdef
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..host import is_host

aten = torch.ops.aten

# Ops whose output size is read from the data (the host waits for the device).
_DATA_SIZED = {aten.nonzero.default, aten._unique2.default, aten.unique_dim.default,
               aten.unique_consecutive.default, aten._unique.default, aten.masked_select.default,
               aten.equal.default, aten.is_nonzero.default, aten._local_scalar_dense.default}
# Ops that only describe or re-wrap a tensor (no kernel runs).
_FREE = {aten.detach.default, aten.alias.default, aten.lift_fresh.default, aten.sym_size.int,
         aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default,
         aten.is_same_size.default, aten.is_contiguous.default, aten.set_.source_Storage_storage_offset}

# Uninitialised allocations: the caching allocator hands out memory on the host, nothing launches.
_ALLOCATIONS = {aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
                aten.new_empty_strided.default, aten.empty_like.default}


@dataclass
class GpuCost:
    device_ops: int = 0
    launches: int = 0
    host_syncs: int = 0
    allocations: int = 0
    ops: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)

    def op(self, name: str) -> None:
        self.device_ops += 1
        self.ops[name] += 1

    def sync(self, name: str) -> None:
        self.host_syncs += 1
        self.syncs[name] += 1

    def __str__(self) -> str:
        return (f"{self.device_ops} device ops ({self.launches} Triton launches), {self.host_syncs} host syncs, "
                f"{self.allocations} allocations"
                + (f" ({dict(self.syncs)})" if self.syncs else ""))


def _bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices if i is not None)


def _wrapper(func) -> bool:
    """The library's Triton ops: custom ops whose body is Python around kernel launches."""
    return (func.namespace == "torchsparse_pp" and func.overloadpacket.__name__.startswith("triton_")
            and _maybe_get_opdef(func.name()) is not None)


class _Counting(TorchDispatchMode):
    def __init__(self, cost: GpuCost):
        super().__init__()
        self.cost = cost

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if func in _DATA_SIZED:
            self.cost.sync(name)
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) and _bool_index(args[1]):
            self.cost.sync(f"{name}[bool]")
        elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self.cost.sync(name)
        if _wrapper(func):
            # Python around launches: run it with the mode on, so that the ops inside count.
            with self:
                return _maybe_get_opdef(func.name())._init_fn(*args, **kwargs)
        if func in _ALLOCATIONS:
            self.cost.allocations += 1
        elif not (func in _FREE or func.is_view or func is aten._local_scalar_dense.default):
            self.cost.op(name)
        return func(*args, **kwargs)


def _device_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and not is_host(t) and t.device.type != "meta"


@contextlib.contextmanager
def _patched(obj, name: str, wrap):
    original = getattr(obj, name)
    setattr(obj, name, wrap(original))
    try:
        yield
    finally:
        setattr(obj, name, original)


def _reads(cost: GpuCost, what: str):
    """Wraps a Tensor method that copies a device tensor's values to the host."""
    def wrap(original):
        def read(self, *args, **kwargs):
            if _device_tensor(self):
                cost.sync(what)
            with _disable_current_modes():
                return original(self, *args, **kwargs)
        return read
    return wrap


def _launches(cost: GpuCost):
    """Wraps a Triton kernel's run: one device op, nothing of what runs inside counted."""
    def wrap(original):
        def run(self, *args, **kwargs):
            if not kwargs.get("warmup", False):
                cost.launches += 1
                cost.op(f"triton:{getattr(self, '__name__', type(self).__name__)}")
            with _disable_current_modes():
                return original(self, *args, **kwargs)
        return run
    return wrap


def _from_python(cost: GpuCost):
    """torch.tensor(values): one op (a host-to-device copy on a GPU), not seen by the dispatcher."""
    def wrap(original):
        def tensor(*args, **kwargs):
            cost.op("torch.tensor")
            with _disable_current_modes():
                return original(*args, **kwargs)
        return tensor
    return wrap


def _synchronize(cost: GpuCost):
    def wrap(original):
        def synchronize(*args, **kwargs):
            cost.sync("torch.cuda.synchronize")
            return original(*args, **kwargs) if torch.cuda.is_available() else None
        return synchronize
    return wrap


def _triton_classes():
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return ()
    return (InterpretedFunction, JITFunction)


@contextlib.contextmanager
def count_gpu_cost():
    """Counts, in the block, what the work would cost a GPU (see the module docstring)."""
    cost = GpuCost()
    with contextlib.ExitStack() as stack:
        for method in ("tolist", "cpu", "numpy"):
            stack.enter_context(_patched(torch.Tensor, method, _reads(cost, f".{method}")))
        stack.enter_context(_patched(torch.cuda, "synchronize", _synchronize(cost)))
        stack.enter_context(_patched(torch, "tensor", _from_python(cost)))
        for cls in _triton_classes():
            stack.enter_context(_patched(cls, "run", _launches(cost)))
        stack.enter_context(_Counting(cost))
        yield cost
