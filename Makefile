# Fresh-machine entry points (see README.md):
#   make demo   set up, then run the demo
#   make test   set up, then run the test suite (what CI runs)
#   make cuda-check  compile every CUDA source with nvcc for sm_80 / sm_90 (no GPU needed)
PYTHON ?= python3
export PYTHON

BUILD_INPUTS := setup.py pyproject.toml scripts/setup.sh $(shell find csrc -type f 2>/dev/null)
SETUP_STAMP := build/.setup-stamp

.PHONY: setup demo test bench bench-autotune cuda-check kernels clean

$(SETUP_STAMP): $(BUILD_INPUTS)
	bash scripts/setup.sh
	@mkdir -p build && touch $@

setup: $(SETUP_STAMP)

demo: $(SETUP_STAMP)
	$(PYTHON) -m torchsparse_pp.cli demo

test: $(SETUP_STAMP)
	bash scripts/run_tests.sh

cuda-check: $(SETUP_STAMP)
	bash scripts/cuda_compile_check.sh

kernels:
	$(PYTHON) tools/generate_kernels.py

bench: $(SETUP_STAMP)
	EXTRAS=bench bash scripts/setup.sh
	$(PYTHON) benchmarks/conv_cpu.py
	$(PYTHON) benchmarks/deterministic_cpu.py

# Sparse Autotuner end to end (about 25 min on 2 cores); rewrites configs/tuned/*_cpu.yaml
bench-autotune: $(SETUP_STAMP)
	EXTRAS=bench bash scripts/setup.sh
	$(PYTHON) benchmarks/autotune.py --bindings-study

clean:
	rm -rf build torchsparse_pp/_C*.so
