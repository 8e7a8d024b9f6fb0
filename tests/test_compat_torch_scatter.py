"""torchsparse_pp.compat.torch_scatter against torch_scatter's definitions, written here element
by element in float64: which elements reach which position (broadcasting, csr / coo segments),
the value of each reduction from a starting value (``out``'s, or none: empty positions 0, mul 1),
the argument of min / max (the first element reaching it strictly, ``src.size(dim)`` for none),
gradients (torch_scatter's: min / max to the winning element only), and the errors for inputs
torch_scatter rejects or would read out of bounds. Values are small integers where ties and
exact sums are wanted."""
import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch

from precision import assert_as_accurate_as_rounded
from torchsparse_pp.compat import torch_scatter as ts

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
REDUCTIONS = ["sum", "mean", "mul", "min", "max"]


def definition(src, dest, size, reduce, start=None):
    """Reference by the definition. ``dest``: the destination position along dim of every element
    of src, shaped like src, -1 for none; reduced along dim; returns (values, argument)."""
    s, d = src.double().cpu().numpy(), dest.cpu().numpy()
    dim = definition.dim
    shape = list(s.shape)
    shape[dim] = size
    values, arg = np.zeros(shape), np.full(shape, s.shape[dim], dtype=np.int64)
    base = None if start is None else start.double().cpu().numpy()
    groups = {}
    for pos in itertools.product(*map(range, s.shape)):  # ascending along dim within each group
        if d[pos] >= 0:
            key = pos[:dim] + (int(d[pos]),) + pos[dim + 1:]
            groups.setdefault(key, []).append((pos[dim], s[pos]))
    for key in itertools.product(*map(range, shape)):
        items = groups.get(key, [])
        first = None if base is None else base[key]
        vals = [v for _, v in items]
        if reduce == "sum":
            values[key] = (first or 0.0) + sum(vals)
        elif reduce == "mul":
            values[key] = (1.0 if first is None else first) * np.prod(vals)
        elif reduce == "mean":
            values[key] = ((first or 0.0) + sum(vals)) / max(len(vals), 1)
        else:
            better = (lambda a, b: a < b) if reduce == "min" else (lambda a, b: a > b)
            best, where = first, s.shape[dim]
            for e, v in items:
                if best is None or better(v, best):
                    best, where = v, e
            values[key], arg[key] = (0.0 if best is None else best), where
    return torch.from_numpy(values), torch.from_numpy(arg)


def small_ints(gen, shape, dtype, device):
    return torch.randint(-4, 5, shape, generator=gen).to(dtype).to(device)


def along(index, dim, ndim):
    """A 1-D index laid along ``dim`` of an ``ndim``-dimensional tensor."""
    return index.view([-1 if a == dim else 1 for a in range(ndim)])


def call(reduce, *args, **kwargs):
    fn = getattr(ts, f"scatter_{reduce}")
    return fn(*args, **kwargs) if reduce in ("min", "max") else (fn(*args, **kwargs), None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_scatter_reductions_match_the_definition(reduce, dim, dtype, device, gen):
    if dtype == torch.int64 and reduce == "mean":
        pytest.skip("integer means: test_integer_mean_floors")
    src = small_ints(gen, (4, 9, 3), dtype, device)
    d = dim % 3
    size = src.shape[d] + 2  # the last positions stay empty
    index = torch.randint(0, src.shape[d], (src.shape[d],), generator=gen).to(device)
    values, arg = call(reduce, src, index, dim=dim, dim_size=size)
    definition.dim = d
    want, want_arg = definition(src, along(index, d, 3).expand(src.shape), size, reduce)
    assert values.dtype == dtype and values.device.type == device
    assert torch.equal(values.cpu(), want.to(dtype))  # exact sums; a float32 mean rounds once
    if arg is not None:
        assert torch.equal(arg.cpu(), want_arg)
    assert torch.equal(ts.scatter(src, index, dim, dim_size=size, reduce=reduce), values)


def test_integer_mean_floors(gen):
    src = torch.randint(-9, 10, (12,), generator=gen)
    index = torch.randint(0, 4, (12,), generator=gen)
    got = ts.scatter_mean(src, index, dim_size=5)
    for k in range(5):
        part = src[index == k]
        assert int(got[k]) == (int(part.sum()) // len(part) if len(part) else 0)


@pytest.mark.parametrize("shape", ["1d", "column", "full"])
def test_index_broadcasts_like_torch_scatter(shape, gen):
    """A 1-D index along dim 0, a ``[N, 1]`` index (SPVNAS's point_to_voxel) and a full-shape index
    with a column of its own per channel."""
    src = small_ints(gen, (10, 3), torch.float64, "cpu")
    rows = torch.randint(0, 4, (10,), generator=gen)
    index = {"1d": rows, "column": rows[:, None], "full": torch.randint(0, 4, (10, 3), generator=gen)}[shape]
    got = ts.scatter_mean(src, index, dim=0)
    definition.dim = 0
    dest = index.expand(10, 3) if shape != "1d" else rows[:, None].expand(10, 3)
    assert torch.equal(got, definition(src, dest, int(index.max()) + 1, "mean")[0])


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_scatter_into_out_starts_from_out(reduce, gen):
    src = small_ints(gen, (8, 2), torch.float64, "cpu")
    index = torch.randint(0, 3, (8,), generator=gen)
    out = small_ints(gen, (5, 2), torch.float64, "cpu")
    start = out.clone()
    values, arg = call(reduce, src, index, dim=0, out=out)
    assert values is out
    definition.dim = 0
    want, want_arg = definition(src, index[:, None].expand(8, 2), 5, reduce, start)
    assert torch.equal(out, want)
    if arg is not None:
        assert torch.equal(arg, want_arg)


def test_default_sizes(gen):
    src = torch.rand(6, 2, generator=gen, dtype=torch.float64) + 0.5
    index = torch.tensor([0, 3, 3, 1, 0, 3])
    assert ts.scatter_sum(src, index, dim=0).shape == (4, 2)
    assert ts.scatter_max(src[:0], index[:0], dim=0)[0].shape == (0, 2)
    assert ts.segment_coo(src, index.sort().values, reduce="max").shape == (4, 2)
    assert ts.gather_csr(src[:3], torch.tensor([1, 2, 4, 6])).shape == (6, 2)


def test_gradients_follow_torch_scatter(gen):
    """sum / mean: the output's gradient gathered (over the count); min / max: to the first
    winning element only; mul: the product of the other elements (exact)."""
    src = small_ints(gen, (12,), torch.float64, "cpu").requires_grad_()
    index = torch.randint(0, 4, (12,), generator=gen)
    g = torch.rand(5, generator=gen, dtype=torch.float64) + 0.5
    count = torch.bincount(index, minlength=5).double()
    cases = {"sum": g[index], "mean": g[index] / count[index]}
    for reduce in ("max", "min"):
        _, arg = getattr(ts, f"scatter_{reduce}")(src.detach(), index, dim_size=5)
        want = torch.zeros(12, dtype=torch.float64)
        won = arg < 12
        want[arg[won]] = g[won]
        cases[reduce] = want
    others = torch.stack([src.detach()[(index == index[i]) & (torch.arange(12) != i)].prod() for i in range(12)])
    cases["mul"] = g[index] * others
    for reduce, want in cases.items():
        (grad,) = torch.autograd.grad(ts.scatter(src, index, dim_size=5, reduce=reduce), src, g)
        assert torch.allclose(grad, want, rtol=1e-12, atol=0), reduce


def csr_destinations(indptr, length):
    """The segment of every position of each row of ``indptr`` (-1 outside every segment)."""
    rows = indptr.reshape(-1, indptr.shape[-1]).tolist()
    dest = torch.full((len(rows), length), -1, dtype=torch.long)
    for r, ptr in enumerate(rows):
        for n in range(len(ptr) - 1):
            dest[r, ptr[n]:ptr[n + 1]] = n
    return dest.view(tuple(indptr.shape[:-1]) + (length,))


def sorted_ptr(gen, length, segments, batch=()):
    """Non-decreasing pointers in [0, length] (empty segments and uncovered ends included)."""
    cuts = torch.randint(0, length + 1, batch + (segments + 1,), generator=gen)
    return cuts.sort(-1).values


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("reduce", ["sum", "mean", "min", "max"])
def test_segment_csr_matches_the_definition(reduce, batched, gen):
    src = small_ints(gen, (3, 11, 2), torch.float64, "cpu")
    indptr = sorted_ptr(gen, 11, 6, (3,) if batched else ())
    full_ptr = indptr.expand(3, 7) if not batched else indptr
    dest = csr_destinations(full_ptr, 11)[:, :, None].expand(src.shape)
    definition.dim = 1
    want, want_arg = definition(src, dest, 6, reduce)
    values = ts.segment_csr(src, indptr.view(1, 7) if not batched else indptr, reduce=reduce)
    assert torch.equal(values, want)
    if reduce in ("min", "max"):
        assert torch.equal(getattr(ts, f"segment_{reduce}_csr")(src, full_ptr)[1], want_arg)
    out = torch.rand(3, 6, 2, generator=gen, dtype=torch.float64)
    assert ts.segment_csr(src, full_ptr, out=out, reduce=reduce) is out and torch.equal(out, want)


def test_segment_csr_as_ptv3_pools(gen):
    """PTv3's SerializedPooling: points sorted by cluster, idx_ptr from the cluster counts,
    reduce 'max' over the features and 'mean' over the coordinates."""
    cluster = torch.randint(0, 7, (40,), generator=gen)
    _, cluster, counts = torch.unique(cluster, return_inverse=True, return_counts=True)
    _, indices = torch.sort(cluster)
    idx_ptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, dim=0)])
    feat, coord = torch.randn(40, 5, generator=gen), torch.randn(40, 3, generator=gen, dtype=torch.float64)
    pooled = ts.segment_csr(feat[indices], idx_ptr, reduce="max")
    means = ts.segment_csr(coord[indices], idx_ptr, reduce="mean")
    for k in range(len(counts)):
        assert torch.equal(pooled[k], feat[cluster == k].max(0).values)
        assert torch.allclose(means[k], coord[cluster == k].mean(0), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("reduce", ["sum", "mean", "min", "max"])
def test_segment_coo_matches_the_definition(reduce, gen):
    src = small_ints(gen, (2, 10, 3), torch.float64, "cpu")
    index = torch.randint(0, 5, (2, 10), generator=gen).sort(-1).values
    definition.dim = 1
    want, want_arg = definition(src, index[:, :, None].expand(src.shape), 7, reduce)
    assert torch.equal(ts.segment_coo(src, index, dim_size=7, reduce=reduce), want)
    if reduce in ("min", "max"):
        assert torch.equal(getattr(ts, f"segment_{reduce}_coo")(src, index, dim_size=7)[1], want_arg)
    out = small_ints(gen, (2, 7, 3), torch.float64, "cpu")
    want_out, _ = definition(src, index[:, :, None].expand(src.shape), 7, reduce, out.clone())
    assert torch.equal(ts.segment_coo(src, index, out=out, reduce=reduce), want_out)


def test_gathers_and_their_gradients(gen):
    src = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    indptr = torch.tensor([[0, 2, 2, 5, 6], [1, 1, 3, 4, 6]])
    got = ts.gather_csr(src, indptr)
    dest = csr_destinations(indptr, 6)
    for b, e in itertools.product(range(2), range(6)):
        n = int(dest[b, e])
        assert torch.equal(got[b, e], src[b, n] if n >= 0 else torch.zeros(3, dtype=torch.float64))
    g = torch.randn(2, 6, 3, generator=gen, dtype=torch.float64)
    (grad,) = torch.autograd.grad(got, src, g)
    assert torch.allclose(grad, ts.segment_csr(g, indptr), rtol=1e-14, atol=1e-15)
    index = torch.tensor([[0, 0, 1, 3, 3], [1, 2, 2, 2, 3]])
    got = ts.gather_coo(src, index)
    assert torch.equal(got, torch.stack([src[b, index[b]] for b in range(2)]))


def test_half_precision_segments_round_once(gen):
    """float16 values reduced in float32 and rounded once: as accurate as the float64 sum rounded
    to float16 (docs/testing.md)."""
    src = torch.randn(300, 16, generator=gen, dtype=torch.float64).half()
    indptr = sorted_ptr(gen, 300, 9)
    exact = torch.stack([src[a:b].double().sum(0) for a, b in zip(indptr[:-1], indptr[1:])])
    got = ts.segment_csr(src, indptr)
    assert got.dtype == torch.float16
    assert_as_accurate_as_rounded(got, exact, what="segment_csr float16")


def test_bad_inputs_raise(gen):
    src, index = torch.randn(6, 2, generator=gen), torch.tensor([0, 1, 1, 2, 0, 2])
    with pytest.raises(TypeError, match="int64"):
        ts.scatter_sum(src, index.int(), dim=0)
    with pytest.raises(IndexError, match=r"\[0, 2\)"):
        ts.scatter_max(src, index, dim=0, dim_size=2)
    with pytest.raises(IndexError, match=r"got \[-1"):
        ts.scatter_mean(src, index - 1, dim=0)
    with pytest.raises(ValueError, match="reduce must be one of"):
        ts.scatter(src, index, dim=0, reduce="median")
    with pytest.raises(ValueError, match="reduce must be one of"):
        ts.segment_csr(src, torch.tensor([0, 6]), reduce="mul")
    with pytest.raises(ValueError, match="out of range"):
        ts.scatter_sum(src, index, dim=2)
    with pytest.raises(ValueError, match="cannot be broadcast"):
        ts.scatter_sum(src, torch.zeros(6, 3, dtype=torch.long), dim=0)
    with pytest.raises(ValueError, match="must match src"):
        ts.scatter_sum(src, index, dim=0, out=torch.zeros(3, 5))
    with pytest.raises(TypeError, match="out is"):
        ts.scatter_sum(src, index, dim=0, out=torch.zeros(3, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="real number"):
        ts.scatter_max(torch.ones(6, dtype=torch.bool), index)
    with pytest.raises(ValueError, match="dim_size"):
        ts.scatter_sum(src, index, dim=0, dim_size=-1)
    with pytest.raises(ValueError, match="sorted"):
        ts.segment_coo(src, index)
    with pytest.raises(ValueError, match="sorted"):
        ts.gather_coo(src, index)
    with pytest.raises(ValueError, match="non-decreasing"):
        ts.segment_csr(src, torch.tensor([0, 4, 2, 6]))
    with pytest.raises(IndexError, match=r"\[0, 6\]"):
        ts.segment_csr(src, torch.tensor([0, 4, 7]))
    with pytest.raises(ValueError, match="segments"):
        ts.gather_csr(src, torch.tensor([0, 4, 6]))
    with pytest.raises(ValueError, match="leading sizes"):
        ts.gather_coo(src.view(2, 3, 2), torch.tensor([[0, 1]] * 3))


def test_alias_makes_torch_scatter_importable(tmp_path):
    script = ("from torchsparse_pp.compat import alias\nalias('torch_scatter')\nimport torch, torch_scatter\n"
              "from torch_scatter import scatter_mean, segment_csr\n"
              "print(torch_scatter.__name__, scatter_mean(torch.ones(3, 1), torch.tensor([0, 0, 1]), dim=0).tolist())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["torchsparse_pp.compat.torch_scatter", "[[1.0],", "[1.0]]"]
