"""Multi-sweep nuScenes: points of the key frame and its prev chain in the key frame's LiDAR frame,
checked against sweeps written by hand (poses as axis-angle quaternions, transforms by Rodrigues'
formula in float64), the devkit's conventions (time lag, points near the roof of earlier sweeps,
fewer sweeps where the chain ends), labels on the key frame point by point, and a synthetic
sequence whose true sensor poses are known."""
import numpy as np
import pytest

from conftest import fresh_seed
from nuscenes_handmade import HandTables, rodrigues
from torchsparse_pp.data import NuScenesLidarSeg, nuscenes
from torchsparse_pp.data.synth import write_synthetic
from torchsparse_pp.data.synth_nuscenes import SWEEP_INTERVAL
from torchsparse_pp.data.synthetic_sequence import generate_sequence

T0 = 1_500_000_000_000_000


def hand_scene(tmp_path, rng, n=60):
    """Three sweeps (oldest first: s0, s1, key) of random global points; each sweep also holds
    two points on its own roof (|x|, |y| < 1 m in its sensor frame). Returns the tables and, per
    sweep, the float32 sensor-frame points the file holds and the ego pose (axis, angle, t)."""
    tables = HandTables(cs_axis=rng.normal(size=3), cs_angle=rng.uniform(-3, 3),
                        cs_translation=rng.uniform(-1, 2, 3))
    files, poses = {}, {}
    tokens = ["s0", "s1", "key"]
    for i, token in enumerate(tokens):
        axis, angle = rng.normal(size=3), rng.uniform(-3, 3)
        te = np.array([400.0, 1100.0, 0.0]) + rng.uniform(-5, 5, 3)
        world = te + rng.uniform(-40, 40, (n, 3))
        # roof points: given in the sensor frame, mapped to global by hand
        roof_sensor = np.array([[0.4, -0.7, 0.2], [-0.9, 0.3, -0.1]])
        roof = (roof_sensor @ tables.cs_rotation.T + tables.cs_translation) @ rodrigues(axis, angle).T + te
        extra = np.stack([rng.uniform(0, 255, n + 2), rng.integers(0, 32, n + 2)], 1)
        sensor = tables.add_sweep(tmp_path, token, T0 + 50_000 * i, te, axis, angle, np.concatenate([world, roof]),
                                  extra, sample="sample", key=token == "key",
                                  prev=tokens[i - 1] if i else "", next=tokens[i + 1] if i < 2 else "")
        files[token] = np.concatenate([sensor, extra], 1).astype(np.float32)
        poses[token] = (axis, angle, te)
    tables.add_sample("sample", T0 + 100_000)
    raw = rng.integers(0, 32, n + 2)
    labels_rel = tables.add_labels(tmp_path, "key", raw)
    tables.write(tmp_path)
    (tmp_path / "splits").mkdir()
    (tmp_path / "splits" / "mini.txt").write_text(f"samples/LIDAR_TOP/key.pcd.bin {labels_rel}\n")
    return tables, files, poses, raw


def by_hand_into_key(tables, poses, token, sensor_xyz):
    """p_key = Rc^T (Rk^T (Rj (Rc p + tc) + tj - tk) - tc), every rotation from Rodrigues."""
    axis_j, angle_j, t_j = poses[token]
    axis_k, angle_k, t_k = poses["key"]
    world = (sensor_xyz.astype(np.float64) @ tables.cs_rotation.T + tables.cs_translation) @ \
        rodrigues(axis_j, angle_j).T + t_j
    ego = (world - t_k) @ rodrigues(axis_k, angle_k)
    return (ego - tables.cs_translation) @ tables.cs_rotation


def test_sweeps_land_in_the_key_frame_as_computed_by_hand(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    tables, files, poses, raw = hand_scene(tmp_path, rng)
    ds = NuScenesLidarSeg(tmp_path, "mini", 0.5, sweeps=3, version="v1.0-hand")
    frame = ds.read_frame(0)
    points, labels = frame["points"], frame["labels"]
    assert points.shape == (3 * 62 - 4, 6) and frame["sweeps"] == 3
    # the key frame: the file's rows, unchanged and first (its roof points included)
    assert np.array_equal(points[:62, :5], files["key"]) and (points[:62, 5] == 0).all()
    start = 62
    for token, lag in (("s1", 0.05), ("s0", 0.1)):
        rows = files[token][:-2]  # its two roof points are dropped
        got = points[start:start + len(rows)]
        np.testing.assert_allclose(got[:, :3], by_hand_into_key(tables, poses, token, rows[:, :3]), rtol=0, atol=2e-4)
        assert np.array_equal(got[:, 3:5], rows[:, 3:5])
        np.testing.assert_allclose(got[:, 5], lag, rtol=1e-6)
        start += len(rows)
    # labels: the key frame's point by point, IGNORE on the earlier sweeps
    assert np.array_equal(labels[:62], nuscenes.map_labels(raw)) and (labels[62:] == nuscenes.IGNORE_INDEX).all()
    assert np.array_equal(frame["raw_labels"], raw)
    sample = ds[0]
    assert sample["lidar"].F.shape[1] == 6 and len(sample["point_targets"]) == len(points)


def test_the_chain_ends_at_the_start_of_the_scene_and_sweeps_one_is_the_key_frame(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    _, files, _, raw = hand_scene(tmp_path, rng)
    many = NuScenesLidarSeg(tmp_path, "mini", 0.5, sweeps=10, version="v1.0-hand").read_frame(0)
    # Fewer sweeps, as the devkit: the older sweeps lose their points within 1 m of their sensor
    # (the two roof points each, and any random point that lands there).
    far = [~((np.abs(files[t][:, 0]) < 1) & (np.abs(files[t][:, 1]) < 1)) for t in ("s0", "s1")]
    assert all(int((~f).sum()) >= 2 for f in far)
    assert many["sweeps"] == 3 and len(many["points"]) == len(files["key"]) + sum(int(f.sum()) for f in far)
    two = NuScenesLidarSeg(tmp_path, "mini", 0.5, sweeps=2, version="v1.0-hand").read_frame(0)
    assert two["sweeps"] == 2 and np.array_equal(np.unique(two["points"][:, 5]), np.float32([0.0, 0.05]))
    one = NuScenesLidarSeg(tmp_path, "mini", 0.5, version="v1.0-hand").read_frame(0)
    plain = NuScenesLidarSeg(tmp_path, "mini", 0.5).read_frame(0)
    assert np.array_equal(one["points"], files["key"]) and np.array_equal(plain["points"], files["key"])
    tables = NuScenesLidarSeg.from_tables(tmp_path, "v1.0-hand", 0.5, sweeps=3)
    assert np.array_equal(tables.read_frame(0)["points"], many["points"])
    with pytest.raises(ValueError, match="sweeps=3 needs the nuScenes tables"):
        NuScenesLidarSeg(tmp_path, "mini", sweeps=3)
    with pytest.raises(ValueError, match="sweeps must be a positive int"):
        NuScenesLidarSeg(tmp_path, "mini", sweeps=0, version="v1.0-hand")


def kabsch(a, b):
    """The rotation R with b ~ a R^T (least squares)."""
    u, _, vt = np.linalg.svd(a.T @ b)
    d = np.sign(np.linalg.det(vt.T @ u.T))
    return vt.T @ np.diag([1, 1, d]) @ u.T


def test_synthetic_sweeps_follow_the_true_sensor_poses(tmp_path):
    """Written by synth (quaternions in the tables), read back: every earlier sweep's points are
    where the generator's true poses put them in the key frame."""
    seed = fresh_seed() % 1000
    write_synthetic(tmp_path, "nuscenes", scans=1, seed=seed, progress=False, sweeps=3)
    frame = NuScenesLidarSeg(tmp_path, "train", 0.2, sweeps=3, version="v1.0-synth").read_frame(0)
    seq = generate_sequence("nuscenes32", seed, (np.arange(3) - 2) * SWEEP_INTERVAL)
    points, lag = frame["points"], frame["points"][:, 5]
    key = points[lag == 0][:, :3].astype(np.float64)
    # The LiDAR frame's fixed turn against the generator's level frame, estimated from the key frame.
    lidar_from_level = kabsch(seq.points[2][:, :3].astype(np.float64), key)
    assert np.abs(seq.points[2][:, :3] @ lidar_from_level.T - key).max() < 1e-4
    key_from_scene = np.linalg.inv(seq.sensor_poses[2])
    for k, expected_lag in ((1, SWEEP_INTERVAL), (0, 2 * SWEEP_INTERVAL)):
        level = seq.points[k][:, :3].astype(np.float64)
        in_file = level @ lidar_from_level.T
        kept = ~((np.abs(in_file[:, 0]) < 1.0) & (np.abs(in_file[:, 1]) < 1.0))
        move = key_from_scene @ seq.sensor_poses[k]
        expected = (level[kept] @ move[:3, :3].T + move[:3, 3]) @ lidar_from_level.T
        got = points[np.isclose(lag, expected_lag)][:, :3]
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() < 2e-3  # float32 files and poses; the ego moved metres
        assert np.abs(got - in_file[kept]).max() > 0.1  # the sweeps are not simply stacked
