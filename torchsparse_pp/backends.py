"""Library-wide switches, read at every call (set them any time).

``deterministic`` (default False): every CPU dataflow gives bit-identical results across runs
and OpenMP thread counts, in forward and backward. fetch_on_demand and implicit_gemm are built
that way (fixed tiles, fixed-order partial sums) and cost nothing extra; gather_scatter then
replaces its multi-threaded ATen GEMMs by fixed single-threaded tiles and its weight gradient
by fixed-order chunk sums (see docs/benchmarks.md for what that costs).

``allow_tf32`` (default False): CUDA implicit GEMM may run float32 convolutions on TF32 tensor
cores (10-bit mantissa products, float32 sums; relative error near 3e-4). When False, float32
runs exact SIMT kernels. CPU kernels are exact either way. gather_scatter's GEMMs go through
ATen and follow ``torch.backends.cuda.matmul.allow_tf32`` instead.

``kmap_backend`` (default None): who builds kernel maps and their views (pairs, transposed
table, implicit-GEMM plans). "native": the compiled ops (csrc/cpu, csrc/cuda); "torch": the
same maps in plain torch tensor ops (torchsparse_pp.kmap.torch_ops), which run on any device;
"triton": Triton kernels (torchsparse_pp.kmap.triton_ops) that read no device data on the host
except the size of a new coordinate set (CUDA / ROCm tensors, or CPU tensors under
TRITON_INTERPRET=1); None picks per device: "native" on the CPU, "triton" on GPUs where Triton
runs (else "torch"; the native CUDA map builders have not yet run on a GPU). All give identical
maps. A map remembers the backend that built it, and its views use the same one.

``validate_plans`` (default False): the GPU kernels trust the index structures they follow (pair
lists, tables, implicit-GEMM plans), which the library validates once, on the device, when a map
builds and caches each view (torchsparse_pp.ops.validate); a conv call then only launches
kernels, with no host copy or synchronisation (so it can be captured in a CUDA graph). True makes
the op wrappers in torchsparse_pp.ops (the native dataflow ops, direct calls and conv calls alike)
validate their index arguments before every call: one synchronisation per call, for tests and
debugging. The CPU ops check their arguments on every call either way.

``native_batch_norm`` (default True): BatchNorm on CPU float32 / float64 features (eager or compiled,
with the ReLU and residual add the model blocks pass it) runs the library's kernels, one sweep
per pass (torchsparse_pp.nn.functional.norm.batch_norm_act). False runs ATen's batch_norm, the
add and the ReLU instead: for a double backward (gradient penalties), which the kernels do not
support (they raise), or to compare.

``cpu_kernels`` (default: the best this CPU has): the instruction set of the CPU register kernels
that fetch_on_demand and implicit GEMM run (rows read straight from the source rows, sums kept in
registers): "avx512" (AVX-512 F/BW/VL; bfloat16 on the AVX512-BF16 dot product where present),
"avx2" (AVX2 + FMA, for CPUs without AVX-512; bfloat16 rows are widened to float) or "none"
(float tiles through ATen's micro-kernel; bfloat16 keeps the AVX512-BF16 dot-product tiles where
present, unless TSPP_DISABLE_AVX512_KERNELS=1). Assigning an instruction set this CPU lacks raises;
``available_cpu_kernels()`` lists the values this CPU accepts.
float32 forward and dgrad results are bit-identical between "avx512" and "avx2" (so is the
weight gradient where both run register kernels; AVX2 leaves weights wider than 32 x 32 to the
float tiles, which are faster there). The environment variables
TSPP_DISABLE_AVX512_KERNELS=1 and TSPP_DISABLE_PAIR_KERNEL=1 set the start value to "avx2" /
"none".

``device_policy("cuda")`` (a context manager): CPU tensors take every decision CUDA tensors take
(default dataflows and backends, the kernel-map builder and its view validation, which kernels
run: Triton, under ``TRITON_INTERPRET=1``) instead of the CPU's. Nothing runs faster; it lets a
machine without a GPU run, test and count (torchsparse_pp.utils.gpu_cost) the CUDA path's work.
``decision_device_type(device)`` is the device type the library decides for.
"""
import contextlib
import sys
import types

import torch


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"torchsparse_pp.backends.{name} must be a bool, got {value!r}")
    return value


KMAP_BACKENDS = ("native", "torch", "triton")


def _check_kmap_backend(value):
    if value is not None and (not isinstance(value, str) or value not in KMAP_BACKENDS):
        raise ValueError(f"torchsparse_pp.backends.kmap_backend must be None, 'native', 'torch' or 'triton', "
                         f"got {value!r}")
    return value


def _switch(name: str, default, check) -> property:
    """A module attribute read as is and assigned through ``check(value)`` (raises on a bad value)."""
    attr = f"_{name}"

    def read(self):
        return getattr(self, attr, default)

    def assign(self, value) -> None:
        setattr(self, attr, check(value))
    return property(read, assign)


def _bool_switch(name: str, default: bool) -> property:
    return _switch(name, default, lambda value: _check_bool(name, value))


CPU_KERNELS = ("avx512", "avx2", "none")


def _cpu_kernels() -> property:
    """The C++ kernels' own setting (ops.cpu_register_isa / cpu_set_register_isa), checked here and
    mirrored in Python, so that compiled graphs read a plain attribute."""

    def read(self) -> str:
        value = getattr(self, "_cpu_kernels_choice", None)
        if value is None:
            from . import ops
            value = self._cpu_kernels_choice = ops.cpu_register_isa()
        return value

    def assign(self, value) -> None:
        if not isinstance(value, str) or value not in CPU_KERNELS:
            raise ValueError(f"torchsparse_pp.backends.cpu_kernels must be one of {CPU_KERNELS}, got {value!r}")
        from . import ops
        try:
            ops.cpu_set_register_isa(value)
        except RuntimeError as e:
            raise ValueError(str(e).splitlines()[0]) from None
        self._cpu_kernels_choice = value
    return property(read, assign)


def available_cpu_kernels() -> tuple:
    """The ``cpu_kernels`` values this CPU accepts, best first (each tried through the switch,
    which is left as it was)."""
    from . import ops
    start, found = ops.cpu_register_isa(), []
    for isa in CPU_KERNELS:
        try:
            ops.cpu_set_register_isa(isa)
        except RuntimeError:
            continue
        found.append(isa)
    ops.cpu_set_register_isa(start)
    return tuple(found)


DEVICE_POLICIES = ("cuda",)
_device_policy = None


@contextlib.contextmanager
def device_policy(device_type: str):
    """Within the block, CPU tensors take the decisions of ``device_type`` tensors (see above)."""
    global _device_policy
    if device_type not in DEVICE_POLICIES:
        raise ValueError(f"device_policy takes one of {DEVICE_POLICIES}, got {device_type!r}")
    outer, _device_policy = _device_policy, device_type
    try:
        yield
    finally:
        _device_policy = outer


def decision_device_type(device) -> str:
    """The device type whose decisions tensors on ``device`` take: the device_policy's for CPU
    tensors inside one, else the device's own."""
    kind = torch.device(device).type
    if kind == "cpu" and _device_policy is not None:
        return _device_policy
    return kind


class _Backends(types.ModuleType):
    deterministic = _bool_switch("deterministic", False)
    allow_tf32 = _bool_switch("allow_tf32", False)
    kmap_backend = _switch("kmap_backend", None, _check_kmap_backend)
    validate_plans = _bool_switch("validate_plans", False)
    native_batch_norm = _bool_switch("native_batch_norm", True)
    cpu_kernels = _cpu_kernels()


sys.modules[__name__].__class__ = _Backends
