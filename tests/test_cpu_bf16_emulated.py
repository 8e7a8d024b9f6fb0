"""bfloat16 on CPUs where ATen's bfloat16 GEMM and convolution are its reference loop (no oneDNN
bf16: AVX2 CPUs), about 100x slower than float32 there: the library keeps them off that path
(torchsparse_pp/utils/cpu_bf16.py). The routes are forced on any CPU by patching the probe;
results are checked against float64 oracles and the outputs keep autocast's dtypes."""
import copy

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp.models import CenterPoint, CenterPointConfig, MinkUNet
from torchsparse_pp.models.centerpoint import voxelize
from torchsparse_pp.nn.functional import ConvConfig
from torchsparse_pp.utils import cpu_bf16
from conftest import lidar_coords
from dataflow_cases import oracle_errors
from precision import assert_as_accurate_as_plain, assert_rounded_once, plain_sparse_convs


@pytest.fixture(params=[False, True], ids=["onednn_bf16", "emulated"])
def emulated(request, monkeypatch):
    monkeypatch.setattr(cpu_bf16, "ONEDNN_BF16", not request.param)
    return request.param


def test_probe_reads_torch():
    assert cpu_bf16.ONEDNN_BF16 == cpu_bf16._onednn_bf16()
    t = torch.zeros(2, 2, dtype=torch.bfloat16)
    assert cpu_bf16.bf16_gemm_emulated(t) == (not cpu_bf16.ONEDNN_BF16)
    assert not cpu_bf16.bf16_gemm_emulated(t.float())


def test_gather_scatter_bf16_matches_the_oracle(emulated, seed, gen):
    coords = lidar_coords(seed, batch=2)
    feats = torch.randn(len(coords), 13, generator=gen).bfloat16()
    weight = (torch.randn(27, 13, 21, generator=gen) / 4).bfloat16()
    for config in (ConvConfig("gather_scatter"), ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=64)):
        _, errors = oracle_errors(tsp.SparseTensor(feats, coords), weight, {"kernel_size": 3}, config, gen)
        assert max(errors.values()) < 2e-2, (config, errors)


def test_dense_autocast_runs_float32_where_emulated(emulated, gen):
    linear = torch.nn.Linear(12, 5)
    x = torch.randn(40, 12, generator=gen)
    seen = []
    linear.register_forward_hook(lambda m, inputs, out: seen.append((inputs[0].dtype, out.dtype)))
    with torch.autocast("cpu", torch.bfloat16):
        out = cpu_bf16.dense_autocast(linear, x.bfloat16())
    assert out.dtype == torch.bfloat16
    assert seen == ([(torch.float32, torch.float32)] if emulated else [(torch.bfloat16, torch.bfloat16)])
    if emulated:  # float32 from exact operands, one rounding of the result
        expected = (x.bfloat16().double() @ linear.weight.double().t() + linear.bias.double()).detach()
        assert_rounded_once(out, expected, what="float32 linear")
    else:  # torch's own bf16 linear, untouched
        with torch.autocast("cpu", torch.bfloat16):
            assert torch.equal(out, linear(x.bfloat16()))
    # Outside autocast nothing changes.
    assert cpu_bf16.dense_autocast(linear, x).dtype == torch.float32


def test_linear_float32_keeps_float32_under_autocast(gen):
    x = torch.randn(30, 8, generator=gen).bfloat16().requires_grad_(True)
    w = torch.randn(8, 6, generator=gen).requires_grad_(True)
    with torch.autocast("cpu", torch.bfloat16):
        out = cpu_bf16.linear_float32(x, w)
    assert out.dtype == torch.bfloat16
    exact = x.detach().double() @ w.detach().double()
    # A bfloat16 GEMM would round w to bfloat16 first; float32 rounds only the output.
    assert_rounded_once(out, exact, what="linear_float32")
    out.float().sum().backward()
    assert w.grad.dtype == torch.float32 and x.grad.dtype == torch.bfloat16


def test_minkunet_autocast_matches_float32(emulated, seed, gen):
    torch.manual_seed(seed)
    model = MinkUNet(in_channels=4, num_classes=6, cr=0.25).eval()
    coords = lidar_coords(seed, batch=2)
    x = tsp.SparseTensor(torch.randn(len(coords), 4, generator=gen), coords)
    with torch.no_grad():
        reference = copy.deepcopy(model).double()(x.replace_feats(x.F.double()))
        with torch.autocast("cpu", torch.bfloat16):
            out = model(tsp.SparseTensor(x.F, x.C))
            with plain_sparse_convs():
                plain = model(tsp.SparseTensor(x.F, x.C))
    assert out.dtype == torch.bfloat16
    assert_as_accurate_as_plain(out, plain, reference, what="MinkUNet under autocast")


def test_centerpoint_autocast_outputs_are_bf16(emulated, seed):
    from test_compile import TINY, centerpoint_sample
    config = CenterPointConfig.synthetic(**TINY)
    torch.manual_seed(seed)
    model = CenterPoint(config).eval()
    points, _, _ = centerpoint_sample(seed, config)
    x = voxelize([points], config)
    with torch.no_grad():
        reference = copy.deepcopy(model).double()(x.replace_feats(x.F.double()), 1)
        with torch.autocast("cpu", torch.bfloat16):
            out = model(x, 1)
            with plain_sparse_convs():
                plain = model(x, 1)
    assert set(out) == set(reference)
    for name, value in out.items():
        assert value.dtype == torch.bfloat16, name
    assert_as_accurate_as_plain(out, plain, reference, what="CenterPoint under autocast")
