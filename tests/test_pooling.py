"""Local pooling over kernel maps, and global pooling, against dense torch oracles.

Local pooling of output q reads the inputs p = q*s - pad + delta*d that are present. The dense
oracle uses oracle.Frame to place inputs on a grid whose index u is coordinate u + o, so
that plain (unpadded) dense pooling with stride s and dilation d evaluates exactly that
relation at coarse index q - m:
- max: empty sites hold -inf, torch.nn.functional.max_pool3d, -inf (no neighbour) -> 0;
- avg: depthwise conv3d with a ones kernel (sum) over conv3d of the occupancy grid (count).
"""
import os

import pytest
import torch
import torch.nn.functional as TF

import torchsparse_pp as tsp
from torchsparse_pp.nn import AvgPool3d, Conv3d, GlobalAvgPool, GlobalMaxPool, MaxPool3d
from torchsparse_pp.nn import functional as SF
from conftest import shuffled_coords, triple as _t
from oracle import Frame, reference_conv, reference_output_coords, sort_coords

EXACT = dict(rtol=1e-10, atol=1e-10)


def _bounds(coords):
    c = coords.long()[:, 1:]
    return c.amin(0).tolist(), c.amax(0).tolist()


def dense_pool(in_coords, feats, out_coords, kernel, stride, dilation, padding, kind):
    """Dense oracle of local max / avg pooling at ``out_coords`` (differentiable in feats)."""
    flo, fhi = _bounds(in_coords)
    clo, chi = _bounds(out_coords)
    frame = Frame(flo, fhi, clo, chi, kernel, stride, dilation, padding)
    batch = int(max(in_coords[:, 0].max(), out_coords[:, 0].max())) + 1
    channels = feats.shape[1]
    index = frame.fine_index(in_coords)
    k, s, d = frame.k, frame.s, frame.d
    if kind == "max":
        grid = feats.new_full((batch, *frame.fine_size, channels), float("-inf")).index_put(index, feats)
        pooled = TF.max_pool3d(grid.permute(0, 4, 1, 2, 3), k, s, 0, d)
        values = pooled.permute(0, 2, 3, 4, 1)[frame.coarse_index(out_coords)]
        return torch.where(torch.isinf(values), torch.zeros_like(values), values)
    grid = feats.new_zeros((batch, *frame.fine_size, channels)).index_put(index, feats)
    occupancy = feats.new_zeros((batch, *frame.fine_size, 1)).index_put(index, feats.new_ones(len(feats), 1))
    sums = TF.conv3d(grid.permute(0, 4, 1, 2, 3), feats.new_ones(channels, 1, *k), stride=s, dilation=d,
                     groups=channels)
    counts = TF.conv3d(occupancy.permute(0, 4, 1, 2, 3), feats.new_ones(1, 1, *k), stride=s, dilation=d)
    sums = sums.permute(0, 2, 3, 4, 1)[frame.coarse_index(out_coords)]
    counts = counts.permute(0, 2, 3, 4, 1)[frame.coarse_index(out_coords)]
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))


def _dense_count(in_coords, out_coords, kernel, stride, dilation, padding):
    flo, fhi = _bounds(in_coords)
    clo, chi = _bounds(out_coords)
    frame = Frame(flo, fhi, clo, chi, kernel, stride, dilation, padding)
    batch = int(max(in_coords[:, 0].max(), out_coords[:, 0].max())) + 1
    occupancy = torch.zeros(batch, 1, *frame.fine_size, dtype=torch.float64)
    occupancy[(frame.fine_index(in_coords)[0], 0) + frame.fine_index(in_coords)[1:]] = 1
    counts = TF.conv3d(occupancy, torch.ones(1, 1, *frame.k, dtype=torch.float64), stride=frame.s,
                       dilation=frame.d)
    return counts[(frame.coarse_index(out_coords)[0], 0) + frame.coarse_index(out_coords)[1:]]


def resolved_padding(kernel, dilation, padding):
    if padding is None:
        return tuple(d * (k - 1) // 2 if k % 2 else 0 for k, d in zip(_t(kernel), _t(dilation)))
    return _t(padding)


# (kernel, stride (None = default = kernel), dilation, padding (None = default), mode)
CASES = [
    (3, 1, 1, None, "spconv"),               # submanifold k3
    (2, 2, 1, None, "spconv"),               # k2 s2
    (2, 2, 1, None, "minkowski"),
    (3, 2, 1, 1, "spconv"),                  # k3 s2 pad 1
    (3, 2, 1, 1, "minkowski"),
    ((3, 1, 1), (2, 1, 1), 1, None, "spconv"),
    ((3, 1, 1), (2, 1, 1), 1, None, "minkowski"),
    (3, 1, 2, None, "spconv"),               # dilation 2, submanifold
    (3, 2, 2, None, "spconv"),               # dilation 2, strided
    (3, None, 1, None, "spconv"),            # stride defaults to kernel_size (3)
    (2, 1, 2, 1, "spconv"),                  # stride 1, neighbourhood excludes q: empty outputs
]


def case_id(case):
    k, s, d, p, mode = case
    return f"k{k}-s{s}-d{d}-p{p}-{mode}".replace(" ", "")


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("use_module", [True, False], ids=["module", "functional"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_local_pool_matches_dense(gen, case, kind, use_module):
    kernel, stride, dilation, padding, mode = case
    coords = random_coords(gen)
    channels = 3
    feats = torch.randn(len(coords), channels, generator=gen, dtype=torch.float64)  # continuous: no ties
    ours_in = feats.clone().requires_grad_(True)
    x = tsp.SparseTensor(ours_in, coords, stride=(1, 2, 1))
    if use_module:
        cls = MaxPool3d if kind == "max" else AvgPool3d
        kwargs = {} if stride is None else {"stride": stride}
        pool = cls(kernel, dilation=dilation, padding=padding, downsample_mode=mode, **kwargs)
        y = pool(x)
    else:
        fn = SF.max_pool3d if kind == "max" else SF.avg_pool3d
        y = fn(x, kernel, stride, dilation, padding, mode)

    eff_stride = _t(kernel) if stride is None else _t(stride)
    pad = resolved_padding(kernel, dilation, padding)
    assert y.s == tuple(a * b for a, b in zip(x.s, eff_stride))
    if eff_stride == (1, 1, 1):
        assert y.C is coords
    else:
        expected_coords = reference_output_coords(coords, kernel, eff_stride, dilation, pad, mode)
        assert torch.equal(sort_coords(y.C), expected_coords)
    assert y.F.shape == (len(y.C), channels)

    ref_in = feats.clone().requires_grad_(True)
    expected = dense_pool(coords, ref_in, y.C, kernel, eff_stride, dilation, pad, kind)
    torch.testing.assert_close(y.F, expected, **EXACT)

    counts = _dense_count(coords, y.C, kernel, eff_stride, dilation, pad)
    if case == CASES[-1]:
        # This geometry leaves some outputs without any neighbour: they must be exactly 0.
        assert (counts == 0).any() and (counts > 1).any()
        assert (y.F[counts == 0] == 0).all()
    if kind == "avg":
        # Absent sites do not count: the mean differs from the sum over the full kernel volume.
        assert (counts < torch.tensor(_t(kernel)).prod()).any()

    grad_out = torch.randn(y.F.shape, generator=gen, dtype=torch.float64)
    (y.F * grad_out).sum().backward()
    (expected * grad_out).sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad, **EXACT)


def test_max_pool_gradient_goes_to_argmax(gen):
    """Brute force: each output's gradient lands on the input holding the max of its window."""
    coords = random_coords(gen, per_batch=(80, 60), low=-3, high=5)
    feats = torch.randn(len(coords), 2, generator=gen, dtype=torch.float64)
    leaf = feats.clone().requires_grad_(True)
    y = SF.max_pool3d(tsp.SparseTensor(leaf, coords), 3, 2, 1, 1)
    grad_out = torch.randn(y.F.shape, generator=gen, dtype=torch.float64)
    (y.F * grad_out).sum().backward()

    expected_grad = torch.zeros_like(feats)
    where = {tuple(c): i for i, c in enumerate(coords.tolist())}
    for row, (b, *q) in enumerate(y.C.tolist()):
        window = [where[key] for key in ((b, *(qa * 2 - 1 + da for qa, da in zip(q, delta)))
                                         for delta in ((i, j, l) for i in range(3) for j in range(3)
                                                       for l in range(3)))
                  if key in where]
        assert window  # spconv output set: every output has an input
        for c in range(feats.shape[1]):
            best = max(window, key=lambda i: feats[i, c].item())
            assert y.F[row, c].item() == feats[best, c].item()
            expected_grad[best, c] += grad_out[row, c]
    torch.testing.assert_close(leaf.grad, expected_grad, **EXACT)


def test_float32_pooling(gen):
    coords = random_coords(gen)
    feats = torch.randn(len(coords), 4, generator=gen)
    x = tsp.SparseTensor(feats, coords)
    for kind, fn in (("max", SF.max_pool3d), ("avg", SF.avg_pool3d)):
        y = fn(x, 2, 2)
        assert y.F.dtype == torch.float32
        expected = dense_pool(coords, feats.double(), y.C, 2, 2, 1, 0, kind)
        torch.testing.assert_close(y.F.double(), expected, rtol=1e-5, atol=1e-6)


def test_default_stride_is_kernel_size():
    assert MaxPool3d(2).stride == (2, 2, 2)
    assert AvgPool3d((3, 1, 1)).stride == (3, 1, 1)
    assert MaxPool3d(3, stride=1).stride == (1, 1, 1)
    assert MaxPool3d(3).padding == (1, 1, 1)


@pytest.mark.parametrize("mode", ["spconv", "minkowski"])
@pytest.mark.parametrize("pool_cls", [MaxPool3d, AvgPool3d])
def test_transposed_conv_restores_pooled_coordinates(gen, mode, pool_cls):
    coords = random_coords(gen)
    feats = torch.randn(len(coords), 3, generator=gen, dtype=torch.float64)
    x = tsp.SparseTensor(feats, coords)
    pooled = pool_cls(2, downsample_mode=mode)(x)
    maps_before = len(x.cache)
    up = Conv3d(3, 4, 2, stride=2, transposed=True).double()
    with torch.no_grad():
        up.kernel.copy_(torch.randn(up.kernel.shape, generator=gen, dtype=torch.float64))
    y = up(pooled)
    assert y.C is coords  # the same object: the pooling's map was used transposed
    assert y.s == (1, 1, 1)
    assert len(x.cache) == maps_before  # no new kernel map was built
    expected = reference_conv(pooled.C, pooled.F, up.kernel.detach(), coords, 2, 2, 1, 0, transposed=True)
    torch.testing.assert_close(y.F, expected, **EXACT)


def test_global_pools(gen):
    coords = random_coords(gen, per_batch=(40, 75, 9))
    feats = torch.randn(len(coords), 5, generator=gen, dtype=torch.float64) + coords[:, :1].double()
    a = feats.clone().requires_grad_(True)
    b = feats.clone().requires_grad_(True)
    x = tsp.SparseTensor(a, coords)
    avg = GlobalAvgPool()(x)
    mx = GlobalMaxPool()(x)
    assert avg.shape == mx.shape == (3, 5)
    batch = coords[:, 0].long()
    exp_avg = torch.stack([b[batch == i].mean(0) for i in range(3)])
    exp_max = torch.stack([b[batch == i].amax(0) for i in range(3)])
    torch.testing.assert_close(avg, exp_avg, **EXACT)
    torch.testing.assert_close(mx, exp_max, **EXACT)
    torch.testing.assert_close(SF.global_avg_pool(x), exp_avg, **EXACT)
    torch.testing.assert_close(SF.global_max_pool(x), exp_max, **EXACT)

    g1 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    g2 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    ((avg * g1).sum() + (mx * g2).sum()).backward()
    ((exp_avg * g1).sum() + (exp_max * g2).sum()).backward()
    torch.testing.assert_close(a.grad, b.grad, **EXACT)


def test_global_max_pool_all_negative(gen):
    """A sample whose features are all negative keeps its (negative) max: no implicit 0."""
    coords = random_coords(gen, per_batch=(20, 30))
    feats = -torch.rand(len(coords), 3, generator=gen, dtype=torch.float64) - 0.5
    out = GlobalMaxPool()(tsp.SparseTensor(feats, coords))
    batch = coords[:, 0].long()
    torch.testing.assert_close(out, torch.stack([feats[batch == i].amax(0) for i in range(2)]), **EXACT)
    assert (out < 0).all()


def random_coords(gen, per_batch=(260, 200), low=-6, high=10) -> torch.Tensor:
    return shuffled_coords(gen, per_batch, low, high)
