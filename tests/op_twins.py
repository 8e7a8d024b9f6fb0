"""Helpers shared by the tests of the native ops and their torch-ops twins."""
import re

import pytest
import torch

from torchsparse_pp import ops
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, submanifold_map, torch_ops
from conftest import random_coords


def same_error(pattern, op, *args):
    """The native op and its torch-ops twin raise the same RuntimeError, matching pattern."""
    with pytest.raises(RuntimeError) as native:
        getattr(ops, op)(*args)
    with pytest.raises(RuntimeError) as mine:
        getattr(torch_ops, op)(*args)
    assert re.search(pattern, str(native.value)), str(native.value)
    assert str(mine.value) == str(native.value)


def small_submanifold(gen):
    """A 3x3x3 submanifold map over 2 random samples, features [N, 4] and a weight [27, 4, 5]."""
    coords = random_coords(gen, 200, batch=2, low=-3, high=4)
    kmap = submanifold_map(KernelMapCache(), coords, ConvGeometry.make(3), None)
    return kmap, torch.randn(kmap.num_in, 4, generator=gen), torch.randn(27, 4, 5, generator=gen)
