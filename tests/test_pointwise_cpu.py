"""1x1x1 convs on the CPU: in inference they run fetch_on_demand's register kernel over identity
pairs (bias, residual and ReLU in its epilogue) where the CPU has the kernels; when autograd
needs a graph, large ones run fetch_on_demand's three passes over identity pairs and small ones
torch.addmm. Oracle: the same sums in float64 (each output row times the weight) and their
float64 autograd, on LiDAR-like inputs; every route must agree with it."""
import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import ops
from torchsparse_pp.nn.functional import conv3d
from torchsparse_pp.nn.functional import epilogue as epilogue_module
from torchsparse_pp.nn.functional.epilogue import Epilogue
from conftest import lidar_coords

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def oracle(feats, weight, bias, residual, relu):
    out = feats.double() @ weight[0].double()
    if bias is not None:
        out = out + bias.double()
    if residual is not None:
        out = out + residual.double()
    return out.clamp_min(0) if relu else out


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.fixture
def kernel_calls(monkeypatch):
    """Calls of the fused kernel; every 1x1x1 conv counts as large enough for it."""
    monkeypatch.setattr(epilogue_module, "POINTWISE_KERNEL_MIN_MACS", 0)
    calls = []
    real = ops.fetch_on_demand_forward_fused

    def counting(*args):
        calls.append(args[0].shape)
        return real(*args)
    monkeypatch.setattr(ops, "fetch_on_demand_forward_fused", counting)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("c_in, c_out, with_bias, with_residual, relu",
                         [(16, 48, True, False, False), (48, 19, False, False, False), (7, 33, True, True, True),
                          (64, 48, True, True, False)])
def test_pointwise_matches_the_oracle_on_both_routes(seed, gen, kernel_calls, dtype, c_in, c_out, with_bias, with_residual,
                                                     relu):
    coords = lidar_coords(seed)
    n = len(coords)
    feats = (torch.randn(n, c_in, generator=gen) * torch.rand(c_in, generator=gen)).to(dtype)
    weight = torch.randn(1, c_in, c_out, generator=gen).to(dtype)
    bias = torch.randn(c_out, generator=gen).to(dtype) if with_bias else None
    residual = torch.randn(n, c_out, generator=gen).to(dtype) if with_residual else None
    expected = oracle(feats, weight, bias, residual, relu)
    epilogue = Epilogue(residual, relu) if (with_residual or relu) else None
    x = tsp.SparseTensor(feats, coords)
    with torch.no_grad():
        in_kernel = conv3d(x, weight, 1, bias=bias, epilogue=epilogue).F
    kernel_route = tsp.backends.cpu_kernels != "none"
    assert len(kernel_calls) == int(kernel_route)
    w = weight.clone().requires_grad_(True)
    with_graph = conv3d(x, w, 1, bias=bias, epilogue=epilogue).F  # addmm: autograd needs the graph
    assert len(kernel_calls) == int(kernel_route)
    assert in_kernel.dtype == with_graph.dtype == dtype
    assert rel(in_kernel, expected) < TOLERANCE[dtype]
    assert rel(with_graph.detach(), expected) < TOLERANCE[dtype]


def test_pointwise_residual_rows_are_checked(seed, gen):
    coords = lidar_coords(seed)
    x = tsp.SparseTensor(torch.randn(len(coords), 4, generator=gen), coords)
    with torch.no_grad(), pytest.raises(ValueError, match="epilogue residual has"):
        conv3d(x, torch.randn(1, 4, 6, generator=gen), 1, epilogue=Epilogue(torch.randn(len(coords) - 1, 6), True))


def test_small_pointwise_convs_keep_addmm(seed, gen, kernel_calls, monkeypatch):
    """Below POINTWISE_KERNEL_MIN_MACS multiply-adds torch.addmm is as fast: it runs there."""
    coords = lidar_coords(seed)
    x = tsp.SparseTensor(torch.randn(len(coords), 8, generator=gen), coords)
    weight = torch.randn(1, 8, 12, generator=gen)
    monkeypatch.setattr(epilogue_module, "POINTWISE_KERNEL_MIN_MACS", len(coords) * 8 * 12 + 1)
    with torch.no_grad():
        small = conv3d(x, weight, 1).F
    assert kernel_calls == []
    monkeypatch.setattr(epilogue_module, "POINTWISE_KERNEL_MIN_MACS", len(coords) * 8 * 12)
    with torch.no_grad():
        large = conv3d(x, weight, 1).F
    assert len(kernel_calls) == int(tsp.backends.cpu_kernels != "none")
    expected = oracle(x.F, weight, None, None, False)
    assert rel(small, expected) < 1e-5 and rel(large, expected) < 1e-5


@pytest.mark.parametrize("emulated", [False, True])
def test_bf16_pointwise_avoids_emulated_aten_gemms(seed, gen, kernel_calls, monkeypatch, emulated):
    """Where ATen's bfloat16 GEMM is its reference loop (~100x below float32), a bfloat16 1x1x1
    conv takes the kernel at any size, and with autograd a float32 GEMM; elsewhere addmm below
    the size threshold. Every route matches the float64 oracle."""
    monkeypatch.setattr(epilogue_module, "bf16_gemm_emulated", lambda t: emulated and t.dtype == torch.bfloat16)
    monkeypatch.setattr(epilogue_module, "POINTWISE_KERNEL_MIN_MACS", 1 << 40)
    mms = []
    real_addmm, real_mm = torch.addmm, torch.Tensor.__matmul__
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: mms.append(a[1].dtype) or real_addmm(*a, **k))
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: mms.append(a.dtype) or real_mm(a, b))
    coords = lidar_coords(seed)
    feats = torch.randn(len(coords), 24, generator=gen).bfloat16()
    weight = torch.randn(1, 24, 40, generator=gen).bfloat16()
    bias = torch.randn(40, generator=gen).bfloat16()
    expected = oracle(feats, weight, bias, None, False)
    x = tsp.SparseTensor(feats, coords)
    with torch.no_grad():
        out = conv3d(x, weight, 1, bias=bias).F
    kernel = emulated and tsp.backends.cpu_kernels != "none"
    assert len(kernel_calls) == int(kernel)
    w = weight.clone().requires_grad_(True)
    with_graph = conv3d(x, w, 1, bias=bias).F
    with_graph.float().sum().backward()
    # ATen GEMMs in bfloat16 only where they are not emulated (the kernel and float32 GEMMs otherwise).
    assert (torch.bfloat16 in mms) == (not emulated), mms
    assert out.dtype == with_graph.dtype == w.grad.dtype == torch.bfloat16
    assert rel(out, expected) < TOLERANCE[torch.bfloat16]
    assert rel(with_graph.detach(), expected) < TOLERANCE[torch.bfloat16]
    grad_expected = feats.double().t() @ torch.ones(len(coords), 40, dtype=torch.float64)
    assert rel(w.grad[0], grad_expected) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("c_in, c_out, with_residual, relu", [(16, 48, False, False), (64, 48, True, True),
                                                              (7, 33, False, True)])
def test_pointwise_training_route_matches_the_oracle(seed, gen, monkeypatch, dtype, c_in, c_out, with_residual, relu):
    """With autograd, a 1x1x1 conv above POINTWISE_TRAINING_KERNEL_MIN_MACS runs fetch_on_demand
    over identity pairs for the output and both gradients (set to 0 here: every size); forward,
    input, weight, bias and residual gradients meet float64 autograd of the oracle."""
    monkeypatch.setattr(epilogue_module, "POINTWISE_TRAINING_KERNEL_MIN_MACS", 0)
    wgrads = []
    real = ops.fetch_on_demand_wgrad
    monkeypatch.setattr(ops, "fetch_on_demand_wgrad", lambda *a: wgrads.append(a[0].shape) or real(*a))
    coords = lidar_coords(seed)
    n = len(coords)
    leaves = [torch.randn(n, c_in, generator=gen) * torch.rand(c_in, generator=gen),
              torch.randn(1, c_in, c_out, generator=gen), torch.randn(c_out, generator=gen),
              torch.randn(n, c_out, generator=gen)]
    ours = [t.to(dtype).requires_grad_(True) for t in leaves]
    ref = [t.detach().double().requires_grad_(True) for t in ours]
    grad_out = torch.randn(n, c_out, generator=gen).to(dtype)
    epilogue = Epilogue(ours[3] if with_residual else None, relu)
    y = conv3d(tsp.SparseTensor(ours[0], coords), ours[1], 1, bias=ours[2], epilogue=epilogue).F
    y.backward(grad_out)
    expected = oracle(ref[0], ref[1], ref[2], ref[3] if with_residual else None, False)
    if relu:  # our output's mask: in bfloat16 values near 0 may round to either side
        expected = expected * (y.detach() > 0)
    expected.backward(grad_out.double())
    assert len(wgrads) == int(tsp.backends.cpu_kernels != "none")
    assert y.dtype == dtype and rel(y.detach(), expected.detach()) < TOLERANCE[dtype]
    for name, a, b in zip(("feats", "weight", "bias", "residual"), ours, ref):
        if b.grad is None:
            assert a.grad is None, name
            continue
        assert a.grad.dtype == dtype and rel(a.grad, b.grad) < TOLERANCE[dtype], name
