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
"""
import sys
import types


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"torchsparse_pp.backends.{name} must be a bool, got {value!r}")
    return value


class _Backends(types.ModuleType):
    _deterministic = False
    _allow_tf32 = False

    @property
    def deterministic(self) -> bool:
        return self._deterministic

    @deterministic.setter
    def deterministic(self, value: bool) -> None:
        self._deterministic = _check_bool("deterministic", value)

    @property
    def allow_tf32(self) -> bool:
        return self._allow_tf32

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        self._allow_tf32 = _check_bool("allow_tf32", value)


sys.modules[__name__].__class__ = _Backends
