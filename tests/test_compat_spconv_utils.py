"""spconv.utils' voxel generators (Point2VoxelCPU3d / 4d) and spconv.pytorch.utils.PointToVoxel of
torchsparse_pp's spconv adapter against real spconv 2.3.8 (CPU) on the same points: voxels,
coordinates, points per voxel and per-point voxel ids equal, in the same order and dtypes, on
uniform clouds that spill over the range (boundary values, NaN and infinities included) and on
generated LiDAR scans, with room to spare and with too few voxels and points per voxel."""
import numpy as np
import pytest
import torch

real_utils = pytest.importorskip("spconv.utils")
tv = pytest.importorskip("cumm.tensorview")
import spconv.pytorch.utils as real_torch_utils  # noqa: E402

from torchsparse_pp.compat.spconv import utils as our_utils  # noqa: E402
from torchsparse_pp.compat.spconv.pytorch import utils as our_torch_utils  # noqa: E402
from torchsparse_pp.data import generate_scan  # noqa: E402

pytestmark = pytest.mark.spconv

# (vsize_xyz, coors_range_xyz) per dimension; OpenPCDet's KITTI-like and Waymo-like sizes.
GRIDS = {3: ([0.2, 0.25, 0.3], [-12.0, -10.0, -3.0, 12.0, 10.0, 1.0]),
         4: ([0.2, 0.25, 0.3, 0.5], [-12.0, -10.0, -3.0, 0.0, 12.0, 10.0, 1.0, 2.0])}
# (max_num_voxels, max_num_points_per_voxel): room to spare, or both overflowing.
CAPACITY = {"roomy": (40000, 64), "overflow": (700, 3)}


def uniform_cloud(gen: torch.Generator, ndim: int, dtype) -> np.ndarray:
    """Points uniformly over a box 20 % larger than the range (a fifth fall outside), plus points
    exactly on the lower and upper bounds, NaN and infinite ones, and an intensity column."""
    vsize, bounds = GRIDS[ndim]
    low, high = torch.tensor(bounds[:ndim]), torch.tensor(bounds[ndim:])
    span = high - low
    xyz = low - 0.1 * span + 1.2 * span * torch.rand(3000, ndim, generator=gen, dtype=torch.float64)
    edges = torch.stack([low, high, low + 0.5 * span, torch.full((ndim,), float("nan")),
                         torch.full((ndim,), float("inf")), torch.full((ndim,), -float("inf"))]).double()
    rows = torch.cat([xyz, edges])[torch.randperm(len(xyz) + len(edges), generator=gen)]
    intensity = torch.rand(len(rows), 1, generator=gen, dtype=torch.float64)
    return torch.cat([rows, intensity], 1).numpy().astype(dtype)


def lidar_cloud(seed: int, ndim: int, dtype) -> np.ndarray:
    """A generated 32-beam scan (x, y, z, intensity), a time column for 4-D."""
    points = generate_scan(32, seed=seed)["points"].astype(np.float64)
    if ndim == 4:
        time = np.random.default_rng(seed).uniform(0.0, 2.5, size=(len(points), 1))
        points = np.concatenate([points[:, :3], time, points[:, 3:]], 1)
    return points.astype(dtype)


CLOUDS = {"uniform": lambda seed, gen, ndim, dtype: uniform_cloud(gen, ndim, dtype),
          "lidar": lambda seed, gen, ndim, dtype: lidar_cloud(seed, ndim, dtype)}


def generator_args(ndim: int, points: np.ndarray, capacity: str):
    vsize, bounds = GRIDS[ndim]
    max_voxels, max_points = CAPACITY[capacity]
    return vsize, bounds, points.shape[1], max_voxels, max_points


def assert_same_arrays(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


CASES = [(cloud, ndim, capacity) for cloud in sorted(CLOUDS) for ndim in (3, 4) for capacity in sorted(CAPACITY)]


@pytest.mark.parametrize("empty_mean", [False, True], ids=["plain", "empty_mean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cloud,ndim,capacity", CASES)
def test_point2voxel_cpu_matches_spconv(cloud, ndim, capacity, dtype, empty_mean, seed, gen):
    """Two calls on one generator (the second without clearing the voxels, on other points):
    each call's outputs and the generator's buffers afterwards equal spconv's."""
    first = CLOUDS[cloud](seed, gen, ndim, dtype)
    second = CLOUDS[cloud](seed + 1, gen, ndim, dtype)
    name = f"Point2VoxelCPU{ndim}d"
    method = "point_to_voxel_empty_mean" if empty_mean else "point_to_voxel"
    results = []
    for module in (our_utils, real_utils):
        generator = getattr(module, name)(*generator_args(ndim, first, capacity))
        run = getattr(generator, method)
        outputs = [t.numpy() for t in run(tv.from_numpy(first))]
        outputs += [t.numpy() for t in run(tv.from_numpy(second), False)]
        outputs += [generator.voxels.numpy(), generator.indices.numpy(), generator.num_per_voxel.numpy()]
        results.append((outputs, generator.grid_size))
    (ours, our_grid), (theirs, their_grid) = results
    assert list(our_grid) == list(their_grid)
    assert_same_arrays(ours, theirs)
    if capacity == "overflow":  # the case is what it says: voxels (and a scan's dense voxels) overflow
        assert len(theirs[0]) == CAPACITY["overflow"][0]
        assert cloud != "lidar" or theirs[2].max() == CAPACITY["overflow"][1]


@pytest.mark.parametrize("empty_mean", [False, True], ids=["plain", "empty_mean"])
@pytest.mark.parametrize("cloud,ndim,capacity", CASES)
def test_point_to_voxel_matches_spconv(cloud, ndim, capacity, empty_mean, seed, gen):
    """spconv.pytorch.utils.PointToVoxel: generate_voxel_with_id (voxels, indices, points per
    voxel, per-point voxel ids) and __call__ on float32 points."""
    points = torch.from_numpy(CLOUDS[cloud](seed, gen, ndim, np.float32))
    results = []
    for module in (our_torch_utils, real_torch_utils):
        generator = module.PointToVoxel(*generator_args(ndim, points.numpy(), capacity))
        with_id = generator.generate_voxel_with_id(points, empty_mean=empty_mean)
        called = generator(points, empty_mean=empty_mean)
        meta = (generator.vsize, generator.grid_size, generator.grid_stride, generator.coors_range)
        results.append(([t.numpy() for t in with_id + called], meta))
    (ours, our_meta), (theirs, their_meta) = results
    assert our_meta == their_meta
    assert_same_arrays(ours, theirs)
    ids = theirs[3]
    assert (ids == -1).any() and (ids >= 0).any()


@pytest.mark.parametrize("ndim", [3, 4])
def test_static_point_to_voxel_matches_spconv(ndim, seed, gen):
    """point_to_voxel_static into caller-made buffers, per-point voxel ids included."""
    points = uniform_cloud(gen, ndim, np.float32)
    vsize, bounds = GRIDS[ndim]
    results = []
    for module in (our_utils, real_utils):
        cls = getattr(module, f"Point2VoxelCPU{ndim}d")
        meta = cls.calc_meta_data(vsize, bounds)
        buffers = [np.zeros((900, 4, points.shape[1]), np.float32), np.zeros((900, ndim), np.int32),
                   np.zeros(900, np.int32), np.full(meta[1], -1, np.int32), np.zeros(len(points), np.int64)]
        views = [tv.from_numpy(b) for b in buffers]
        outputs = cls.point_to_voxel_static(tv.from_numpy(points), *views, *meta)
        results.append([t.numpy() for t in outputs] + [buffers[4], meta])
    ours, theirs = results
    assert ours[-1] == theirs[-1]
    assert_same_arrays(ours[:-1], theirs[:-1])


def test_meta_data_matches_spconv(gen):
    """calc_meta_data (float32 sizes, rounded grid sizes, strides, z-y-x order) on random sizes
    and ranges, OpenPCDet's usual ones among them."""
    cases = [([0.05, 0.05, 0.1], [0, -40, -3, 70.4, 40, 1]), ([0.1, 0.1, 0.15], [-75.2, -75.2, -2, 75.2, 75.2, 4]),
             ([0.075, 0.075, 0.2], [-54, -54, -5, 54, 54, 3])]
    for _ in range(20):
        size = (0.01 + torch.rand(3, generator=gen, dtype=torch.float64)).tolist()
        low = (-50 * torch.rand(3, generator=gen, dtype=torch.float64)).tolist()
        high = [lo + s * (1 + 200 * torch.rand(1, generator=gen).item()) for lo, s in zip(low, size)]
        cases.append((size, low + high))
    for vsize, bounds in cases:
        assert our_utils.Point2VoxelCPU3d.calc_meta_data(vsize, bounds) == \
            real_utils.Point2VoxelCPU3d.calc_meta_data(vsize, bounds)


def test_gather_features_by_pc_voxel_id_matches_spconv(seed, gen):
    points = torch.from_numpy(lidar_cloud(seed, 3, np.float32))
    _, _, _, ids = our_torch_utils.PointToVoxel(*generator_args(3, points.numpy(), "overflow")).generate_voxel_with_id(
        points)
    features = torch.randn(int(ids.max()) + 1, 5, generator=gen)
    for invalid in (0, -2.5):
        assert torch.equal(our_torch_utils.gather_features_by_pc_voxel_id(features, ids, invalid),
                           real_torch_utils.gather_features_by_pc_voxel_id(features, ids, invalid))


BAD_CALLS = {
    "numpy_points": (lambda g, p: g.point_to_voxel(p), TypeError, "cumm.tensorview.Tensor"),
    "int_points": (lambda g, p: g.point_to_voxel(tv.from_numpy(np.nan_to_num(p, posinf=0, neginf=0).astype(np.int32))), TypeError, "float32 or float64"),
    "feature_count": (lambda g, p: g.point_to_voxel(tv.from_numpy(np.ascontiguousarray(p[:, :3]))), ValueError,
                      "num features"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_point2voxel_rejects_what_spconv_rejects(case, gen):
    call, error, words = BAD_CALLS[case]
    points = uniform_cloud(gen, 3, np.float32)
    generator = our_utils.Point2VoxelCPU3d(*generator_args(3, points, "roomy"))
    with pytest.raises(error, match=words):
        call(generator, points)


def test_point_to_voxel_rejects_points_on_another_device_type(gen):
    generator = our_torch_utils.PointToVoxel(*generator_args(3, np.zeros((1, 4)), "roomy"), device="meta")
    with pytest.raises(ValueError, match="device"):
        generator(torch.from_numpy(uniform_cloud(gen, 3, np.float32)))
