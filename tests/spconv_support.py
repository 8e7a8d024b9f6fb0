"""What tests running real spconv 2.3.8 on the CPU need: one thread (its CPU kernels race with
more) and a stand-in for the CUDA stream its CPU backward asks torch.cuda for (see test_spconv.py)."""
import contextlib

import pytest
import torch


@contextlib.contextmanager
def single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def cpu_backward(monkeypatch):
    import spconv.pytorch.ops as spconv_ops
    if not torch.cuda.is_available():
        monkeypatch.setattr(spconv_ops, "get_current_stream", lambda: 0)
