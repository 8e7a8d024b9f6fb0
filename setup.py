"""Builds torchsparse_pp._C from csrc/: the CPU kernels always, the native CUDA kernels when asked.

By default only the CPU extension is built (a minute or two), and GPUs run the Triton backend,
which needs no compiled CUDA code. TSPP_BUILD_CUDA=1 (or FORCE_CUDA=1) also compiles the CUDA
sources (csrc/cuda: kernels in .cu files, their ATen wrappers in .cpp files; tens of minutes) and
fails clearly without a CUDA build of torch and nvcc. Architectures default to
8.0, 8.6, 8.9 and 9.0; TORCH_CUDA_ARCH_LIST overrides them (e.g. "9.0" for a faster H100-only build).
Metadata lives in pyproject.toml; this file only describes the extension.
"""
import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

import torch

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CUDA_ARCHS = "8.0;8.6;8.9;9.0"


def _sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def _build_cuda():
    asked = os.environ.get("TSPP_BUILD_CUDA", "0") == "1" or os.environ.get("FORCE_CUDA", "0") == "1"
    if os.environ.get("TSPP_CPU_ONLY", "0") == "1":
        if asked:
            raise RuntimeError("TSPP_BUILD_CUDA=1 (or FORCE_CUDA=1) and TSPP_CPU_ONLY=1 contradict each other; "
                               "set one")
        return False
    if asked and (torch.version.cuda is None or CUDA_HOME is None):
        raise RuntimeError(f"TSPP_BUILD_CUDA=1 needs a CUDA build of torch (found {torch.__version__}) and nvcc "
                           f"(CUDA_HOME: {CUDA_HOME})")
    return asked


def _extension():
    cpp_sources = _sources("csrc/*.cpp") + _sources("csrc/cpu/**/*.cpp")
    # No implicit fused multiply-adds: GCC contracts a*b + c*d + e one way in a vectorised loop and
    # another in its scalar fallback, and which of the two runs can hang on where the heap put
    # a buffer (runtime alias / alignment checks), so results changed bits from run to run
    # (BatchNorm's backward on 8 channels). Kernels that want FMAs write them as intrinsics.
    cxx_flags = ["-O3", "-fopenmp", "-ffp-contract=off"]
    link_flags = ["-fopenmp"]
    if _build_cuda():
        # cpp_extension reads the architectures from this variable.
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)
        cuda_sources = _sources("csrc/cuda/**/*.cu") + _sources("csrc/cuda/**/*.cpp")
        nvcc_flags = ["-O3", "-DTSPP_WITH_CUDA", "--expt-relaxed-constexpr", "-lineinfo"]
        return CUDAExtension(
            "torchsparse_pp._C",
            cpp_sources + cuda_sources,
            extra_compile_args={"cxx": cxx_flags + ["-DTSPP_WITH_CUDA"], "nvcc": nvcc_flags},
            extra_link_args=link_flags,
        )
    return CppExtension("torchsparse_pp._C", cpp_sources, extra_compile_args={"cxx": cxx_flags},
                        extra_link_args=link_flags)


setup(
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
