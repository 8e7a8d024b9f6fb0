"""Utilities: sparse_quantize, sparse_collate and sparse_collate_fn."""
import numpy as np
import pytest
import torch

from torchsparse_pp import SparseTensor
from torchsparse_pp.data import generate_scan
from torchsparse_pp.utils import sparse_collate, sparse_collate_fn, sparse_quantize


def _points(seed: int, n: int = 500, low: float = -3.0, high: float = 3.0, dims: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, (n, dims))


def _floor_voxels(points: np.ndarray, size) -> np.ndarray:
    """Independent voxel index of every point: floor(points / size) in float64."""
    return np.floor(np.asarray(points, dtype=np.float64) / np.asarray(size, dtype=np.float64)).astype(np.int64)


def _is_strictly_sorted(rows: np.ndarray) -> bool:
    as_tuples = [tuple(r) for r in rows.tolist()]
    return all(a < b for a, b in zip(as_tuples, as_tuples[1:]))


# --- sparse_quantize ---------------------------------------------------------------------------
def test_quantize_numpy_returns_numpy():
    points = _points(1)
    coords, index, inverse = sparse_quantize(points, 0.5, return_index=True, return_inverse=True)
    for out in (coords, index, inverse):
        assert isinstance(out, np.ndarray)
    assert coords.dtype == np.int32 and coords.ndim == 2 and coords.shape[1] == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_quantize_torch_returns_torch(dtype):
    points = torch.from_numpy(_points(2)).to(dtype)
    coords, index, inverse = sparse_quantize(points, 0.5, return_index=True, return_inverse=True)
    for out in (coords, index, inverse):
        assert isinstance(out, torch.Tensor)
    assert coords.dtype == torch.int32
    plain = sparse_quantize(points, 0.5)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, coords)


def test_quantize_numpy_and_torch_agree():
    points = _points(3).astype(np.float32)
    from_numpy = sparse_quantize(points, 0.3)
    from_torch = sparse_quantize(torch.from_numpy(points), 0.3)
    assert np.array_equal(from_numpy, from_torch.numpy())


def test_quantize_scalar_voxel_size():
    points = _points(4)
    coords = sparse_quantize(points, 0.4)
    expected = np.unique(_floor_voxels(points, 0.4), axis=0)
    assert np.array_equal(coords, expected)
    assert np.array_equal(sparse_quantize(points, [0.4, 0.4, 0.4]), coords)
    assert np.array_equal(sparse_quantize(points, np.array([0.4])), coords)


def test_quantize_per_axis_voxel_size():
    points = _points(5, n=800)
    size = (0.25, 0.6, 1.3)
    coords = sparse_quantize(points, size)
    expected = np.unique(_floor_voxels(points, size), axis=0)
    assert np.array_equal(coords, expected)
    # per-axis sizes really act per axis: the scalar result differs
    assert not np.array_equal(coords, sparse_quantize(points, 0.25))


def test_quantize_floor_for_negative_values():
    points = np.array([[-0.01, 0.01, 0.049], [-0.05, -0.051, 0.05], [-0.099, -0.1, 0.0]])
    coords, inverse = sparse_quantize(points, 0.05, return_inverse=True)
    assert coords[inverse].tolist() == [[-1, 0, 0], [-1, -2, 1], [-2, -2, 0]]


def test_quantize_other_dims_and_int_input():
    rng = np.random.default_rng(6)
    points = rng.integers(-20, 20, (300, 2))
    coords = sparse_quantize(points, 3)
    assert np.array_equal(coords, np.unique(np.floor_divide(points, 3), axis=0))


def test_quantize_output_unique_and_sorted():
    points = _points(7, n=2000, low=-4.0, high=4.0)
    for size in (0.3, (0.5, 0.2, 0.9)):
        coords = sparse_quantize(points, size)
        assert _is_strictly_sorted(coords)  # strictly increasing rows: sorted and unique
        assert len(coords) < len(points)  # the draw does produce collisions


def test_quantize_return_index_is_first_row():
    points = _points(8, n=1500, low=-2.0, high=2.0)
    size = (0.5, 0.7, 0.4)
    coords, index = sparse_quantize(points, size, return_index=True)
    first = {}
    for row, voxel in enumerate(map(tuple, _floor_voxels(points, size).tolist())):
        first.setdefault(voxel, row)
    assert len(first) == len(coords)
    assert index.dtype == np.int64
    assert [first[tuple(c)] for c in coords.tolist()] == index.tolist()


def test_quantize_return_index_torch():
    points = torch.from_numpy(_points(9, n=1000, low=-1.5, high=1.5))
    coords, index = sparse_quantize(points, 0.5, return_index=True)
    first = {}
    for row, voxel in enumerate(map(tuple, _floor_voxels(points.numpy(), 0.5).tolist())):
        first.setdefault(voxel, row)
    assert [first[tuple(c)] for c in coords.tolist()] == index.tolist()


def test_quantize_return_inverse():
    points = _points(10, n=1200)
    size = (0.35, 0.5, 0.45)
    coords, inverse = sparse_quantize(points, size, return_inverse=True)
    assert inverse.shape == (len(points),)
    assert np.array_equal(coords[inverse], _floor_voxels(points, size))


def test_quantize_both_flags_order():
    points = _points(11, n=900)
    size = 0.6
    coords, index, inverse = sparse_quantize(points, size, return_index=True, return_inverse=True)
    assert len(coords) < len(points)
    assert index.shape == (len(coords),) and inverse.shape == (len(points),)
    only_index = sparse_quantize(points, size, return_index=True)[1]
    only_inverse = sparse_quantize(points, size, return_inverse=True)[1]
    assert np.array_equal(index, only_index) and np.array_equal(inverse, only_inverse)
    # consistency: the first row of a voxel maps back to that voxel
    assert np.array_equal(inverse[index], np.arange(len(coords)))


def test_quantize_does_not_modify_input():
    points = _points(12)
    copy = points.copy()
    sparse_quantize(points, 0.2, return_index=True, return_inverse=True)
    assert np.array_equal(points, copy)


def test_quantize_64_beam_scan():
    points = generate_scan(64, seed=5)["points"]
    coords = sparse_quantize(points[:, :3], 0.05)
    voxels = np.floor(points[:, :3].astype(np.float64) / 0.05)
    expected = np.unique(voxels, axis=0)
    assert len(coords) == len(expected)
    assert np.array_equal(coords, expected.astype(np.int32))


# --- sparse_collate ----------------------------------------------------------------------------
def _sample(seed: int, n: int, channels: int = 3, **kwargs) -> SparseTensor:
    rng = np.random.default_rng(seed)
    cells = rng.choice(8 * 8 * 8, size=n, replace=False)
    xyz = np.stack(np.unravel_index(cells, (8, 8, 8)), axis=1)
    coords = torch.from_numpy(np.concatenate([np.zeros((n, 1), dtype=np.int64), xyz], axis=1)).int()
    feats = torch.from_numpy(rng.standard_normal((n, channels))).float()
    return SparseTensor(feats, coords, **kwargs)


def test_collate_batch_indices_and_feats():
    samples = [_sample(20, 30), _sample(21, 17), _sample(22, 45)]
    originals = [s.C.clone() for s in samples]
    batch = sparse_collate(samples)
    assert isinstance(batch, SparseTensor)
    assert batch.num_points == 92 and batch.batch_size == 3
    expected_batch = [0] * 30 + [1] * 17 + [2] * 45
    assert batch.C[:, 0].tolist() == expected_batch
    assert torch.equal(batch.C[:, 1:], torch.cat([s.C[:, 1:] for s in samples]))
    assert torch.equal(batch.F, torch.cat([s.F for s in samples]))
    for s, c in zip(samples, originals):
        assert torch.equal(s.C, c)  # inputs unchanged
    assert batch.cache is not samples[0].cache


def test_collate_keeps_stride_and_range():
    samples = [_sample(23, 20, stride=2, spatial_range=(8, 8, 8)), _sample(24, 25, stride=2, spatial_range=(8, 8, 8))]
    batch = sparse_collate(samples)
    assert batch.s == (2, 2, 2) and batch.spatial_range == (8, 8, 8)


def test_collate_rejects_nonzero_batch_index():
    good = _sample(25, 20)
    coords = good.C.clone()
    coords[7, 0] = 1
    bad = SparseTensor(good.F.clone(), coords)
    with pytest.raises(ValueError, match=r"sample 1 already has batch indices other than 0"):
        sparse_collate([good, bad])


# --- sparse_collate_fn -------------------------------------------------------------------------
def test_collate_fn_mixed_values():
    rng = np.random.default_rng(30)
    samples = []
    for i, n in enumerate((12, 20, 7)):
        samples.append({
            "input": _sample(31 + i, n),
            "label": torch.from_numpy(rng.integers(0, 19, 5)),
            "points": rng.standard_normal((n, 4)).astype(np.float32),
            "same_array": rng.standard_normal((2, 3)),
            "name": f"scan_{i:03d}",
            "meta": {"id": torch.tensor([i + 1]), "file": f"f{i}.bin"},
        })
    batch = sparse_collate_fn(samples)
    assert set(batch) == {"input", "label", "points", "same_array", "name", "meta"}

    assert isinstance(batch["input"], SparseTensor)
    assert batch["input"].C[:, 0].tolist() == [0] * 12 + [1] * 20 + [2] * 7
    assert torch.equal(batch["input"].F, torch.cat([s["input"].F for s in samples]))

    assert isinstance(batch["label"], torch.Tensor) and batch["label"].shape == (3, 5)
    assert torch.equal(batch["label"], torch.stack([s["label"] for s in samples]))

    assert isinstance(batch["points"], list) and len(batch["points"]) == 3
    for got, s in zip(batch["points"], samples):
        assert got is s["points"]

    assert isinstance(batch["same_array"], torch.Tensor) and batch["same_array"].shape == (3, 2, 3)
    assert np.array_equal(batch["same_array"].numpy(), np.stack([s["same_array"] for s in samples]))

    assert batch["name"] == ["scan_000", "scan_001", "scan_002"]
    assert torch.equal(batch["meta"]["id"], torch.tensor([[1], [2], [3]]))
    assert batch["meta"]["file"] == ["f0.bin", "f1.bin", "f2.bin"]


def test_collate_fn_rejects_bad_samples():
    with pytest.raises(ValueError, match=r"sample 1 has keys \['a', 'c'\], sample 0 has \['a', 'b'\]"):
        sparse_collate_fn([{"a": 1, "b": 2}, {"a": 1, "c": 2}])
    with pytest.raises(TypeError, match=r"sparse_collate_fn expects a non-empty list of dicts"):
        sparse_collate_fn([])
    with pytest.raises(TypeError, match=r"sparse_collate_fn expects a non-empty list of dicts"):
        sparse_collate_fn([("a", 1)])
