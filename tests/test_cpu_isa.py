"""torchsparse_pp.backends.cpu_kernels: the CPU register kernels' instruction set, chosen at run
time. Every instruction set this CPU has runs fetch_on_demand and implicit GEMM (forward, dgrad,
wgrad; float32 and bfloat16) against the float64 dense oracle on LiDAR-like crops, and float32
forward and dgrad are bit-identical between the AVX-512 and AVX2 register kernels (they sum in one
order); their weight gradients sum pairs in different groups and agree within rounding."""
import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp.nn.functional import ConvConfig
from dataflow_cases import library_abs_sums, lidar_scene, oracle_errors, rel_to

CONFIGS = [ConvConfig("fetch_on_demand"), ConvConfig("implicit_gemm", sorted=True, split_mask_num=2),
           ConvConfig("implicit_gemm", sorted=False, split_mask_num=0)]
# Narrow W (the AVX2 narrow kernel's K <= 12 / <= 6), odd K, a masked last vector, > 16 columns,
# the AVX2 one-pass kernel's 1-4 vectors of output columns (forward and dgrad, masked and not)
# and its two blocks for 48 and 64, and widths at and above the AVX2 register weight gradient's
# 128 x 64 limit.
CHANNELS = [(4, 16), (5, 7), (12, 8), (16, 16), (20, 8), (24, 29), (19, 70), (32, 32), (48, 64), (40, 33),
            (64, 128), (96, 96)]
# Norm-wise, relative to the sums over absolute values (dataflow_cases.oracle_errors): float32
# sums of any order stay far under 1e-5; bfloat16 results round each output, and gather_scatter
# each offset's product, once: at most 2 x 2^-8 of that scale element by element, a bound.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture
def restore_cpu_kernels():
    start = tsp.backends.cpu_kernels
    yield
    tsp.backends.cpu_kernels = start


def test_cpu_kernels_switch_checks_its_values(restore_cpu_kernels):
    assert tsp.backends.cpu_kernels in ("avx512", "avx2", "none")
    start, dot = tsp.backends.cpu_kernels, tsp.ops.cpu_bf16_dot()
    available = tsp.backends.available_cpu_kernels()
    assert start in available and available[-1] == "none"
    # Probing leaves the choice as it was, the bf16 dot kernels included.
    assert tsp.ops.cpu_register_isa() == start and tsp.ops.cpu_bf16_dot() == dot
    for bad in ("sse", "AVX2", 2, None, True):
        with pytest.raises(ValueError, match="cpu_kernels must be one of"):
            tsp.backends.cpu_kernels = bad
    if "avx512" not in tsp.backends.available_cpu_kernels():
        with pytest.raises(ValueError, match="lacks AVX-512"):
            tsp.backends.cpu_kernels = "avx512"
    tsp.backends.cpu_kernels = "none"
    assert tsp.backends.cpu_kernels == "none" and not tsp.ops.cpu_register_kernels()
    assert tsp.ops.cpu_register_isa() == "none"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_isa_matches_the_oracle(restore_cpu_kernels, gen, dtype):
    coords = lidar_scene(int(torch.randint(0, 4, (1,), generator=gen)))
    geom = {"kernel_size": 3}
    results = {}
    for isa in tsp.backends.available_cpu_kernels():
        tsp.backends.cpu_kernels = isa
        for c_in, c_out in CHANNELS:
            feats = (torch.randn(len(coords), c_in, generator=gen) * (1 + torch.rand(c_in, generator=gen))).to(dtype)
            weight = (torch.randn(27, c_in, c_out, generator=gen) / c_in ** 0.5).to(dtype)
            x = tsp.SparseTensor(feats, coords)
            for i, config in enumerate(CONFIGS):
                g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,), generator=gen)))
                y, errors = oracle_errors(x, weight, geom, config, g)
                bad = {k: v for k, v in errors.items() if not v < TOLERANCE[dtype]}
                assert not bad, f"{isa} {config} C {c_in}->{c_out} {dtype}: {errors}"
                results[(isa, c_in, i)] = y.F
    if dtype == torch.float32 and "avx512" in results and "avx2" in results:
        for (isa, c_in, i), out in results.items():
            if isa == "avx512":
                assert torch.equal(out, results[("avx2", c_in, i)]), (c_in, CONFIGS[i])


def test_avx2_float32_kernels_are_bit_identical_to_avx512(restore_cpu_kernels, gen):
    """Forward and dgrad of both kernel sets, same operands, equal bits. The weight gradients
    (fetch_on_demand's, and implicit GEMM's over its table's pairs: AVX-512 sums each chunk of
    pairs in registers, AVX2 groups of up to 64 pairs, or the tiles above 128 x 64) agree within
    float32 rounding."""
    if not {"avx512", "avx2"} <= set(tsp.backends.available_cpu_kernels()):
        pytest.skip("needs a CPU with AVX-512 (the AVX2 kernels run on it too)")
    coords = lidar_scene(int(torch.randint(0, 4, (1,), generator=gen)))
    outs = {}
    for isa in ("avx512", "avx2"):
        tsp.backends.cpu_kernels = isa
        for c_in, c_out in CHANNELS:
            g = torch.Generator().manual_seed(c_in * 100 + c_out)
            feats = torch.randn(len(coords), c_in, generator=g).requires_grad_(True)
            weight = torch.randn(27, c_in, c_out, generator=g).requires_grad_(True)
            for config in CONFIGS:
                y = tsp.nn.functional.conv3d(tsp.SparseTensor(feats, coords), weight, 3, config=config)
                grad = torch.randn(y.F.shape, generator=g)
                y.F.backward(grad)
                # float32 sums in other orders: relative to the same sums over absolute values.
                _, _, magnitude = library_abs_sums(tsp.SparseTensor(feats.detach(), coords), weight, {"kernel_size": 3},
                                                   grad)
                outs.setdefault(isa, []).append((config, y.F.detach(), feats.grad.clone(), weight.grad.clone(),
                                                 magnitude))
                feats.grad = weight.grad = None
    for (config, *a), (_, *b) in zip(outs["avx512"], outs["avx2"]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), config
        assert 0 < b[2].abs().max()
        err = rel_to(a[2], b[2], b[3])
        assert err < TOLERANCE[torch.float32], (config, err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_output_channels_give_empty_outputs(restore_cpu_kernels, gen, dtype):
    """C_out = 0 on every instruction set and dataflow: an [N, 0] output, a zero input gradient
    and an empty weight gradient (the AVX2 kernels once divided by their number of 16-column
    passes, 0, and the one-pass kernel wrote a full vector per row)."""
    coords = lidar_scene(int(torch.randint(0, 4, (1,), generator=gen)))
    for isa in tsp.backends.available_cpu_kernels():
        tsp.backends.cpu_kernels = isa
        for config in CONFIGS + [ConvConfig("gather_scatter")]:
            for c_in in (5, 16, 48):
                feats = torch.randn(len(coords), c_in, generator=gen).to(dtype).requires_grad_(True)
                weight = torch.randn(27, c_in, 0, generator=gen).to(dtype).requires_grad_(True)
                y = tsp.nn.functional.conv3d(tsp.SparseTensor(feats, coords), weight, 3, config=config)
                assert y.F.shape == (len(coords), 0) and y.F.dtype == dtype, (isa, config, c_in)
                y.F.sum().backward()
                assert torch.equal(feats.grad, torch.zeros_like(feats)), (isa, config, c_in)
                assert weight.grad.shape == weight.shape, (isa, config, c_in)
