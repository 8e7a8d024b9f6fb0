"""The C++ BatchNorm kernels round exactly as their comments say: every product and sum in the
feature dtype on its own (no fused multiply-adds), sums over blocks of 64 rows folded into
double. Checked bit for bit against the same steps in torch float32 ops.

Why it matters: with the compiler free to fuse ``a*g + b*d + c`` into FMAs it fused them one way
in the vectorised loop and another in the scalar fallback that runtime alias checks pick, and
which one ran depended on where the heap put small buffers: a resumed training run then differed
from the uninterrupted one in the last bits (about one full test suite in five)."""
import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import ops

BLOCK = 64  # batch_norm_cpu.cpp kBlockRows


@pytest.fixture(params=tsp.backends.available_cpu_kernels())
def isa(request):
    """Each instruction set's float32 row loops ("avx2": the AVX2 intrinsics; "avx512" and
    "none": the AVX-512 ones where the CPU has them)."""
    start = tsp.backends.cpu_kernels
    tsp.backends.cpu_kernels = request.param
    yield request.param
    tsp.backends.cpu_kernels = start


def unpack(mask: torch.Tensor, channels: int) -> torch.Tensor:
    """batch_norm_apply_masked's int16 words as a bool [N, channels]."""
    bits = (mask.to(torch.int32)[:, :, None] >> torch.arange(16)) & 1
    return bits.reshape(mask.shape[0], -1)[:, :channels].bool()


def block_sums(values: torch.Tensor) -> torch.Tensor:
    """Per-column sums: row by row in the values' dtype within each block of 64 rows, blocks added
    in double."""
    total = torch.zeros(values.shape[1], dtype=torch.float64)
    for b0 in range(0, values.shape[0], BLOCK):
        acc = torch.zeros(values.shape[1], dtype=values.dtype)
        for row in values[b0:b0 + BLOCK]:
            acc = acc + row
        total += acc.double()
    return total


def cases(gen, channels):
    rows = 3 * BLOCK + 17
    x = torch.randn(rows, channels, generator=gen) * 2 + 0.5
    dy = torch.randn(rows, channels, generator=gen)
    weight = torch.rand(channels, generator=gen) + 0.5
    residual = torch.randn(rows, channels, generator=gen)
    return rows, x, dy, weight, residual


@pytest.mark.parametrize("channels", [3, 8, 16, 20, 48, 128, 144])
def test_stats_and_apply_round_step_by_step(seed, channels, isa):
    rows, x, _, weight, residual = cases(torch.Generator().manual_seed(seed), channels)
    mean, invstd, var = ops.batch_norm_stats(x, 1e-5)
    d = x - x[0]  # sums are shifted by the first row
    s1, s2 = block_sums(d), block_sums(d * d)
    dm = s1 / rows
    biased = (s2 / rows - dm * dm).clamp(min=0)
    assert torch.equal(mean, (x[0].double() + dm).float())
    assert torch.equal(invstd, (1.0 / torch.sqrt(biased + 1e-5)).float())
    assert torch.equal(var, (biased * rows / (rows - 1)).float())
    scale, shift = invstd * weight, weight - 1
    for res in (None, residual):
        for relu in (False, True):
            expected = x * scale + shift
            if res is not None:
                expected = expected + res
            if relu:
                expected = torch.relu(expected)
            assert torch.equal(ops.batch_norm_apply(x, scale, shift, res, relu), expected), (res is not None, relu)
        out, mask = ops.batch_norm_apply_masked(x, scale, shift, res)
        expected = x * scale + shift if res is None else x * scale + shift + res
        assert torch.equal(out, torch.relu(expected))
        assert mask.dtype == torch.int16 and mask.shape == (rows, (channels + 15) // 16)
        assert torch.equal(unpack(mask, channels), expected > 0)
        # Bits past the last channel stay clear.
        assert torch.equal(unpack(mask, mask.shape[1] * 16)[:, channels:], torch.zeros(rows, mask.shape[1] * 16 - channels,
                                                                                       dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channels", [3, 8, 16, 20, 48, 128, 144])
@pytest.mark.parametrize("act", ["none", "relu", "relu_residual"])
def test_backward_rounds_step_by_step(seed, channels, act, isa, dtype):
    """float32 runs each instruction set's vector loops, float64 the generic ones (the mask's bits
    and-ed into the values)."""
    rows, *tensors = cases(torch.Generator().manual_seed(seed), channels)
    x, dy, weight, residual = (t.to(dtype) for t in tensors)
    mean, invstd, _ = ops.batch_norm_stats(x, 1e-5)
    res = residual if act == "relu_residual" else None
    mask = None
    g = dy
    if act != "none":
        scale, shift = invstd * weight, -mean * invstd * weight
        out, mask = ops.batch_norm_apply_masked(x, scale, shift, res)
        pre = x * scale + shift
        if res is not None:
            pre = pre + res
        assert torch.equal(out, torch.relu(pre)) and torch.equal(unpack(mask, channels), pre > 0)
        g = torch.where(pre > 0, dy, torch.zeros_like(dy))
    grad_feats, grad_weight, grad_bias, grad_res = ops.batch_norm_backward(dy, x, mean, invstd, weight, mask,
                                                                           res is not None)
    sg, sgx = block_sums(g), block_sums(g * (x - mean))
    w, s = weight.double(), invstd.double()
    assert torch.equal(grad_bias, sg.to(dtype))
    assert torch.equal(grad_weight, (sgx * s).to(dtype))
    a, b, c = (w * s).to(dtype), (-w * s * s * s * sgx / rows).to(dtype), (-w * s * sg / rows).to(dtype)
    assert torch.equal(grad_feats, a * g + b * (x - mean) + c)
    if res is not None:
        assert torch.equal(grad_res, g)
