"""Eval-time fusion (torchsparse_pp.nn.fuse): BatchNorm folded into conv weight and bias, ReLU and
residual sums in the conv's epilogue (inside the CPU fetch_on_demand kernel, torch ops
elsewhere). The fused model must equal the unfused one in eval mode within float rounding,
leave the original model alone, and refuse training."""
import contextlib
import copy
import itertools

import pytest
import torch
from torch import nn

import torchsparse_pp as tsp
from torchsparse_pp import ops
from torchsparse_pp.models import MinkUNet, VoxelResBackBone8x
from torchsparse_pp.models.blocks import FusedResidualBlock, ResidualBlock, conv_bn_relu
from torchsparse_pp.nn import BatchNorm, Conv3d, FusedConv3d, ReLU, fuse
from torchsparse_pp.nn.functional import ConvConfig, conv3d, default_config
from torchsparse_pp.nn.functional.epilogue import Epilogue
from conftest import lidar_coords, random_coords
from precision import assert_as_accurate_as_plain, rel_err


def randomise_norms(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """BatchNorm statistics and affine parameters away from identity, so folding is exercised."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.3)
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.2)
    return model


def assert_fused_as_accurate(model: nn.Module, fused: nn.Module, x: tsp.SparseTensor, out, ref, what: str):
    """``out`` (the fused model's) is as accurate as ``ref`` (the unfused model's, same
    precision) against the unfused model in float64: folding and epilogues reorder the
    rounding, never add to it beyond precision.FACTOR."""
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.replace_feats(x.F.double()))
    exact = exact.F if isinstance(exact, tsp.SparseTensor) else exact
    assert_as_accurate_as_plain(out, ref, exact, what=what)


def count_fused_kernel_calls(monkeypatch):
    calls = []
    real = ops.fetch_on_demand_forward_fused

    def counted(*args):
        calls.append(args[-1])
        return real(*args)
    monkeypatch.setattr(ops, "fetch_on_demand_forward_fused", counted)
    return calls


def test_fused_minkunet_equals_unfused(gen, monkeypatch):
    torch.manual_seed(int(torch.randint(0, 2 ** 31, (1,), generator=gen)))
    model = randomise_norms(MinkUNet(4, 7, cr=0.25), gen).eval()
    coords = lidar_coords(int(torch.randint(0, 1000, (1,), generator=gen)), batch=2, voxel=0.1, box=40)
    x = tsp.SparseTensor(torch.randn(len(coords), 4, generator=gen), coords)
    calls = count_fused_kernel_calls(monkeypatch)
    fused = fuse(model)
    with torch.no_grad():
        ref, out = model(x), fused(x)
    assert_fused_as_accurate(model, fused, x, out, ref, "fused MinkUNet")
    # Every Conv3d became a fused conv; every residual block's sum and ReLU run in a kernel.
    assert not any(type(m) is Conv3d or isinstance(m, (BatchNorm, ResidualBlock)) for m in fused.modules())
    blocks = sum(isinstance(m, FusedResidualBlock) for m in fused.modules())
    assert blocks == sum(isinstance(m, ResidualBlock) for m in model.modules()) > 0
    assert len(calls) > 0 and any(calls), "the CPU fetch_on_demand epilogue kernel was not used"


def test_fused_centerpoint_backbone_equals_unfused(gen):
    torch.manual_seed(int(torch.randint(0, 2 ** 31, (1,), generator=gen)))
    model = randomise_norms(VoxelResBackBone8x(5), gen).eval()
    coords = random_coords(gen, 3000, batch=2, low=0, high=40)  # 40^3: deep enough for 8x + conv_out
    x = tsp.SparseTensor(torch.randn(len(coords), 5, generator=gen), coords, spatial_range=(40, 40, 40))
    fused = fuse(model)
    with torch.no_grad():
        ref, out = model(x), fused(x)
    assert torch.equal(out.C, ref.C)
    assert_fused_as_accurate(model, fused, x, out.F, ref.F, "fused backbone")


@pytest.mark.parametrize("config", [ConvConfig("gather_scatter"), ConvConfig("implicit_gemm", sorted=True),
                                    ConvConfig("fetch_on_demand")])
def test_fused_equals_unfused_on_every_dataflow_and_in_grad_mode(config, gen):
    """Other dataflows (and any call that needs the autograd graph) run the epilogue as torch
    ops; the result is the same."""
    block = randomise_norms(ResidualBlock(6, 9), gen).eval()
    coords = random_coords(gen, 400, batch=2)
    x = tsp.SparseTensor(torch.randn(len(coords), 6, generator=gen), coords)
    fused = fuse(nn.Sequential(block))
    with default_config(config):
        ref = block(x).F.detach()
        out = fused(x.replace_feats(x.F.clone().requires_grad_(True)))  # grad mode: torch-ops epilogue
        with torch.no_grad():
            out_kernel = fused(x)
    assert_fused_as_accurate(block, fused, x, out.F, ref, "fused block, torch-ops epilogue")
    assert_fused_as_accurate(block, fused, x, out_kernel.F, ref, "fused block")
    out.F.sum().backward()  # the fused layers are differentiable in their inputs


def test_bfloat16_fused_equals_unfused(gen):
    model = randomise_norms(nn.Sequential(conv_bn_relu(4, 16, 3), ResidualBlock(16, 24), ResidualBlock(24, 24)),
                            gen).eval()
    coords = lidar_coords(int(torch.randint(0, 1000, (1,), generator=gen)), batch=1)
    x = tsp.SparseTensor(torch.randn(len(coords), 4, generator=gen), coords)
    fused = fuse(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref, out = model(x).F, fused(x).F
    assert out.dtype == torch.bfloat16
    assert_fused_as_accurate(model, fused, x, out, ref, "fused bf16 layers")


def test_fuse_leaves_the_model_alone_and_refuses_training(gen):
    model = randomise_norms(MinkUNet(4, 5, cr=0.125), gen).train()
    state = copy.deepcopy(model.state_dict())
    fused = fuse(model)
    assert model.training and not fused.training
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert sum(isinstance(m, FusedConv3d) for m in fused.modules()) > 0
    with pytest.raises(RuntimeError, match=r"a fused model .* is for inference"):
        fused.train()
    fused.eval()  # allowed


def test_folding_is_exact_for_single_layers(gen):
    coords = random_coords(gen, 300, batch=2)
    x = tsp.SparseTensor(torch.randn(len(coords), 3, generator=gen, dtype=torch.float64), coords)
    for conv in (Conv3d(3, 4, 3, bias=True), Conv3d(3, 4, 2, stride=2), Conv3d(3, 4, 1)):
        seq = randomise_norms(nn.Sequential(conv, BatchNorm(4), ReLU(True)), gen).double().eval()
        fused = fuse(seq)
        assert len(fused) == 1 and isinstance(fused[0], FusedConv3d) and fused[0].relu
        with torch.no_grad():
            assert rel_err(fused(x).F, seq(x).F) < 1e-12  # float64: folding rounds at 1e-16


def test_norm_without_running_stats_is_not_folded(gen):
    seq = nn.Sequential(Conv3d(3, 4, 3), BatchNorm(4, track_running_stats=False), ReLU(True)).eval()
    fused = fuse(seq)
    assert isinstance(fused[0], FusedConv3d) and fused[0].bias is None and not fused[0].relu
    assert isinstance(fused[1], BatchNorm) and isinstance(fused[2], ReLU)
    coords = random_coords(gen, 200)
    x = tsp.SparseTensor(torch.randn(len(coords), 3, generator=gen), coords)
    with torch.no_grad():
        assert_fused_as_accurate(seq, fused, x, fused(x).F, seq(x).F, "conv without a folded norm")


def test_residual_must_share_the_output_coordinates(gen):
    conv = FusedConv3d(Conv3d(3, 3, 3))
    coords = random_coords(gen, 100)
    x = tsp.SparseTensor(torch.randn(len(coords), 3, generator=gen), coords)
    other = tsp.SparseTensor(torch.randn(len(coords), 3, generator=gen), coords.clone())
    with pytest.raises(ValueError, match=r"residual is added on the output's coordinates"):
        conv(x, residual=other)
    with pytest.raises(TypeError, match=r"residual must be a SparseTensor"):
        conv(x, residual=x.F)
    with pytest.raises(ValueError, match=r"epilogue residual must be \[N_out, 3\]"):
        conv3d(x, torch.randn(27, 3, 3), 3, epilogue=Epilogue(torch.randn(len(coords), 5)))


def test_fused_op_rejects_bad_epilogue_operands(gen):
    coords = random_coords(gen, 100)
    x = tsp.SparseTensor(torch.randn(len(coords), 3, generator=gen), coords)
    conv3d(x, torch.randn(27, 3, 4), 3, config=ConvConfig("fetch_on_demand"))
    kmap = next(k for _, k in x.cache.maps())
    p = kmap.pairs_sorted_by("out")
    args = (x.F, torch.randn(27, 3, 4), p.in_idx, p.out_idx, p.offsets, p.identity, len(coords))
    with pytest.raises(RuntimeError, match=r"bias must be a CPU vector of C_out = 4"):
        ops.fetch_on_demand_forward_fused(*args, torch.randn(5), None, False)
    with pytest.raises(RuntimeError, match=r"residual must be \[num_dst, C_out\]"):
        ops.fetch_on_demand_forward_fused(*args, None, torch.randn(len(coords), 3), True)
    with pytest.raises(RuntimeError, match=r"residual must be a CPU tensor of the feats' dtype"):
        ops.fetch_on_demand_forward_fused(*args, None, torch.randn(len(coords), 4, dtype=torch.float64), True)


@contextlib.contextmanager
def cpu_kernels(isa: str):
    """Runs the block with the CPU kernels of instruction set ``isa`` (skips where the CPU lacks it)."""
    if isa not in tsp.backends.available_cpu_kernels():
        pytest.skip(f"this CPU lacks {isa}")
    start = tsp.backends.cpu_kernels
    tsp.backends.cpu_kernels = isa
    try:
        yield
    finally:
        tsp.backends.cpu_kernels = start


@pytest.mark.parametrize("isa", ["avx512", "avx2", "none"])
@pytest.mark.parametrize("c_out", [7, 16, 29, 48, 70])
def test_bfloat16_epilogue_rounds_as_torch(isa, c_out, gen):
    """Small-integer features and weights make every float sum exact in any order, so the fused
    bf16 kernel's only rounding is its epilogue: bias, residual, ReLU in float, then to bfloat16.
    That must equal torch's own float ops and .to(bfloat16) bit for bit (ties to even included),
    on every instruction set (AVX-512 runs its own epilogue loop, the others the generic one)."""
    with cpu_kernels(isa):
        coords = lidar_coords(int(torch.randint(0, 1000, (1,), generator=gen)), batch=1)
        c_in = int(torch.randint(3, 40, (1,), generator=gen))
        feats = torch.randint(-8, 9, (len(coords), c_in), generator=gen).float()
        weight = torch.randint(-8, 9, (27, c_in, c_out), generator=gen).float()
        bias = (torch.randn(c_out, generator=gen) * 30).bfloat16()
        residual = (torch.randn(len(coords), c_out, generator=gen) * 50).bfloat16()
        config = ConvConfig("fetch_on_demand")
        with torch.no_grad():
            sums = conv3d(tsp.SparseTensor(feats, coords), weight, 3, config=config).F
            assert sums.abs().max() < 2 ** 24  # exact in float32
            for b, r, relu in itertools.product((bias, None), (residual, None), (True, False)):
                out = conv3d(tsp.SparseTensor(feats.bfloat16(), coords), weight.bfloat16(), 3, bias=b,
                             config=config, epilogue=Epilogue(r, relu)).F
                ref = sums if b is None else sums + b.float()
                ref = ref if r is None else ref + r.float()
                ref = (ref.relu() if relu else ref).bfloat16()
                assert out.dtype == torch.bfloat16 and torch.equal(out, ref), (b is not None, r is not None, relu)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "none"])
@pytest.mark.parametrize("c_out", [37, 48])  # the AVX-512 epilogue's row loop, and its flat one (16 | C)
def test_bfloat16_epilogue_keeps_denormals_and_nan(isa, c_out, gen):
    """The epilogue's rounding on values the CPU's bf16 conversion treats otherwise: a denormal
    bias on rows whose sum is exactly 0 must come out as that denormal, bit for bit as torch
    rounds (the instruction would flush it), and a NaN in the residual as a NaN (c10's scalar
    rounding gives 0x7FC0, torch's vectorised one keeps the payload: only NaN-ness is compared)."""
    with cpu_kernels(isa):
        coords = lidar_coords(int(torch.randint(0, 1000, (1,), generator=gen)), batch=1)
        # Entries in {-1, 0, 1} over 2 channels: many rows sum to exactly 0.
        feats = torch.randint(-1, 2, (len(coords), 2), generator=gen).float()
        weight = torch.randint(-1, 2, (27, 2, c_out), generator=gen).float()
        tiny = torch.tensor(2.0 ** -130).bfloat16()  # a bfloat16 (and float32) denormal
        sign = torch.randint(0, 2, (c_out,), generator=gen).float() * 2 - 1
        bias = (sign * tiny.float()).bfloat16()
        residual = torch.randn(len(coords), c_out, generator=gen).bfloat16()
        nan_at = torch.rand(len(coords), c_out, generator=gen) < 0.05
        residual[nan_at] = float("nan")
        config = ConvConfig("fetch_on_demand")
        with torch.no_grad():
            sums = conv3d(tsp.SparseTensor(feats, coords), weight, 3, config=config).F
            assert (sums == 0).float().mean() > 0.05
            out = conv3d(tsp.SparseTensor(feats.bfloat16(), coords), weight.bfloat16(), 3, bias=bias,
                         config=config, epilogue=Epilogue(None, False)).F
            ref = (sums + bias.float()).bfloat16()
            assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
            assert (out[sums == 0].float().abs() == tiny.float()).all()
            out = conv3d(tsp.SparseTensor(feats.bfloat16(), coords), weight.bfloat16(), 3, config=config,
                         epilogue=Epilogue(residual, False)).F
            ref = (sums + residual.float()).bfloat16()
            assert torch.equal(out.isnan(), nan_at) and torch.equal(ref.isnan(), nan_at)
            assert torch.equal(out[~nan_at].view(torch.int16), ref[~nan_at].view(torch.int16))
