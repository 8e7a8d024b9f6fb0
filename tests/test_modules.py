"""nn modules: activations, Conv3d, ToDense, and a whole Sequential network on a LiDAR scan.

Conv3d is checked against the dense oracle (tests/oracle.py), activations against torch's
own functions on the features, ToDense against a brute-force scatter.
"""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import torchsparse_pp as tsp
from torchsparse_pp.data import generate_scan
from torchsparse_pp.nn import (AvgPool3d, BatchNorm, Conv3d, GroupNorm, LeakyReLU, MaxPool3d, ReLU, SiLU,
                               ToDense)
from torchsparse_pp.nn.functional import ConvConfig, PassConfigs
from torchsparse_pp.utils import sparse_quantize
from conftest import fresh_seed, shuffled_coords as random_coords, triple as _t
from oracle import reference_conv, reference_output_coords, sort_coords
from precision import assert_as_accurate_as_plain, plain_sparse_convs

EXACT = dict(rtol=1e-10, atol=1e-10)


def randomise(module: nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))


# --------------------------------------------------------------------------------------------
# Activations
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module, reference", [
    (ReLU(), TF.relu),
    (LeakyReLU(0.1), lambda f: TF.leaky_relu(f, 0.1)),
    (SiLU(), TF.silu),
], ids=["relu", "leaky_relu", "silu"])
def test_activation_matches_torch(gen, module, reference):
    coords = random_coords(gen)
    feats = torch.randn(len(coords), 6, generator=gen, dtype=torch.float64)
    a = feats.clone().requires_grad_(True)
    b = feats.clone().requires_grad_(True)
    x = tsp.SparseTensor(a, coords, stride=2)
    y = module(x)
    expected = reference(b)
    assert y.C is coords and y.s == (2, 2, 2) and y.cache is x.cache
    torch.testing.assert_close(y.F, expected, rtol=0, atol=0)
    grad_out = torch.randn(y.F.shape, generator=gen, dtype=torch.float64)
    (y.F * grad_out).sum().backward()
    (expected * grad_out).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    with pytest.raises(TypeError):
        module(feats)


def test_leaky_relu_slope_is_used(gen):
    feats = -torch.rand(20, 2, generator=gen, dtype=torch.float64) - 0.1
    y = LeakyReLU(0.1)(tsp.SparseTensor(feats, random_coords(gen, per_batch=(20,))))
    torch.testing.assert_close(y.F, 0.1 * feats, **EXACT)


# --------------------------------------------------------------------------------------------
# Conv3d module
# --------------------------------------------------------------------------------------------
KERNELS = [1, 2, 3, 5, (3, 1, 1)]


@pytest.mark.parametrize("kernel", KERNELS, ids=str)
def test_conv_kernel_shape_and_submanifold_forward(gen, kernel):
    c_in, c_out = 3, 5
    conv = Conv3d(c_in, c_out, kernel, bias=True).double()
    volume = math.prod(_t(kernel))
    assert conv.kernel.shape == (volume, c_in, c_out)
    assert conv.bias.shape == (c_out,)
    randomise(conv, gen)
    coords = random_coords(gen)
    feats = torch.randn(len(coords), c_in, generator=gen, dtype=torch.float64)
    y = conv(tsp.SparseTensor(feats, coords))
    assert y.C is coords and y.s == (1, 1, 1)
    padding = tuple((k - 1) // 2 if k % 2 else 0 for k in _t(kernel))
    expected = reference_conv(coords, feats, conv.kernel.detach(), coords, kernel, 1, 1, padding) + conv.bias.detach()
    torch.testing.assert_close(y.F, expected, **EXACT)


@pytest.mark.parametrize("kernel, stride, mode", [
    (2, 2, "spconv"), (2, 2, "minkowski"), (3, 2, "spconv"), ((3, 1, 1), (2, 1, 1), "spconv"),
], ids=str)
def test_conv_strided_forward_and_backward(gen, kernel, stride, mode):
    c_in, c_out = 4, 3
    conv = Conv3d(c_in, c_out, kernel, stride=stride, bias=True, downsample_mode=mode).double()
    randomise(conv, gen)
    coords = random_coords(gen)
    feats = torch.randn(len(coords), c_in, generator=gen, dtype=torch.float64)
    a = feats.clone().requires_grad_(True)
    y = conv(tsp.SparseTensor(a, coords))
    padding = conv.padding
    assert padding == tuple((k - 1) // 2 if k % 2 else 0 for k in _t(kernel))
    assert y.s == _t(stride)
    assert torch.equal(sort_coords(y.C), reference_output_coords(coords, kernel, stride, 1, padding, mode))

    b = feats.clone().requires_grad_(True)
    w = conv.kernel.detach().clone().requires_grad_(True)
    bias = conv.bias.detach().clone().requires_grad_(True)
    expected = reference_conv(coords, b, w, y.C, kernel, stride, 1, padding) + bias
    torch.testing.assert_close(y.F, expected, **EXACT)
    grad_out = torch.randn(y.F.shape, generator=gen, dtype=torch.float64)
    (y.F * grad_out).sum().backward()
    (expected * grad_out).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, **EXACT)
    torch.testing.assert_close(conv.kernel.grad, w.grad, **EXACT)
    torch.testing.assert_close(conv.bias.grad, bias.grad, **EXACT)


def test_conv_config_attribute(gen):
    conv = Conv3d(2, 3, 3, config=ConvConfig("fetch_on_demand"))  # the CPU default, set explicitly
    cfg = ConvConfig("fetch_on_demand")
    assert conv.config == PassConfigs(cfg, cfg, cfg)
    coords = random_coords(gen, per_batch=(50,))
    x = tsp.SparseTensor(torch.randn(len(coords), 2, generator=gen), coords)
    with_config = conv(x).F
    conv.config = None
    assert conv.config is None
    torch.testing.assert_close(conv(x).F, with_config, rtol=0, atol=0)
    for bad in ("gather_scatter", {"dataflow": "gather_scatter"}, 1):
        with pytest.raises(TypeError):
            conv.config = bad
        with pytest.raises(TypeError):
            Conv3d(2, 3, 3, config=bad)
    assert conv.config is None  # a rejected value leaves the old one
    with pytest.raises(ValueError):
        ConvConfig("no_such_dataflow")


def test_conv_extra_repr_mentions_geometry():
    text = repr(Conv3d(4, 8, (3, 1, 1), stride=(2, 1, 1), dilation=2, bias=True))
    for part in ("4, 8", "kernel_size=(3, 1, 1)", "stride=(2, 1, 1)", "dilation=(2, 2, 2)",
                 "padding=(2, 0, 0)", "bias=True", "downsample_mode='spconv'"):
        assert part in text, (part, text)
    text = repr(Conv3d(8, 4, 2, stride=2, transposed=True))
    assert "kernel_size=(2, 2, 2)" in text and "stride=(2, 2, 2)" in text and "transposed=True" in text
    text = repr(Conv3d(3, 3, 5, padding=1))
    assert "kernel_size=(5, 5, 5)" in text and "padding=(1, 1, 1)" in text


@pytest.mark.parametrize("kernel, transposed", [(3, False), (2, True), ((3, 1, 1), False), (1, False)])
def test_conv_reset_parameters(gen, kernel, transposed):
    c_in, c_out = 16, 24
    conv = Conv3d(c_in, c_out, kernel, stride=2 if transposed else 1, transposed=transposed, bias=True)
    volume = math.prod(_t(kernel))
    bound = 1 / math.sqrt((c_out if transposed else c_in) * volume)
    w = conv.kernel.detach()
    assert w.std() > 0.3 * bound  # not constant
    assert w.abs().max() <= bound
    assert w.abs().max() > 0.9 * bound  # spans the range (16*24*K >= 384 uniform draws)
    assert conv.bias.abs().max() <= bound and conv.bias.std() > 0
    before = w.clone()
    conv.reset_parameters()
    assert not torch.equal(before, conv.kernel.detach())


# --------------------------------------------------------------------------------------------
# ToDense
# --------------------------------------------------------------------------------------------
def test_to_dense(gen):
    coords = random_coords(gen, low=0, high=9)
    channels = 3
    feats = torch.randn(len(coords), channels, generator=gen, dtype=torch.float64)
    a = feats.clone().requires_grad_(True)
    x = tsp.SparseTensor(a, coords)
    dense = ToDense()(x)

    size = (coords[:, 1:].amax(0) + 1).tolist()
    expected = torch.zeros(2, channels, *size, dtype=torch.float64)
    for (b, i, j, k), f in zip(coords.tolist(), feats):
        expected[b, :, i, j, k] = f
    torch.testing.assert_close(dense, expected, rtol=0, atol=0)
    torch.testing.assert_close(x.dense(), expected, rtol=0, atol=0)

    grad_out = torch.randn(dense.shape, generator=gen, dtype=torch.float64)
    (dense * grad_out).sum().backward()
    c = coords.long()
    torch.testing.assert_close(a.grad, grad_out[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]], rtol=0, atol=0)

    big = ToDense(spatial_range=(12, 10, 11), batch_size=3)(x)
    assert big.shape == (3, channels, 12, 10, 11)
    torch.testing.assert_close(big[:2, :, :size[0], :size[1], :size[2]], expected, rtol=0, atol=0)
    rest = big.clone()
    rest[:2, :, :size[0], :size[1], :size[2]] = 0
    assert (rest == 0).all()  # nothing else written


# --------------------------------------------------------------------------------------------
# A whole network on a LiDAR scan
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scan_tensor():
    scan = generate_scan(32, seed=fresh_seed() % 65536)
    points = scan["points"]
    voxels, index = sparse_quantize(points[:, :3], 0.1, return_index=True)
    coords = torch.cat([torch.zeros(len(voxels), 1, dtype=torch.int32), torch.from_numpy(voxels)], 1)
    feats = torch.from_numpy(np.ascontiguousarray(points[index]))
    feats = (feats - feats.mean(0)) / feats.std(0)
    return coords, feats


def build_model() -> nn.Sequential:
    return nn.Sequential(
        Conv3d(4, 8, 3), BatchNorm(8), ReLU(),
        Conv3d(8, 16, 2, stride=2, bias=True), GroupNorm(4, 16), SiLU(),
        MaxPool3d(3, stride=1), AvgPool3d(2),
        Conv3d(16, 16, 2, stride=2, transposed=True),
        Conv3d(16, 8, 2, stride=2, transposed=True, bias=True),
    )


def test_sequential_network_on_scan(scan_tensor):
    coords, feats = scan_tensor
    assert len(coords) > 5000
    torch.manual_seed(fresh_seed())
    model = build_model()
    leaf = feats.clone().requires_grad_(True)
    x = tsp.SparseTensor(leaf, coords)
    y = model(x)
    assert y.C is coords  # the two transposed convs walk back to the input coordinates
    assert y.s == (1, 1, 1) and y.F.shape == (len(coords), 8)
    assert torch.isfinite(y.F).all() and y.F.std() > 0
    grad_out = torch.randn(y.F.shape)
    (y.F * grad_out).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert torch.isfinite(leaf.grad).all() and leaf.grad.abs().sum() > 0


def test_sequential_network_autocast_bfloat16(scan_tensor):
    """Forward and backward under bf16 autocast, as accurate as the same network with plain bf16
    convs (precision.py), both against float64: the output, and the parameters' gradients jointly."""
    coords, feats = scan_tensor
    torch.manual_seed(fresh_seed())
    model = build_model()
    model_bf16, model_plain, model64 = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model).double()
    grad_out = torch.randn(len(coords), 8)

    def run(net, feats, grad):
        y = net(tsp.SparseTensor(feats, coords))
        (y.F.to(grad.dtype) * grad).sum().backward()
        return y, {"output": y.F, **{name: p.grad for name, p in net.named_parameters()}}

    _, expected = run(model64, feats.double(), grad_out.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16, got = run(model_bf16, feats, grad_out)
        with plain_sparse_convs():
            _, plain = run(model_plain, feats, grad_out)
    assert y16.F.dtype == torch.bfloat16 and y16.C is coords
    for name, p16 in model_bf16.named_parameters():
        assert p16.dtype == torch.float32 and p16.grad.dtype == torch.float32, name
        assert torch.isfinite(p16.grad).all(), name
    assert_as_accurate_as_plain(got, plain, expected, what="network under bf16 autocast",
                                jointly=[n for n, _ in model.named_parameters()])