#!/usr/bin/env bash
# Compile check of the CUDA sources without a GPU (CI runs it; so can anyone with nvcc):
#   1. the generated kernel instantiations are what tools/generate_kernels.py writes now;
#   2. every csrc/cuda/**/*.cu compiles with nvcc for sm_80 and sm_90, with ptxas' resource
#      report (-Xptxas -v);
#   3. tools/ptxas_report.py prints every kernel's registers, static shared memory and spills
#      and fails on any spill, stack frame, or shared memory above the 48 KiB static limit;
#   4. every ATen wrapper (csrc/cuda/**/*.cpp, and ops.cpp) compiles with -DTSPP_WITH_CUDA.
# Nothing here runs a kernel. Objects go to a temporary directory and are thrown away.
#
# Environment: PYTHON (python3), NVCC (nvcc on PATH), CUDA_CHECK_ARCHS ("80 90"), JOBS (nproc),
# CUDA_CHECK_MARKDOWN (also write the resource table there, as docs/gpu.md carries it).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
NVCC=${NVCC:-$(command -v nvcc || true)}
ARCHS=${CUDA_CHECK_ARCHS:-80 90}
JOBS=${JOBS:-$(nproc)}

if [ -z "$NVCC" ]; then
  echo "[cuda-check] nvcc not found: set NVCC or put it on PATH" >&2
  exit 1
fi

echo "[cuda-check] generated kernels are current"
"$PYTHON" tools/generate_kernels.py --check

torch_includes=$("$PYTHON" -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I' + p for p in include_paths()))")
python_include=$("$PYTHON" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
cuda_top=$("$NVCC" -dryrun -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)
cuda_include="$cuda_top/targets/x86_64-linux/include"
[ -d "$cuda_include" ] || cuda_include="$cuda_top/include"

gencode=""
for arch in $ARCHS; do gencode="$gencode -gencode=arch=compute_$arch,code=sm_$arch"; done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# CPU wheels of torch ship c10/cuda headers but not this build-generated one; the shim only
# declares a shared-library build, as CUDA wheels do.
mkdir -p "$out/shim/c10/cuda/impl"
if ! "$PYTHON" -c "import torch.utils.cpp_extension as e, os, sys; sys.exit(not any(os.path.exists(os.path.join(p, 'c10/cuda/impl/cuda_cmake_macros.h')) for p in e.include_paths()))"; then
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$out/shim/c10/cuda/impl/cuda_cmake_macros.h"
fi
torch_includes="$torch_includes -I$out/shim"

mkdir -p "$out/reports"
export NVCC gencode torch_includes python_include cuda_include out
compile_cu() {
  # setup.py's nvcc flags (less -lineinfo, which changes no code); ptxas' report of every kernel goes to <source>.ptxas.
  local name
  name=$(echo "$1" | sed 's|^csrc/cuda/||; s|/generated/|/|' | tr '/' '.')
  # shellcheck disable=SC2086
  "$NVCC" -c -O3 -std=c++17 --expt-relaxed-constexpr -DTSPP_WITH_CUDA $gencode $torch_includes \
    -I"$python_include" -Xcompiler -fPIC -Xptxas -v "$1" -o "$out/$name.o" 2> "$out/reports/$name.ptxas" ||
    { cat "$out/reports/$name.ptxas" >&2; echo "[cuda-check] FAILED: $1" >&2; return 1; }
}
compile_cpp() {
  # shellcheck disable=SC2086
  g++ -fsyntax-only -std=c++20 -fopenmp -DTSPP_WITH_CUDA $torch_includes -I"$python_include" \
    -I"$cuda_include" "$1" || { echo "[cuda-check] FAILED: $1" >&2; return 1; }
}
export -f compile_cu compile_cpp

cu_files=$(find csrc/cuda -name '*.cu' | sort)
cpp_files=$( (find csrc/cuda -name '*.cpp'; echo csrc/ops.cpp) | sort)
echo "[cuda-check] nvcc ($ARCHS): $(echo "$cu_files" | grep -c . ) .cu files, $JOBS jobs"
echo "$cu_files" | grep . | xargs -P "$JOBS" -I{} bash -c 'compile_cu {}'
echo "[cuda-check] ptxas resources (registers / static shared KiB / spill bytes) per kernel and tile"
"$PYTHON" tools/ptxas_report.py "$out"/reports/*.ptxas ${CUDA_CHECK_MARKDOWN:+--markdown "$CUDA_CHECK_MARKDOWN"}
echo "[cuda-check] g++ -DTSPP_WITH_CUDA: $(echo "$cpp_files" | grep -c .) wrapper files"
echo "$cpp_files" | grep . | xargs -P "$JOBS" -I{} bash -c 'compile_cpp {}'
echo "[cuda-check] all CUDA sources compile; no kernel spills"
