"""SparseTensor API: properties, non-mutating conversions, dense round trips, arithmetic, caches."""
import itertools

import numpy as np
import pytest
import torch

import torchsparse_pp
from torchsparse_pp import SparseTensor
from torchsparse_pp.data import generate_scan
from torchsparse_pp.kmap import KernelMapKey
from torchsparse_pp.nn import BatchNorm, Conv3d, ReLU
from torchsparse_pp.utils import sparse_quantize


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _coords(gen: torch.Generator, n: int, extent, batch: int = 1, low: int = 0) -> torch.Tensor:
    """n unique random int32 (batch, x, y, z) rows, in random order; every batch index appears."""
    extent = (extent,) * 3 if isinstance(extent, int) else tuple(extent)
    cells = [(b, x, y, z) for b in range(batch) for x in range(extent[0]) for y in range(extent[1])
             for z in range(extent[2])]
    pick = torch.randperm(len(cells), generator=gen)[:n].tolist()
    rows = [cells[i] for i in pick]
    for b in range(batch):  # make sure the highest batch index is present
        if not any(r[0] == b for r in rows):
            rows[b] = next(c for c in cells if c[0] == b and c not in rows)
    out = torch.tensor(rows, dtype=torch.int32)
    out[:, 1:] += low
    return out


def _tensor(seed: int, n: int = 60, channels: int = 3, extent=7, batch: int = 2, **kwargs) -> SparseTensor:
    gen = _gen(seed)
    coords = _coords(gen, n, extent, batch)
    return SparseTensor(torch.randn(n, channels, generator=gen), coords, **kwargs)


# --- properties --------------------------------------------------------------------------------
def test_properties():
    gen = _gen(100)
    coords = _coords(gen, 50, (6, 9, 5), batch=4)
    feats = torch.randn(50, 7, generator=gen, dtype=torch.float64)
    x = SparseTensor(feats, coords, stride=(2, 4, 1), spatial_range=(6, 9, 5))
    assert x.F is feats and x.C is coords
    assert x.s == (2, 4, 1) and x.stride == (2, 4, 1)
    assert x.spatial_range == (6, 9, 5)
    assert x.num_points == 50 and len(x) == 50
    assert x.num_channels == 7
    assert x.batch_size == 4
    assert x.dtype == torch.float64 and x.device == torch.device("cpu")
    assert "points=50" in repr(x) and "channels=7" in repr(x)


def test_default_stride_and_range():
    x = _tensor(101, batch=3)
    assert x.s == (1, 1, 1) and x.stride == (1, 1, 1)
    assert x.spatial_range is None
    assert x.batch_size == int(x.C[:, 0].max()) + 1 == 3
    y = SparseTensor(x.F, x.C, stride=3, spatial_range=12)
    assert y.s == (3, 3, 3) and y.spatial_range == (12, 12, 12)


def test_batch_size_counts_from_max_index():
    """batch_size is the highest batch index + 1, also when lower indices are absent."""
    gen = _gen(102)
    coords = _coords(gen, 20, 5, batch=1)
    coords[:, 0] = 5
    x = SparseTensor(torch.randn(20, 2, generator=gen), coords)
    assert x.batch_size == 6


# --- conversions never mutate ------------------------------------------------------------------
CONVERSIONS = [
    ("to_float64", lambda x: x.to(torch.float64), torch.float64),
    ("to_dtype_kw", lambda x: x.to(dtype=torch.bfloat16), torch.bfloat16),
    ("double", lambda x: x.double(), torch.float64),
    ("bfloat16", lambda x: x.bfloat16(), torch.bfloat16),
    ("half", lambda x: x.half(), torch.float16),
    ("float", lambda x: x.float(), torch.float32),
    ("detach", lambda x: x.detach(), torch.float32),
    ("cpu", lambda x: x.cpu(), torch.float32),
    ("to_cpu", lambda x: x.to("cpu"), torch.float32),
]


@pytest.mark.parametrize("name, convert, dtype", CONVERSIONS, ids=[c[0] for c in CONVERSIONS])
def test_conversions_return_new_tensor_and_keep_original(name, convert, dtype):
    gen = _gen(103)
    coords = _coords(gen, 40, 6, batch=2)
    feats = torch.randn(40, 5, generator=gen).requires_grad_()
    original = feats.detach().clone()
    x = SparseTensor(feats, coords, stride=2, spatial_range=(6, 6, 6))
    cache = x.cache

    y = convert(x)

    assert isinstance(y, SparseTensor) and y is not x
    # the original is untouched
    assert x.F is feats and x.C is coords and x.cache is cache
    assert x.dtype == torch.float32 and x.F.requires_grad
    assert torch.equal(x.F.detach(), original)
    # the new tensor: converted features, shared coordinates and cache
    assert y.dtype == dtype
    assert torch.equal(y.F.detach(), original.to(dtype))
    assert y.C is coords
    assert y.cache is cache
    assert y.s == x.s and y.spatial_range == x.spatial_range
    if name == "detach":
        assert not y.F.requires_grad


def test_derived_tensor_fills_the_shared_cache():
    """A conv run on a converted tensor stores its map in the original's cache."""
    x = _tensor(104, channels=4)
    y = x.double()
    assert len(x.cache) == 0
    out = Conv3d(4, 2, 3).double()(y)
    assert len(x.cache) == 1 and out.cache is x.cache
    (key, kmap), = list(x.cache.maps())
    assert key.mode == "submanifold" and kmap.in_coords is x.C
    # the float32 original reuses that map: no second entry
    Conv3d(4, 2, 3)(x)
    assert len(x.cache) == 1


def test_to_other_device_starts_a_fresh_cache():
    x = _tensor(105)
    y = x.to("meta")
    assert y.device.type == "meta" and y.C.device.type == "meta"
    assert y.cache is not x.cache
    assert x.device.type == "cpu" and x.C.device.type == "cpu"


# --- dense -------------------------------------------------------------------------------------
def _dense_by_loops(x: SparseTensor, size, batch: int) -> torch.Tensor:
    grid = torch.zeros(batch, x.num_channels, *size, dtype=x.dtype)
    for row, (b, i, j, k) in enumerate(x.C.tolist()):
        for c in range(x.num_channels):
            grid[b, c, i, j, k] = x.F[row, c]
    return grid


def test_dense_matches_loops():
    gen = _gen(106)
    coords = _coords(gen, 70, (5, 7, 4), batch=2)
    x = SparseTensor(torch.randn(70, 3, generator=gen), coords)
    dense = x.dense()
    size = [int(coords[:, a].max()) + 1 for a in (1, 2, 3)]
    assert dense.shape == (2, 3, *size)
    assert torch.equal(dense, _dense_by_loops(x, size, 2))


def test_dense_uses_spatial_range():
    gen = _gen(107)
    coords = _coords(gen, 30, (4, 5, 3), batch=2)
    x = SparseTensor(torch.randn(30, 2, generator=gen), coords, spatial_range=(6, 8, 5))
    dense = x.dense()
    assert dense.shape == (2, 2, 6, 8, 5)
    assert torch.equal(dense, _dense_by_loops(x, (6, 8, 5), 2))
    # an explicit grid and batch size in to_dense win over the tensor's own
    from torchsparse_pp.nn.functional import to_dense
    bigger = to_dense(x, spatial_range=(7, 9, 6), batch_size=3)
    assert torch.equal(bigger, _dense_by_loops(x, (7, 9, 6), 3))


def test_dense_gradient():
    gen = _gen(108)
    coords = _coords(gen, 50, 6, batch=2)
    feats = torch.randn(50, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    x = SparseTensor(feats, coords)
    dense = x.dense()
    weights = torch.randn(dense.shape, generator=gen, dtype=torch.float64)
    (dense * weights).sum().backward()
    expected = torch.stack([weights[b, :, i, j, k] for b, i, j, k in coords.tolist()])
    assert torch.equal(feats.grad, expected)


def test_dense_rejects_negative_coords():
    gen = _gen(109)
    coords = _coords(gen, 20, 5, batch=1, low=-2)
    x = SparseTensor(torch.randn(20, 2, generator=gen), coords)
    with pytest.raises(ValueError, match=r"dense\(\) needs non-negative coordinates"):
        x.dense()


# --- from_dense --------------------------------------------------------------------------------
def _sparse_dense_grid(seed: int, shape, occupancy: float = 0.2, requires_grad: bool = False):
    gen = _gen(seed)
    mask = torch.rand(shape[0], 1, *shape[2:], generator=gen) < occupancy
    values = torch.randn(shape, generator=gen, dtype=torch.float64)
    dense = (values * mask).requires_grad_(requires_grad)
    return dense, mask[:, 0]


def test_from_dense_against_loops():
    dense, mask = _sparse_dense_grid(110, (2, 3, 5, 6, 4))
    x = SparseTensor.from_dense(dense)
    sites = [[b, i, j, k] for b, i, j, k in itertools.product(*(range(n) for n in mask.shape)) if mask[b, i, j, k]]
    assert x.C.dtype == torch.int32
    assert x.C.tolist() == sites  # lexicographic order
    assert torch.equal(x.F, torch.stack([dense[b, :, i, j, k] for b, i, j, k in sites]))
    assert x.spatial_range == (5, 6, 4)
    assert x.s == (1, 1, 1)
    assert SparseTensor.from_dense(dense, stride=(2, 2, 4)).s == (2, 2, 4)


def test_from_dense_keeps_sites_with_some_zero_channels():
    dense, mask = _sparse_dense_grid(111, (1, 2, 4, 4, 4), occupancy=0.3)
    b, i, j, k = mask.nonzero()[0].tolist()
    dense[b, 0, i, j, k] = 0.0  # the other channel is still non-zero
    x = SparseTensor.from_dense(dense)
    assert x.num_points == int(mask.sum())
    assert [b, i, j, k] in x.C.tolist()


def test_sparse_dense_sparse_round_trip():
    gen = _gen(112)
    coords = _coords(gen, 80, (6, 5, 7), batch=2)
    feats = torch.randn(80, 3, generator=gen)
    x = SparseTensor(feats, coords)
    y = SparseTensor.from_dense(x.dense())
    order = sorted(range(80), key=lambda r: tuple(coords[r].tolist()))
    assert torch.equal(y.C, coords[order])
    assert torch.equal(y.F, feats[order])


def test_from_dense_gradient_only_at_occupied_sites():
    dense, mask = _sparse_dense_grid(113, (2, 3, 4, 5, 6), requires_grad=True)
    x = SparseTensor.from_dense(dense)
    weights = torch.randn(x.F.shape, generator=_gen(114), dtype=torch.float64)
    (x.F * weights).sum().backward()
    expected = torch.zeros_like(dense)
    for row, (b, i, j, k) in enumerate(x.C.tolist()):
        expected[b, :, i, j, k] = weights[row]
    assert torch.equal(dense.grad, expected)
    assert bool((dense.grad.abs().sum(1) > 0).eq(mask).all())


def test_from_dense_rejects_bad_input():
    with pytest.raises(ValueError, match=r"from_dense expects a \[B, C, X, Y, Z\] tensor"):
        SparseTensor.from_dense(torch.randn(3, 4, 5, generator=_gen(115)))
    with pytest.raises(ValueError, match=r"no non-zero site"):
        SparseTensor.from_dense(torch.zeros(1, 2, 3, 3, 3))


# --- + and cat ---------------------------------------------------------------------------------
def test_add_same_coords_object():
    x = _tensor(116, channels=4)
    other = x.replace_feats(torch.randn(x.num_points, 4, generator=_gen(117)))
    out = x + other
    assert torch.equal(out.F, x.F + other.F)
    assert out.C is x.C and out.cache is x.cache and out.s == x.s


def test_add_equal_but_not_identical_coords():
    gen = _gen(118)
    coords = _coords(gen, 40, 6, batch=2)
    a = SparseTensor(torch.randn(40, 3, generator=gen), coords, stride=2)
    b = SparseTensor(torch.randn(40, 3, generator=gen), coords.clone(), stride=2)
    out = a + b
    assert torch.equal(out.F, a.F + b.F)
    assert out.C is a.C and out.s == (2, 2, 2)
    # the inputs are unchanged
    assert not torch.equal(a.F, out.F) and not torch.equal(b.F, out.F)


def test_add_gradient():
    gen = _gen(119)
    coords = _coords(gen, 30, 5)
    fa = torch.randn(30, 2, generator=gen, requires_grad=True)
    fb = torch.randn(30, 2, generator=gen, requires_grad=True)
    w = torch.randn(30, 2, generator=gen)
    ((SparseTensor(fa, coords) + SparseTensor(fb, coords)).F * w).sum().backward()
    assert torch.equal(fa.grad, w) and torch.equal(fb.grad, w)


def test_cat_joins_channels():
    gen = _gen(120)
    coords = _coords(gen, 40, 6, batch=2)
    a = SparseTensor(torch.randn(40, 3, generator=gen), coords)
    b = SparseTensor(torch.randn(40, 5, generator=gen), coords.clone())
    c = a.replace_feats(torch.randn(40, 1, generator=gen))
    out = torchsparse_pp.cat([a, b, c])
    assert out.num_channels == 9
    assert torch.equal(out.F, torch.cat([a.F, b.F, c.F], dim=1))
    assert out.C is a.C and out.cache is a.cache


# --- cache sharing through a network -----------------------------------------------------------
@pytest.fixture(scope="module")
def scan_tensor():
    points = generate_scan(32, seed=11)["points"]
    voxels, index = sparse_quantize(points[:, :3], 0.1, return_index=True)
    coords = torch.cat([torch.zeros(len(voxels), 1, dtype=torch.int32), torch.from_numpy(voxels)], dim=1)
    feats = torch.from_numpy(points[index])
    return feats, coords


def test_cache_shared_through_network(scan_tensor):
    feats, coords = scan_tensor
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        Conv3d(4, 8, 3), BatchNorm(8), ReLU(),
        Conv3d(8, 8, 3),
        Conv3d(8, 16, 2, stride=2),
        Conv3d(16, 16, 3),
        Conv3d(16, 8, 2, stride=2, transposed=True),
    )
    x = SparseTensor(feats, coords)
    out = net(x)

    assert out.C is x.C
    assert out.s == (1, 1, 1)
    assert out.F.shape == (x.num_points, 8)
    assert out.cache is x.cache

    entries = list(x.cache.maps())
    assert len(x.cache) == 3 and len(entries) == 3
    assert all(isinstance(key, KernelMapKey) for key, _ in entries)
    by_mode = {}
    for key, kmap in entries:
        by_mode.setdefault(key.mode, []).append((key, kmap))
    assert sorted(by_mode) == ["spconv", "submanifold"]
    assert len(by_mode["spconv"]) == 1 and len(by_mode["submanifold"]) == 2

    (skey, strided), = by_mode["spconv"]
    assert skey.geometry.kernel_size == (2, 2, 2) and skey.geometry.stride == (2, 2, 2)
    assert strided.in_coords is x.C
    # the stride-2 coordinates: every voxel floor-divided by 2 (k2 s2 pad 0), computed with numpy
    expected = np.unique(np.floor_divide(coords.numpy(), [1, 2, 2, 2]), axis=0)
    assert np.array_equal(strided.out_coords.numpy(), expected)

    subs = {kmap.in_coords is x.C: (key, kmap) for key, kmap in by_mode["submanifold"]}
    assert set(subs) == {True, False}
    fine_key, fine = subs[True]
    coarse_key, coarse = subs[False]
    for key in (fine_key, coarse_key):
        assert key.geometry.kernel_size == (3, 3, 3) and key.geometry.stride == (1, 1, 1)
        assert key.geometry.padding == (1, 1, 1)
    assert fine.out_coords is x.C
    assert coarse.in_coords is strided.out_coords and coarse.out_coords is strided.out_coords
    assert fine_key.coords_token != coarse_key.coords_token

    # a second pass over the same input builds nothing new
    maps_before = {key: kmap for key, kmap in entries}
    net(x)
    assert {key: kmap for key, kmap in x.cache.maps()} == maps_before


def test_separate_tensors_do_not_share_caches():
    gen = _gen(121)
    coords = _coords(gen, 50, 6, batch=2)
    a = SparseTensor(torch.randn(50, 3, generator=gen), coords)
    b = SparseTensor(torch.randn(50, 3, generator=gen), coords)  # even the same coords object
    assert a.cache is not b.cache
    Conv3d(3, 2, 3)(a)
    assert len(a.cache) == 1 and len(b.cache) == 0
    Conv3d(3, 2, 3)(b)
    assert len(b.cache) == 1
    (_, ka), = list(a.cache.maps())
    (_, kb), = list(b.cache.maps())
    assert ka is not kb
