"""Importing the package must not touch CUDA, and the CLI must start on a CPU-only machine."""
import subprocess
import sys

SCRIPT = r"""
import torch
import torch.cuda

def refuse(*args, **kwargs):
    raise AssertionError("CUDA was touched during import")

torch.cuda._lazy_init = refuse
torch.cuda.init = refuse
torch.cuda.is_available = refuse
torch.cuda.device_count = refuse
import torchsparse_pp
from torchsparse_pp import nn, utils, data  # noqa: F401
assert not torch.cuda.is_initialized()
print("ok", torchsparse_pp.__version__)
"""


def test_import_does_not_touch_cuda():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


def test_cli_info_runs():
    proc = subprocess.run([sys.executable, "-m", "torchsparse_pp.cli", "info"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "dataflows on cpu: gather_scatter" in proc.stdout
