"""The map builders bound their geometry and check their inputs: stride / dilation / padding are
at most 2^20 per axis (no silent int64 overflow), and kmap_downsample refuses an input outside the
packable range whose outputs would land in range, and duplicates whose outputs are all clipped
(native and torch ops alike)."""
import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import ops
from torchsparse_pp.kmap import ConvGeometry
from torchsparse_pp.nn.functional import conv3d
from conftest import random_coords
from op_twins import same_error


def test_stride_dilation_padding_are_bounded():
    coords = torch.tensor([[0, 4, 0, 0], [0, -3, 2, 1]], dtype=torch.int32)
    for name, value in (("stride", 1 << 62), ("dilation", 1 << 21), ("padding", (1 << 20) + 1)):
        with pytest.raises(ValueError, match=rf"^{name} must be <= 2\^20 = 1048576 on every axis"):
            ConvGeometry.make(3, **{name: value})
        args = dict(stride=[1, 1, 1], dilation=[1, 1, 1], padding=[0, 0, 0])
        args[name] = [value, 1, 1]
        message = rf"^{name} must be at most 2\^20 = 1048576 per axis \(coordinates span 2\^16\), got \[{value}, 1, 1\]"
        same_error(message, "kmap_downsample", coords, [3, 1, 1], args["stride"], args["dilation"],
                   args["padding"], "spconv", None, 16)
        same_error(message, "kmap_generative", coords, [3, 1, 1], args["stride"], args["dilation"],
                   args["padding"], None, 16)
    x = tsp.SparseTensor(torch.randn(2, 1), coords)
    with pytest.raises(ValueError, match=r"stride must be <= 2\^20"):
        conv3d(x, torch.randn(1, 1, 1), 1, stride=1 << 62)
    with pytest.raises(ValueError, match=r"the centred default .* pass padding explicitly"):
        ConvGeometry.make(5, dilation=1 << 20)
    # At the bound the map is exact: the one input that reaches anything is x = 0.
    at_bound = ops.kmap_generative(torch.tensor([[0, 0, 0, 0]], dtype=torch.int32), [2, 1, 1], [1 << 20, 1, 1],
                                   [1, 1, 1], [0, 0, 0], None, 16)
    assert at_bound[0].tolist() == [[0, 0, 0, 0], [0, 1, 0, 0]]


def test_kmap_downsample_checks_its_inputs(gen):
    coords = random_coords(gen, 300, batch=2, low=0, high=8)
    # x = 40000 is not packable; with stride 4 its outputs (x = 10000) would be.
    far = coords.clone()
    far[17, 1] = 40000
    same_error(r"^coords row 17 = \(\d+, 40000, .*\) is outside the supported coordinate range", "kmap_downsample",
               far, [2, 2, 2], [4, 4, 4], [1, 1, 1], [0, 0, 0], "spconv", None, 128)
    same_error(r"^coords row 17 .* is outside", "kmap_downsample", far, [2, 2, 2], [4, 4, 4], [1, 1, 1],
               [0, 0, 0], "minkowski", None, 128)
    # Two copies of a point whose outputs all lie outside out_range [0, 2)^3.
    point = torch.tensor([[0, 7, 7, 7]], dtype=torch.int32)
    base = coords[~(coords == point).all(1)]
    dup = torch.cat([base, point, point])
    ops.kmap_downsample(dup[:-1], [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], "spconv", [2, 2, 2], 128)  # one copy
    same_error(r"^duplicate coordinate \(0, 7, 7, 7\) at rows \d+ and \d+: the coordinates of a SparseTensor "
               r"must be unique", "kmap_downsample", dup, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], "spconv",
               [2, 2, 2], 128)
