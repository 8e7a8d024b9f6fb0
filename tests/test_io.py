"""Point-cloud files (numpy formats always, .pcd/.ply through open3d), the open3d viewer's guard,
and sparse_quantize against open3d's voxel downsampling."""
import sys

import numpy as np
import pytest

from torchsparse_pp import io
from torchsparse_pp.data import generate_scan
from torchsparse_pp.utils import sparse_quantize


def _open3d():
    """open3d, or a skip: it is an optional extra and needs libusb-1.0 on the system."""
    try:
        import open3d
    except Exception as err:  # ImportError, or OSError from a missing system library
        pytest.skip(f"open3d is not importable: {err}")
    return open3d


def _points(seed, n=700, columns=4):
    return np.random.default_rng(seed).uniform(-50.0, 50.0, (n, columns)).astype(np.float32)


# --- numpy formats ------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix, columns", [(".bin", 4), (".bin", 5), (".npy", 4), (".npy", 3)])
def test_numpy_formats_round_trip(tmp_path, seed, suffix, columns):
    points = _points(seed, columns=columns)
    path = tmp_path / f"scan{suffix}"
    io.write_points(path, points)
    got = io.read_points(path, columns=columns)
    assert got.dtype == np.float32 and np.array_equal(got, points)


def test_bin_is_kitti_layout(tmp_path, seed):
    points = _points(seed)
    io.write_points(tmp_path / "a.bin", points)
    raw = np.frombuffer((tmp_path / "a.bin").read_bytes(), dtype="<f4")
    assert np.array_equal(raw, points.reshape(-1))  # flat little-endian float32 records


def test_bad_files(tmp_path, seed):
    points = _points(seed, n=701)
    io.write_points(tmp_path / "a.bin", points)
    data = (tmp_path / "a.bin").read_bytes()
    (tmp_path / "b.bin").write_bytes(data[:-5])
    with pytest.raises(ValueError, match=r"has 11211 bytes, not a multiple of the 16-byte record"):
        io.read_points(tmp_path / "b.bin")
    with pytest.raises(ValueError, match="not a multiple of the 20-byte record"):
        io.read_points(tmp_path / "a.bin", columns=5)  # 701 * 16 bytes are not whole 20-byte records
    with pytest.raises(FileNotFoundError, match="does not exist"):
        io.read_points(tmp_path / "missing.bin")
    with pytest.raises(ValueError, match="unsupported point file suffix '.las'"):
        io.read_points(tmp_path / "a.las")
    with pytest.raises(ValueError, match="points must be"):
        io.write_points(tmp_path / "c.npy", points[:, :2])
    with pytest.raises(ValueError, match="hold no colours"):
        io.write_points(tmp_path / "c.npy", points, colors=np.zeros((len(points), 3), np.uint8))


def test_missing_open3d_names_the_io_extra(tmp_path, monkeypatch, seed):
    monkeypatch.setitem(sys.modules, "open3d", None)  # makes `import open3d` raise ImportError
    # Reading needs numpy only (header-checked readers); writing .pcd/.ply needs open3d.
    (tmp_path / "a.ply").write_text("ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\n"
                                    "property float y\nproperty float z\nend_header\n1 2 3\n")
    assert io.read_points(tmp_path / "a.ply").tolist() == [[1.0, 2.0, 3.0]]
    with pytest.raises(ImportError, match=r"torchsparse-pp\[io\]"):
        io.write_points(tmp_path / "a.ply", _points(seed))
    with pytest.raises(ImportError, match="'io' extra"):
        io.write_points(tmp_path / "a.pcd", _points(seed))
    with pytest.raises(ImportError, match="'io' extra"):
        io.save_prediction_ply(tmp_path / "p.ply", _points(seed), np.zeros(700, np.int64))


def test_label_colors(seed):
    colors = io.label_colors(np.arange(20))
    assert colors.dtype == np.uint8 and len(np.unique(colors, axis=0)) == 20
    labels = np.random.default_rng(seed).integers(0, 40, 100)
    labels[::7] = 255
    got = io.label_colors(labels)
    assert (got[labels == 255] == 128).all()
    assert np.array_equal(got[labels != 255], colors[labels[labels != 255] % 20])
    with pytest.raises(ValueError, match="1-D integer"):
        io.label_colors(np.zeros(4))


# --- open3d formats -----------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".ply", ".pcd"])
@pytest.mark.parametrize("columns", [3, 4])
def test_open3d_round_trip(tmp_path, seed, suffix, columns):
    _open3d()
    points = _points(seed, columns=columns)
    path = tmp_path / f"scan{suffix}"
    io.write_points(path, points)
    got = io.read_points(path)
    assert got.dtype == np.float32 and np.array_equal(got, points)


def test_open3d_reads_what_it_wrote_itself(tmp_path, seed):
    o3d = _open3d()
    points = _points(seed)[:, :3].astype(np.float64)
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(points))
    o3d.io.write_point_cloud(str(tmp_path / "x.pcd"), cloud)  # legacy writer, doubles, no intensity
    assert np.allclose(io.read_points(tmp_path / "x.pcd"), points, rtol=0, atol=1e-5)


def test_open3d_bad_inputs(tmp_path, seed):
    _open3d()
    (tmp_path / "bad.ply").write_text("this is not a ply file\n")
    with pytest.raises(ValueError, match=r"bad\.ply' is not a PLY file"):
        io.read_points(tmp_path / "bad.ply")
    with pytest.raises(FileNotFoundError):
        io.read_points(tmp_path / "none.pcd")
    with pytest.raises(ValueError, match="at most 4"):
        io.write_points(tmp_path / "x.ply", _points(seed, columns=5))
    with pytest.raises(ValueError, match="colors must be uint8"):
        io.write_points(tmp_path / "x.ply", _points(seed), colors=np.zeros((700, 3)))


def test_prediction_ply(tmp_path, seed):
    o3d = _open3d()
    points = _points(seed)
    labels = np.random.default_rng(seed).integers(0, 19, len(points))
    labels[:5] = 255
    io.save_prediction_ply(tmp_path / "pred.ply", points, labels)
    cloud = o3d.t.io.read_point_cloud(str(tmp_path / "pred.ply"))
    assert np.array_equal(cloud.point.positions.numpy(), points[:, :3])
    assert np.array_equal(cloud.point.colors.numpy(), io.label_colors(labels))
    with pytest.raises(ValueError, match="writes .ply"):
        io.save_prediction_ply(tmp_path / "pred.pcd", points, labels)
    with pytest.raises(ValueError, match="one entry per point"):
        io.save_prediction_ply(tmp_path / "pred.ply", points, labels[1:])


# --- sparse_quantize vs open3d voxel downsampling -----------------------------------------------
def _cloud_cases(seed):
    rng = np.random.default_rng(seed)
    uniform = rng.uniform(-4.0, 6.0, (4000, 3))
    lidar = generate_scan(32, seed=seed % 10_000)["points"][:, :3].astype(np.float64)
    return [("uniform", uniform, float(rng.uniform(0.15, 0.6))), ("lidar", lidar, float(rng.uniform(0.1, 0.4)))]


def test_quantize_matches_open3d_voxel_down_sample(seed):
    o3d = _open3d()
    for name, points, voxel in _cloud_cases(seed):
        cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(points))
        centroids = np.asarray(cloud.voxel_down_sample(voxel).points)
        # open3d's grid starts half a voxel below the cloud's minimum corner
        origin = cloud.get_min_bound() - voxel / 2
        ours = sparse_quantize(points - origin, voxel)
        theirs = np.unique(np.floor((centroids - origin) / voxel).astype(np.int64), axis=0)  # centroid stays in its voxel
        assert len(centroids) == len(ours), name
        assert np.array_equal(ours, theirs), name


def test_quantize_groups_match_open3d_trace(seed):
    o3d = _open3d()
    rng = np.random.default_rng(seed)
    for name, points, voxel in _cloud_cases(seed):
        cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(points))
        # the traced variant's grid starts exactly at the given min_bound; pick one below the cloud
        min_bound = cloud.get_min_bound() - rng.uniform(0.0, 2.0, 3)
        _, _, traced = cloud.voxel_down_sample_and_trace(voxel, min_bound, cloud.get_max_bound(), False)
        theirs = sorted(tuple(sorted(group)) for group in traced)
        _, inverse = sparse_quantize(points - min_bound, voxel, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        splits = np.flatnonzero(np.diff(inverse[order])) + 1
        ours = sorted(tuple(g.tolist()) for g in np.split(order, splits))
        assert ours == theirs, name


# --- viewer guard -------------------------------------------------------------------------------
def test_show_open3d_needs_a_display(monkeypatch, seed):
    from torchsparse_pp import viz

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert not viz.has_display()
    with pytest.raises(RuntimeError, match="needs a display.*bev_png"):
        viz.show_open3d(_points(seed))
    monkeypatch.setenv("DISPLAY", ":99")
    assert viz.has_display()
    with pytest.raises(ValueError, match="one entry per point"):
        viz.show_open3d(_points(seed), labels=np.zeros(3, np.int64))
