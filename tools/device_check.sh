#!/usr/bin/env bash
# One run on a GPU machine, from a copy of the repository: versions and nvidia-smi, the
# CUDA build (timed; if it fails, a CPU-only build so the Triton backend and the torch-ops maps
# still get verified), the GPU tests (both backends), the spconv peer (when .peers travelled
# along), the GPU benchmark, then a short summary as the last lines of output.
#
#   usage:        bash tools/device_check.sh [options]   (from a copy of the repository; put
#                 .peers/ beside the sources to time spconv)
#   options:      --all-tests   also run the rest of the suite (-m "not cuda") with the time left
#                 --skip-build  reuse an existing build when it imports and has CUDA (warm machine)
#                 --no-tests    skip the CUDA tests        --no-bench   skip the benchmark
#                 --quick       benchmarks/conv_gpu.py --quick
#   environment:  OUT (default build/device_out), PYTHON (python3), CHECK_BUDGET (whole run, s,
#                 default 540), BUILD_TIMEOUT (360), TESTS_TIMEOUT (300), BENCH_ARGS (extra args)
#
# Files written under $OUT, flat: env.log build.log tests.log bench.log conv_gpu.json conv_gpu.png
# summary.txt, tests_rest.log with --all-tests, build_cpu.log when the CUDA build failed.
# .peers holds spconv-cu126 2.3.8 packed by gpu_peers.sh (docs/gpu.md; the GPU machine has no network).
set -uo pipefail  # no -e: every step runs under its own timeout and reports its own status
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1

cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/build/device_out}
PYTHON=${PYTHON:-python3}
BUDGET=${CHECK_BUDGET:-540}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-360}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-300}
ALL_TESTS=0 SKIP_BUILD=0 RUN_TESTS=1 RUN_BENCH=1 QUICK=""
for arg in "$@"; do
  case "$arg" in
    --all-tests) ALL_TESTS=1 ;;
    --skip-build) SKIP_BUILD=1 ;;
    --no-tests) RUN_TESTS=0 ;;
    --no-bench) RUN_BENCH=0 ;;
    --quick) QUICK="--quick" ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "device_check.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
START=$SECONDS
SUMMARY=()

elapsed() { echo $((SECONDS - START)); }
# Seconds a step may take: its own cap, but never past the run's budget less a reserve.
step_limit() {
  local cap=$1 reserve=${2:-15} left
  left=$((BUDGET - $(elapsed) - reserve))
  if [ "$left" -lt "$cap" ]; then echo "$left"; else echo "$cap"; fi
}
note() { SUMMARY+=("$*"); }
banner() { echo; echo "==== [$(elapsed) s] $*"; }
# Human-readable outcome of a command run under `timeout`.
outcome() {
  case "$1" in
    0) echo "ok" ;;
    124|137) echo "TIMED OUT" ;;
    *) echo "FAILED (exit $1)" ;;
  esac
}

# --- versions -----------------------------------------------------------------------------------
banner "machine and versions"
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "host: $(uname -srm), $(nproc) cpus, $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB"}')"
  if [ -d .git ] && command -v git >/dev/null; then
    echo "git: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) modified"
  else
    echo "git: no .git in this copy"
  fi
  timeout 30 nvidia-smi || echo "nvidia-smi failed"
  timeout 30 nvidia-smi --query-gpu=name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
    --format=csv || true
  echo "nvcc: $(command -v nvcc || echo none) $(nvcc --version 2>/dev/null | tail -n 2 | tr '\n' ' ')"
  echo "gcc: $(gcc --version 2>/dev/null | head -n 1)"
  timeout 120 "$PYTHON" - <<'EOF'
import importlib, platform, sys
import torch
print(f"python {platform.python_version()} at {sys.executable}")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available {torch.cuda.is_available()}, "
      f"arch list {torch.cuda.get_arch_list() if torch.cuda.is_available() else None}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device {p.name}, capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
          f"{p.total_memory / 2**30:.1f} GiB, L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB")
from torch.utils.cpp_extension import CUDA_HOME
print(f"CUDA_HOME {CUDA_HOME}")
for name in ("setuptools", "ninja", "pybind11", "triton", "numpy", "pytest", "hypothesis", "matplotlib", "tqdm"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except Exception as exc:
        print(f"{name}: not importable ({type(exc).__name__})")
EOF
} 2>&1 | tee "$OUT/env.log"
DEVICE=$(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
TORCH=$(timeout 60 "$PYTHON" -c "import torch; print(torch.__version__, 'CUDA', torch.version.cuda)" 2>/dev/null)
note "device: ${DEVICE:-unknown}; torch ${TORCH:-not importable}"

# --- build --------------------------------------------------------------------------------------
cuda_build_ok() {
  timeout 120 "$PYTHON" -c "import torch, torchsparse_pp; assert torch.ops.torchsparse_pp.cuda_built(); \
print('torchsparse_pp', torchsparse_pp.__version__, 'with CUDA, from', torchsparse_pp.__file__)" 2>&1
}
BUILD_OK=0
if [ "$SKIP_BUILD" = 1 ] && cuda_build_ok; then
  BUILD_OK=1
  note "build: skipped (--skip-build; the existing CUDA build imports)"
else
  limit=$(step_limit "$BUILD_TIMEOUT" 60)
  banner "build: FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 pip install -e . (limit ${limit} s, log build.log)"
  t0=$SECONDS
  FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 timeout "$limit" \
    "$PYTHON" -m pip install -v -e . --no-build-isolation --no-deps --no-index > "$OUT/build.log" 2>&1
  rc=$?
  took=$((SECONDS - t0))
  echo "pip exit $rc after $took s" | tee -a "$OUT/build.log"
  if [ "$rc" = 0 ] && check=$(cuda_build_ok); then
    BUILD_OK=1
    echo "$check"
    note "build: ok in $took s ($(find csrc/cuda -name '*.cu' 2>/dev/null | wc -l) .cu sources); $check"
  else
    note "build: $(outcome "$rc") after $took s$( [ "$rc" = 0 ] && echo ', but torchsparse_pp has no CUDA build:' ) ${check:-}"
    echo "---- build.log, errors (first 25) ----"
    grep -n -E "error|Error|FAILED" "$OUT/build.log" | head -n 25
    echo "---- build.log, last 30 lines ----"
    tail -n 30 "$OUT/build.log"
    while IFS= read -r line; do note "  $line"; done < <(grep -E "error" "$OUT/build.log" | head -n 8 | cut -c1-220)
  fi
fi
# Without the native CUDA kernels the Triton backend still runs on the GPU: build the CPU
# extension (maps' CPU references, the library itself) and verify Triton and the torch-ops maps.
NATIVE_OK=$BUILD_OK
if [ "$BUILD_OK" = 0 ]; then
  limit=$(step_limit 240 60)
  banner "fallback build: TSPP_CPU_ONLY=1 pip install -e . (limit ${limit} s, log build_cpu.log)"
  TSPP_CPU_ONLY=1 MAX_JOBS=16 timeout "$limit" "$PYTHON" -m pip install -e . --no-build-isolation --no-deps --no-index \
    > "$OUT/build_cpu.log" 2>&1
  if timeout 120 "$PYTHON" -c "import torchsparse_pp" > /dev/null 2>&1; then
    BUILD_OK=1
    note "fallback: CPU-only build ok; GPU tests and benchmark run the Triton backend only"
    BENCH_ARGS="--backends triton ${BENCH_ARGS:-}"
  else
    note "fallback: the CPU-only build failed too (build_cpu.log)"
  fi
fi

# --- CUDA tests ---------------------------------------------------------------------------------
pytest_timeout_args() {
  # a per-test limit when the pytest-timeout plugin is there, so one hung test cannot eat the run
  if "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then echo "--timeout=$1"; fi
}
limit=0
if [ "$RUN_TESTS" = 1 ] && [ "$BUILD_OK" = 1 ]; then
  limit=$(step_limit "$TESTS_TIMEOUT" 90)
fi
if [ "$RUN_TESTS" = 1 ] && [ "$BUILD_OK" = 1 ] && [ "$limit" -lt 20 ]; then
  note "cuda tests: skipped, only ${limit} s left"
elif [ "$RUN_TESTS" = 1 ] && [ "$BUILD_OK" = 1 ]; then
  banner "CUDA tests: pytest -q -m cuda tests/ (limit ${limit} s, log tests.log)"
  # shellcheck disable=SC2046
  timeout --kill-after=10 "$limit" "$PYTHON" -m pytest -q -m cuda tests/ -p no:cacheprovider -rfE $(pytest_timeout_args 120) 2>&1 \
    | tee "$OUT/tests.log"
  rc=${PIPESTATUS[0]}
  last=$(grep -E "passed|failed|skipped|deselected|error|no tests ran" "$OUT/tests.log" | tail -n 1)
  note "cuda tests: $(outcome "$rc"): ${last:-no pytest summary line}"
  while IFS= read -r line; do note "  $line"; done < <(grep -E "^(FAILED|ERROR) " "$OUT/tests.log" | head -n 12 | cut -c1-220)
elif [ "$RUN_TESTS" = 1 ]; then
  note "cuda tests: not run (no working CUDA build)"
fi

# --- peers --------------------------------------------------------------------------------------
if [ -f .peers/gpu_peers.sh ] && [ -f .peers/gpu_peers.tar.xz ]; then
  banner "peers: unpacking spconv from .peers"
  if exports=$(timeout 180 bash .peers/gpu_peers.sh install .peers); then
    eval "$exports"
    if version=$(timeout 120 "$PYTHON" -c "import spconv, spconv.pytorch; print(spconv.__version__)" 2>&1 | tail -n 1); then
      note "peers: spconv $version importable"
    else
      note "peers: spconv unpacked but not importable: $version"
    fi
  else
    note "peers: unpacking .peers failed"
  fi
else
  note "peers: no .peers/ in this copy (packed by gpu_peers.sh pack .peers, docs/gpu.md): spconv not timed"
fi

# --- benchmark ----------------------------------------------------------------------------------
reserve=15
[ "$ALL_TESTS" = 1 ] && reserve=120
limit=$(step_limit 600 "$reserve")
if [ "$RUN_BENCH" = 1 ] && [ "$BUILD_OK" = 1 ] && [ "$limit" -lt 60 ]; then
  note "benchmark: skipped, only ${limit} s left"
elif [ "$RUN_BENCH" = 1 ] && [ "$BUILD_OK" = 1 ]; then
  budget=$((limit - 60))  # the last layer started, the table and the plot fit in the rest
  banner "benchmark: benchmarks/conv_gpu.py --out \$OUT $QUICK (limit ${limit} s, layers started until ${budget} s)"
  # shellcheck disable=SC2086
  timeout --kill-after=10 "$limit" "$PYTHON" benchmarks/conv_gpu.py --out "$OUT" --time-budget "$budget" $QUICK ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench.log"
  rc=${PIPESTATUS[0]}
  case "$rc" in
    0) what="ok" ;;
    2) what="ran; some of ours failed or missed the tolerance (exit 2)" ;;
    3) what="ABORTED: the CUDA context was lost (exit 3)" ;;
    *) what="$(outcome "$rc"); its last lines: $(grep -v '^\s*$' "$OUT/bench.log" | tail -n 3 | cut -c1-200 | tr '\n' '|')" ;;
  esac
  note "benchmark: $what"
  while IFS= read -r line; do note "  $line"; done < <(grep -E "^\s*\[(PASS|FAIL|SKIP)\]|skipped |ABORTED" "$OUT/bench.log" | cut -c1-220)
  problems=$(sed -n '/^Problems/,/^$/p' "$OUT/bench.log" | grep -c "^  " || true)
  [ "${problems:-0}" -gt 0 ] && note "  $problems problem line(s) in bench.log (errors or results above tolerance)"
elif [ "$RUN_BENCH" = 1 ]; then
  note "benchmark: not run (no working CUDA build)"
fi

# --- the rest of the suite ----------------------------------------------------------------------
if [ "$ALL_TESTS" = 1 ] && [ "$BUILD_OK" = 1 ]; then
  limit=$(step_limit 600 10)
  if [ "$limit" -ge 60 ]; then
    banner "rest of the suite: pytest -q -m 'not cuda' tests/ (limit ${limit} s, log tests_rest.log)"
    parallel=""
    if "$PYTHON" -c "import xdist" 2>/dev/null; then parallel="-n 8"; fi
    # shellcheck disable=SC2046,SC2086
    OMP_NUM_THREADS=2 timeout --kill-after=10 "$limit" "$PYTHON" -m pytest -q -m "not cuda" tests/ -p no:cacheprovider -rfE $parallel \
      $(pytest_timeout_args 300) 2>&1 | tee "$OUT/tests_rest.log"
    rc=${PIPESTATUS[0]}
    last=$(grep -E "passed|failed|skipped|deselected|error|no tests ran" "$OUT/tests_rest.log" | tail -n 1)
    note "rest of the suite: $(outcome "$rc"): ${last:-no pytest summary line}"
    while IFS= read -r line; do note "  $line"; done < <(grep -E "^(FAILED|ERROR) " "$OUT/tests_rest.log" | head -n 12 | cut -c1-220)
  else
    note "rest of the suite: skipped, only ${limit} s left"
  fi
fi

# --- summary ------------------------------------------------------------------------------------
note "native CUDA kernels: $([ "$NATIVE_OK" = 1 ] && echo built || echo 'NOT built (Triton-only run)')"
note "files in \$OUT: $(cd "$OUT" && ls | grep -v '^summary.txt$' | tr '\n' ' ')summary.txt"
note "total: $(elapsed) s"
{
  echo
  echo "==== device_check summary ===="
  printf '%s\n' "${SUMMARY[@]}"
} | tee "$OUT/summary.txt"
