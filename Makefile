# Fresh-machine entry points (see README.md):
#   make demo   set up, then run the demo
#   make test   set up, then run the test suite (what CI runs)
#   make cuda-check  compile every CUDA source with nvcc for sm_80 / sm_90 (no GPU needed) and check
#                    ptxas' report of every kernel (fails on spills; CUDA_CHECK_MARKDOWN=FILE: table)
#   make triton-check  compile every Triton kernel instantiation for sm_80 ... sm_120, gfx90a, gfx942
PYTHON ?= python3
export PYTHON

BUILD_INPUTS := setup.py pyproject.toml scripts/setup.sh $(shell find csrc -type f 2>/dev/null)
SETUP_STAMP := build/.setup-stamp

.PHONY: setup demo test bench bench-autotune cuda-check triton-check kernels clean

$(SETUP_STAMP): $(BUILD_INPUTS)
	bash scripts/setup.sh
	@mkdir -p build && touch $@

setup: $(SETUP_STAMP)

demo: $(SETUP_STAMP)
	$(PYTHON) -m torchsparse_pp.cli demo

test: $(SETUP_STAMP)
	bash scripts/run_tests.sh

# Fails on a compile error, a stale generated kernel, or any kernel that spills, keeps a stack frame
# or uses more than 48 KiB of static shared memory (tools/ptxas_report.py prints the table).
cuda-check: $(SETUP_STAMP)
	bash scripts/cuda_compile_check.sh

# Fails on a compile error, shared memory over a target's limit or any spill on NVIDIA targets;
# TRITON_CHECK_ARGS passes options (e.g. --markdown FILE for the docs/gpu.md table).
triton-check: $(SETUP_STAMP)
	$(PYTHON) tools/triton_check.py $(TRITON_CHECK_ARGS)

kernels:
	$(PYTHON) tools/generate_kernels.py

# Benchmarks write to a new benchmarks/out/<name>-<time>/ (git-ignored);
# `make bench BENCH_ARGS=--publish` replaces the published benchmarks/results/ (and configs/tuned/).
BENCH_ARGS ?=

bench: $(SETUP_STAMP)
	EXTRAS=bench bash scripts/setup.sh
	$(PYTHON) benchmarks/conv_cpu.py $(BENCH_ARGS)
	$(PYTHON) benchmarks/deterministic_cpu.py $(BENCH_ARGS)

# Sparse Autotuner end to end (about 25 min on 2 cores); with BENCH_ARGS=--publish it rewrites
# benchmarks/results/autotune_cpu.* and configs/tuned/*_cpu.yaml
bench-autotune: $(SETUP_STAMP)
	EXTRAS=bench bash scripts/setup.sh
	$(PYTHON) benchmarks/autotune.py --bindings-study $(BENCH_ARGS)

clean:
	rm -rf build torchsparse_pp/_C*.so
