# Fresh-machine entry points (see README.md):
#   make demo   set up, then run the demo
#   make test   set up, then run the test suite (what CI runs)
PYTHON ?= python3
export PYTHON

BUILD_INPUTS := setup.py pyproject.toml scripts/setup.sh $(shell find csrc -type f 2>/dev/null)
SETUP_STAMP := build/.setup-stamp

.PHONY: setup demo test bench clean

$(SETUP_STAMP): $(BUILD_INPUTS)
	bash scripts/setup.sh
	@mkdir -p build && touch $@

setup: $(SETUP_STAMP)

demo: $(SETUP_STAMP)
	$(PYTHON) -m torchsparse_pp.cli demo

test: $(SETUP_STAMP)
	bash scripts/run_tests.sh

bench: $(SETUP_STAMP)
	EXTRAS=bench bash scripts/setup.sh
	$(PYTHON) benchmarks/conv_cpu.py
	$(PYTHON) benchmarks/deterministic_cpu.py

clean:
	rm -rf build torchsparse_pp/_C*.so
