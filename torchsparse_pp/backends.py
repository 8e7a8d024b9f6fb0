"""Library-wide switches, read at every call (set them any time).

``deterministic`` (default False): every CPU dataflow gives bit-identical results across runs
and OpenMP thread counts, in forward and backward. fetch_on_demand and implicit_gemm are built
that way (fixed tiles, fixed-order partial sums) and cost nothing extra; gather_scatter then
replaces its multi-threaded ATen GEMMs by fixed single-threaded tiles and its weight gradient
by fixed-order chunk sums (see docs/benchmarks.md for what that costs).
"""
import sys
import types


class _Backends(types.ModuleType):
    _deterministic = False

    @property
    def deterministic(self) -> bool:
        return self._deterministic

    @deterministic.setter
    def deterministic(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"torchsparse_pp.backends.deterministic must be a bool, got {value!r}")
        self._deterministic = value


sys.modules[__name__].__class__ = _Backends
