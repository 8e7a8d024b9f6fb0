"""torchsparse 2.1's own tests (../shared/upstream/torchsparse/tests, unmodified) under
alias('torchsparse'), with only their device changed to the CPU: tests/test.py's test cases
with the ``device`` argument of its two test functions set to "cpu" (their default is
"cuda:0"). test_single_layer compares Conv3d in float16 with torch's dense conv3d for kernel
sizes 2, 3, 5 and strides 1, 2, 3, twice (default config, then kmap_mode set explicitly), and
holds the mean absolute / relative differences to 1e-4 / 1e-2; test_to_dense checks to_dense."""
import functools
import importlib
import importlib.util
import math
import subprocess
import sys
import unittest
from pathlib import Path

import pytest

from torchsparse_pp.compat import alias

TESTS = Path(__file__).resolve().parents[2] / "shared" / "upstream" / "torchsparse" / "tests"
CASES = [("SparseConvTestCase", "test_single_layer"), ("ToDenseTestCase", "test_to_dense")]


@pytest.fixture(scope="module")
def upstream_tests():
    """tests/test.py, whose ``python`` package has its test functions bound to device="cpu"."""
    if not TESTS.is_dir():
        pytest.skip(f"torchsparse's upstream tests are not at {TESTS} (the shared/upstream folder of CI checkouts)")
    alias("torchsparse")
    sys.path.insert(0, str(TESTS))
    try:
        functions = importlib.import_module("python")
        for name in ("test_single_layer_convolution_forward", "test_to_dense_forward"):
            setattr(functions, name, functools.partial(getattr(functions, name), device="cpu"))
        spec = importlib.util.spec_from_file_location("torchsparse_upstream_test", TESTS / "test.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(TESTS))
    yield module
    importlib.import_module("torchsparse").nn.functional.clear_global_conv_config()  # test.py sets one


@pytest.mark.parametrize("case,method", CASES)
def test_torchsparse_test_passes_on_cpu(case, method, upstream_tests):
    result = unittest.TestResult()
    getattr(upstream_tests, case)(method).run(result)
    assert result.wasSuccessful(), "".join(text for _, text in result.failures + result.errors)
    assert result.testsRun == 1


def test_example_py_trains_on_cpu_and_names_its_mixed_dtype_inference(tmp_path):
    """examples/example.py as a user runs it on a CPU (``--device cpu``, its own option): its 50
    training steps run; its inference feeds float16 inputs to the float32 model inside
    torch.cuda.amp.autocast, which does nothing without CUDA, and its last conv (1x1x1, 2.1's
    plain matmul) then raises an error that says so (2.1 needs CUDA for the other convs)."""
    example = TESTS.parent / "examples" / "example.py"
    if not example.is_file():
        pytest.skip(f"torchsparse's examples/example.py is not at {example}")
    script = ("from torchsparse_pp.compat import alias\nalias('torchsparse')\nimport runpy, sys\n"
              f"sys.argv = ['example.py', '--device', 'cpu']\nrunpy.run_path({str(example)!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    steps = [line for line in done.stdout.splitlines() if line.startswith("[step ")]
    assert len(steps) == 50 and all(math.isfinite(float(line.split("= ")[1])) for line in steps), done.stderr[-2000:]
    assert done.returncode != 0 and "[inference step" not in done.stdout
    assert "TypeError: a 1x1x1 stride-1 conv is torchsparse 2.1's feats.matmul(kernel)" in done.stderr
