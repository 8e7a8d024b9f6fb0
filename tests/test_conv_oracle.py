"""Every convolution variant against the dense conv3d / conv_transpose3d oracle.

Forward, input gradient (dgrad) and weight gradient (wgrad) are compared in float32 against
the float64 dense reference (norm-wise relative error < 1e-5); output coordinate sets are
compared against sets derived from dense occupancy grids.
"""
import itertools

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp.nn.functional import conv3d
from conftest import lidar_coords, random_coords, triple as _t
from oracle import reference_conv, reference_output_coords
from precision import assert_as_accurate_as_rounded, rel_err

KERNELS = [1, 2, 3, 5, (3, 1, 1), (1, 3, 3)]
STRIDES = [2, 3, (2, 1, 1)]
DILATIONS = [1, 2]
CHANNELS = [1, 3, 16, 33]
TOLERANCE = 1e-5


def volume(kernel):
    kx, ky, kz = _t(kernel)
    return kx * ky * kz


def padding_for(kernel, dilation, rule: str):
    """'auto' = library default; 'zero'; 'full' = d*(k-1) (every q with any p in reach)."""
    if rule == "auto":
        return None
    if rule == "zero":
        return 0
    return tuple(d * (k - 1) for k, d in zip(_t(kernel), _t(dilation)))


def resolved_padding(kernel, dilation, padding):
    if padding is None:
        return tuple(d * (k - 1) // 2 if k % 2 else 0 for k, d in zip(_t(kernel), _t(dilation)))
    return _t(padding)


def run_case(x: tsp.SparseTensor, kernel, stride, dilation, padding, c_out, generator, *,
             transposed=False, generative=False, mode="spconv", oracle_in=None):
    """Runs our conv with autograd and the dense oracle; returns (ours, errors)."""
    c_in = x.num_channels
    weight = torch.randn(volume(kernel), c_in, c_out, generator=generator)
    feats = x.F.detach().clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    y = conv3d(x.replace_feats(feats), w, kernel, None, stride, dilation, padding,
               transposed=transposed, generative=generative, downsample_mode=mode)
    grad = torch.randn(y.F.shape, generator=generator)
    y.F.backward(grad)

    feats64 = x.F.detach().double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    ref = reference_conv(x.C, feats64, w64, y.C, kernel, stride, dilation,
                         resolved_padding(kernel, dilation, padding), transposed=transposed)
    ref.backward(grad.double())
    # Errors are relative to the same sums taken over absolute values: a float32 sum is accurate
    # relative to the size of its terms, and a sum of random terms can cancel to almost zero
    # (a 1x1 kernel with one channel makes wgrad a single such scalar).
    abs_feats = feats64.detach().abs().requires_grad_(True)
    abs_weight = w64.detach().abs().requires_grad_(True)
    magnitude = reference_conv(x.C, abs_feats, abs_weight, y.C, kernel, stride, dilation,
                               resolved_padding(kernel, dilation, padding), transposed=transposed)
    magnitude.backward(grad.double().abs())
    errors = {"forward": rel_err(y.F, ref, magnitude), "dgrad": rel_err(feats.grad, feats64.grad, abs_feats.grad),
              "wgrad": rel_err(w.grad, w64.grad, abs_weight.grad)}
    return y, errors


def assert_close(errors):
    bad = {k: v for k, v in errors.items() if not v < TOLERANCE}
    assert not bad, f"relative errors above {TOLERANCE}: {bad}"


def sparse_input(generator, case_index, stride=1, lidar=False, spatial_range=None):
    batch = 1 + case_index % 3
    c_in = CHANNELS[case_index % len(CHANNELS)]
    if lidar:
        coords = lidar_coords(int(torch.randint(0, 10_000, (1,), generator=generator)), batch=batch)
    else:
        coords = random_coords(generator, 70 * batch, batch=batch)
    if spatial_range is not None:
        coords = coords.clone()
        coords[:, 1:] -= coords[:, 1:].amin(0)
        spatial_range = tuple(int(v) + 1 + spatial_range for v in coords[:, 1:].amax(0))
    feats = torch.randn(coords.shape[0], c_in, generator=generator)
    return tsp.SparseTensor(feats, coords, stride=stride, spatial_range=spatial_range)


SUBMANIFOLD_CASES = [(k, d, pad) for k in KERNELS for d in DILATIONS for pad in ("auto", "zero")]


@pytest.mark.parametrize("index,case", list(enumerate(SUBMANIFOLD_CASES)), ids=str)
def test_submanifold(index, case, generator):
    kernel, dilation, rule = case
    x = sparse_input(generator, index, lidar=index % 4 == 1)
    y, errors = run_case(x, kernel, 1, dilation, padding_for(kernel, dilation, rule),
                         CHANNELS[(index + 1) % len(CHANNELS)], generator)
    assert y.C is x.C and y.s == x.s
    assert_close(errors)


STRIDED_CASES = list(itertools.product(KERNELS, STRIDES, DILATIONS, ["spconv", "minkowski"]))


@pytest.mark.parametrize("index,case", list(enumerate(STRIDED_CASES)), ids=str)
def test_strided(index, case, generator):
    kernel, stride, dilation, mode = case
    rule = ("auto", "zero", "full")[index % 3]
    clip = mode == "spconv" and index % 4 == 0  # some spconv cases clip to a spatial_range
    x = sparse_input(generator, index, lidar=index % 5 == 2, spatial_range=1 if clip else None)
    padding = padding_for(kernel, dilation, rule)
    y, errors = run_case(x, kernel, stride, dilation, padding, CHANNELS[(index + 2) % 4], generator, mode=mode)
    expected = reference_output_coords(x.C, kernel, stride, dilation, resolved_padding(kernel, dilation, padding),
                                       mode, x.spatial_range)
    assert torch.equal(y.C, expected)
    assert y.s == tuple(a * b for a, b in zip(x.s, _t(stride)))
    assert_close(errors)


@pytest.mark.parametrize("index,case", list(enumerate(STRIDED_CASES)), ids=str)
def test_transposed(index, case, generator):
    kernel, stride, dilation, mode = case
    padding = padding_for(kernel, dilation, ("auto", "zero", "full")[index % 3])
    fine = sparse_input(generator, index, lidar=index % 5 == 3)
    down_weight = torch.randn(volume(kernel), fine.num_channels, 5, generator=generator)
    coarse = conv3d(fine, down_weight, kernel, None, stride, dilation, padding, downsample_mode=mode)
    y, errors = run_case(coarse.replace_feats(coarse.F.detach()), kernel, stride, dilation, padding,
                         CHANNELS[index % 4], generator, transposed=True)
    assert y.C is fine.C and y.s == fine.s
    assert_close(errors)


GENERATIVE_CASES = list(itertools.product(KERNELS, STRIDES + [1], DILATIONS))


@pytest.mark.parametrize("index,case", list(enumerate(GENERATIVE_CASES)), ids=str)
def test_generative(index, case, generator):
    kernel, stride, dilation = case
    padding = padding_for(kernel, dilation, ("auto", "zero", "full")[index % 3])
    x = sparse_input(generator, index, stride=6, spatial_range=2 if index % 4 == 0 else None)
    y, errors = run_case(x, kernel, stride, dilation, padding, CHANNELS[(index + 3) % 4], generator,
                         transposed=True, generative=True)
    expected = reference_output_coords(x.C, kernel, stride, dilation, resolved_padding(kernel, dilation, padding),
                                       "generative", x.spatial_range)
    assert torch.equal(y.C, expected)
    assert y.s == tuple(6 // s for s in _t(stride))
    assert_close(errors)


def test_bias_and_chained_layers(generator):
    """A stack of convs, biases included, equals the chained dense oracle."""
    x = sparse_input(generator, 2, lidar=True)
    w1 = torch.randn(27, x.num_channels, 8, generator=generator, dtype=torch.float64)
    b1 = torch.randn(8, generator=generator, dtype=torch.float64)
    w2 = torch.randn(8, 8, 4, generator=generator, dtype=torch.float64)
    x64 = x.double()
    y1 = conv3d(x64, w1, 3, b1)
    y2 = conv3d(y1, w2, 2, None, 2)
    r1 = reference_conv(x.C, x64.F, w1, y1.C, 3, 1, 1, 1) + b1
    r2 = reference_conv(y1.C, r1, w2, y2.C, 2, 2, 1, 0)
    assert rel_err(y2.F, r2) < 1e-12


def test_bfloat16_matches_oracle(generator):
    x = sparse_input(generator, 1, lidar=True)
    w = torch.randn(27, x.num_channels, 16, generator=generator)
    y = conv3d(x.bfloat16(), w.bfloat16(), 3)
    ref = reference_conv(x.C, x.bfloat16().F.double(), w.bfloat16().double(), y.C, 3, 1, 1, 1)
    assert y.F.dtype == torch.bfloat16
    assert_as_accurate_as_rounded(y.F, ref, what="bf16 conv")
