"""float16 on the CPU (torchsparse_pp.nn.functional.cpu_half): a float16 conv computes in
float32 from its float16 operands and rounds once, so its forward, input gradient and weight
gradient are float16 and as accurate as the float64 oracle rounded once to float16
(docs/testing.md's rule for reduced-precision results of exact operands); the layers around
convs take float16 too, within one float16 rounding of float64."""
import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import nn as spnn
from torchsparse_pp.nn.functional import ConvConfig, PassConfigs
from dataflow_cases import GEOMETRIES, make_input, run_oracle, run_ours, volume
from precision import assert_as_accurate_as_plain, assert_as_accurate_as_rounded, assert_rounded_once

FP16_ROUNDING = 2.0 ** -11  # float16's unit roundoff (11 significant bits)
CONFIGS = {"gather_scatter": ConvConfig("gather_scatter"), "fetch_on_demand": ConvConfig("fetch_on_demand"),
           "implicit_gemm": PassConfigs.of(ConvConfig("implicit_gemm", sorted=True, split_mask_num=2))}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("geometry", ["subm_k3", "subm_k2", "k2s2_spconv", "k3s2p1_spconv", "transposed_k3s2p1",
                                      "generative_k2s2"])
def test_float16_conv_rounds_once(geometry, config, gen):
    geom = GEOMETRIES[geometry]
    x = make_input(gen, geom, "random", 6, torch.float16)
    weight = torch.randn(volume(geom["kernel_size"]), 6, 5, generator=gen).half()
    y, dfeats, dweight, grad = run_ours(x, weight, geom, CONFIGS[config], int(torch.randint(0, 2 ** 31, (1,), generator=gen)))
    assert (y.F.dtype, dfeats.dtype, dweight.dtype) == (torch.float16,) * 3
    exact = dict(zip(("forward", "dgrad", "wgrad"), run_oracle(x, weight, y.C, geom, grad, magnitudes=False)[0]))
    assert_as_accurate_as_rounded({"forward": y.F, "dgrad": dfeats, "wgrad": dweight}, exact,
                                  what=f"float16 {geometry} {config}")


def test_float16_pointwise_conv_with_bias(gen):
    coords = torch.unique(torch.randint(0, 9, (400, 4), generator=gen), dim=0).int()
    feats = torch.randn(len(coords), 8, generator=gen).half().requires_grad_()
    conv = spnn.Conv3d(8, 6, 1, bias=True).half()
    y = conv(tsp.SparseTensor(feats, coords))
    g = torch.randn(y.F.shape, generator=gen).half()
    y.F.backward(g)
    w, b = conv.kernel.detach().double()[0], conv.bias.detach().double()
    exact = {"forward": feats.detach().double() @ w + b, "dgrad": g.double() @ w.t(),
             "wgrad": (feats.detach().double().t() @ g.double())[None], "bias": g.double().sum(0)}
    ours = {"forward": y.F, "dgrad": feats.grad, "wgrad": conv.kernel.grad, "bias": conv.bias.grad}
    assert all(t.dtype == torch.float16 for t in ours.values())
    assert_as_accurate_as_rounded(ours, exact, what="float16 1x1x1 conv")


@pytest.mark.parametrize("layer", ["batch_norm", "max_pool", "avg_pool", "global_avg_pool", "relu"])
def test_float16_layers_around_convs(layer, gen):
    coords = torch.unique(torch.randint(0, 9, (500, 4), generator=gen) % torch.tensor([2, 9, 9, 9]), dim=0).int()
    feats = torch.randn(len(coords), 8, generator=gen).half()
    module = {"batch_norm": lambda: spnn.BatchNorm(8), "max_pool": lambda: spnn.MaxPool3d(2, 2),
              "avg_pool": lambda: spnn.AvgPool3d(2, 2), "global_avg_pool": spnn.GlobalAvgPool,
              "relu": spnn.ReLU}[layer]()
    if layer == "batch_norm":
        with torch.no_grad():
            module.running_mean.copy_(torch.randn(8, generator=gen) * 0.3)
            module.running_var.copy_(torch.rand(8, generator=gen) + 0.5)
            module.weight.copy_(torch.rand(8, generator=gen) + 0.5)
            module.bias.copy_(torch.randn(8, generator=gen) * 0.1)
    module.eval()
    wide = type(module)() if layer in ("global_avg_pool", "relu") else None
    ours = module.half()(tsp.SparseTensor(feats, coords))
    reference = (wide or module.double())(tsp.SparseTensor(feats.double(), coords))
    got, ref = (ours, reference) if isinstance(ours, torch.Tensor) else (ours.F, reference.F)
    assert got.dtype == torch.float16
    assert_rounded_once(got, ref, rounding=FP16_ROUNDING, what=f"float16 {layer}")


def test_torchsparse_adapter_casts_to_float16_as_2_1(gen):
    """torchsparse 2.1's rule: float16 features with a float32 kernel compute in float16 (both
    cast), the output is float16 and the float32 bias is added into it (``feats += bias``); the
    kernel's gradient comes back in its own dtype."""
    from torchsparse_pp.compat import torchsparse
    from torchsparse_pp.compat.torchsparse.nn.functional.conv import library_kernel
    from oracle import reference_conv

    coords = torch.unique(torch.randint(0, 8, (300, 4), generator=gen) % torch.tensor([2, 8, 8, 8]), dim=0).int()
    feats = torch.randn(len(coords), 4, generator=gen).half()
    conv = torchsparse.nn.Conv3d(4, 3, 3, bias=True)
    out = conv(torchsparse.SparseTensor(feats, coords))
    assert out.F.dtype == torch.float16
    kernel = library_kernel(conv.kernel.detach().half().double(), (3, 3, 3))
    exact = reference_conv(coords, feats.double(), kernel, coords, 3, 1, 1, 1)
    plain = (exact.half().double() + conv.bias.detach().double()).half()  # 2.1 rounds the conv, then the sum
    assert_as_accurate_as_plain(out.F, plain, exact + conv.bias.detach().double(), what="2.1 float16 rule")
    out.F.float().sum().backward()
    assert conv.kernel.grad.dtype == torch.float32 and conv.bias.grad.dtype == torch.float32
