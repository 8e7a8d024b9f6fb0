"""Waymo in OpenPCDet's processed layout: a segment written by hand (infos .pkl, frame .npy) read
back (tanh of the intensity, the no-label-zone flag, the 3 classes), earlier frames carried into
the current vehicle frame through the poses (against Rodrigues' formula in float64), the time lag
and the start of a segment; and a synthetic segment whose static poles line up across frames."""
import pickle

import numpy as np
import pytest

from conftest import fresh_seed
from nuscenes_handmade import rodrigues
from torchsparse_pp.data.synth import write_synthetic
from torchsparse_pp.data.synthetic import POLE
from torchsparse_pp.data.synthetic_sequence import generate_sequence
from torchsparse_pp.data.waymo import DEFAULT_TAG, FRAME_INTERVAL, WAYMO_CLASSES, WaymoDataset

SEGMENT = "segment-hand_with_camera_labels"


def pose(axis, angle, translation):
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = rodrigues(axis, angle), translation
    return out


def hand_segment(root, rng, frames=3, n=80):
    folder = root / DEFAULT_TAG / SEGMENT
    folder.mkdir(parents=True)
    (root / "ImageSets").mkdir()
    (root / "ImageSets" / "val.txt").write_text(f"{SEGMENT}.tfrecord\n")
    poses = [pose(rng.normal(size=3) * [0.05, 0.05, 1], rng.uniform(-3, 3), rng.uniform(-900, 900, 3))
             for _ in range(frames)]
    poses = [p.astype(np.float32).astype(np.float64) for p in poses]  # as the info stores them
    # Two points of every earlier frame that land on the last frame's roof (|x|, |y| < 1 m there):
    # OpenPCDet drops those after the move.
    roof = np.array([[0.3, -0.5, 1.0], [-0.8, 0.2, 0.5]])
    infos, clouds = [], []
    for k in range(frames):
        cloud = np.concatenate([rng.uniform(-40, 40, (n, 3)), rng.uniform(0, 3, (n, 1)), rng.uniform(0, 1, (n, 1)),
                                rng.choice([-1.0, 1.0], (n, 1), p=[0.9, 0.1])], 1).astype(np.float32)
        if k < frames - 1:
            move = np.linalg.inv(poses[k]) @ poses[-1]
            cloud[:2, :3] = roof @ move[:3, :3].T + move[:3, 3]
        np.save(folder / f"{k:04d}.npy", cloud)
        names = np.array(["Vehicle", "Sign", "Cyclist", "Pedestrian", "unknown"])
        boxes = np.concatenate([rng.uniform(-30, 30, (5, 3)), rng.uniform(0.5, 5, (5, 3)),
                                rng.uniform(-3, 3, (5, 1)), rng.normal(size=(5, 2))], 1)
        infos.append({"point_cloud": {"num_features": 5, "lidar_sequence": SEGMENT, "sample_idx": k},
                      "frame_id": f"{SEGMENT}_{k:03d}", "pose": poses[k].astype(np.float32),
                      "annos": {"name": names, "gt_boxes_lidar": boxes, "num_points_in_gt": np.ones(5)}})
        clouds.append(cloud)
    with open(folder / f"{SEGMENT}.pkl", "wb") as f:
        pickle.dump(infos, f)
    return infos, clouds, poses


def test_frames_boxes_and_classes(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    infos, clouds, _ = hand_segment(tmp_path, rng)
    ds = WaymoDataset(tmp_path, "val", 0.2)
    assert len(ds) == 3 and ds.point_features == 5
    frame = ds.read_frame(1)
    expected = clouds[1][:, :5].copy()
    expected[:, 3] = np.tanh(expected[:, 3])
    assert np.array_equal(frame["points"], expected) and frame["frame_id"] == f"{SEGMENT}_001"
    assert [WAYMO_CLASSES[i] for i in frame["box_labels"]] == ["Vehicle", "Cyclist", "Pedestrian"]
    np.testing.assert_array_equal(frame["boxes"], infos[1]["annos"]["gt_boxes_lidar"][[0, 2, 3]].astype(np.float32))
    kept = WaymoDataset(tmp_path, "val", 0.2, drop_nlz=True).read_frame(1)["points"]
    assert np.array_equal(kept, expected[clouds[1][:, 5] == -1])
    only = WaymoDataset(tmp_path, "val", 0.2, classes=("Pedestrian",)).read_frame(1)
    assert only["box_labels"].tolist() == [0] and only["boxes"].shape == (1, 9)
    assert ds[0]["lidar"].F.shape[1] == 5


def test_earlier_frames_through_the_poses_by_hand(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    _, clouds, poses = hand_segment(tmp_path, rng)
    ds = WaymoDataset(tmp_path, "val", 0.2, frames=3)
    assert ds.point_features == 6
    frame = ds.read_frame(2)
    points = frame["points"]
    assert frame["sweeps"] == 3 and len(points) == 80 + 2 * 78
    assert (points[:80, 5] == 0).all() and np.array_equal(points[:80, :3], clouds[2][:, :3])
    start = 80
    for previous, lag in ((1, 0.1), (0, 0.2)):
        rows = clouds[previous][2:]
        world = rows[:, :3].astype(np.float64) @ poses[previous][:3, :3].T + poses[previous][:3, 3]
        into_current = (world - poses[2][:3, 3]) @ poses[2][:3, :3]  # R^T (p - t), by hand
        got = points[start:start + 78]
        np.testing.assert_allclose(got[:, :3], into_current, rtol=0, atol=5e-4)
        np.testing.assert_allclose(got[:, 3], np.tanh(rows[:, 3]), rtol=1e-6)
        np.testing.assert_allclose(got[:, 5], lag, rtol=1e-6)
        start += 78
    # the start of the segment: fewer frames
    first = ds.read_frame(0)
    assert first["sweeps"] == 1 and len(first["points"]) == 80 and (first["points"][:, 5] == 0).all()
    assert ds.read_frame(1)["sweeps"] == 2


def test_synthetic_segment_poles_line_up_across_frames(tmp_path):
    seed = fresh_seed() % 1000
    write_synthetic(tmp_path, "waymo", scans=3, seed=seed, progress=False)
    assert (tmp_path / f"{DEFAULT_TAG}_infos_train.pkl").is_file()
    ds = WaymoDataset(tmp_path, "train", 0.2, frames=3)
    frame = ds.read_frame(2)
    seq = generate_sequence("waymo64", seed, np.arange(3) * FRAME_INTERVAL)
    lag = frame["points"][:, 5]
    current = frame["points"][lag == 0]
    assert len(current) == len(seq.points[2])
    poles_now = current[seq.labels[2] == POLE][:, :3].astype(np.float64)
    assert len(poles_now) > 20
    earlier = frame["points"][np.isclose(lag, 2 * FRAME_INTERVAL)]
    assert len(earlier) == len(seq.points[0])  # nothing of it lands on the current roof
    poles_then = earlier[seq.labels[0] == POLE][:, :3].astype(np.float64)
    raw = np.load(tmp_path / DEFAULT_TAG / ds.infos[0]["point_cloud"]["lidar_sequence"] / "0000.npy")
    raw_poles = raw[seq.labels[0] == POLE][:, :3].astype(np.float64)

    def nearest(a, b):
        return np.sqrt(((a[:, None] - b[None]) ** 2).sum(-1)).min(1)
    # Static poles two frames (and a metre or more of driving) apart coincide once aligned.
    assert np.median(nearest(poles_now, poles_then)) < 0.1
    assert np.median(nearest(poles_now, raw_poles)) > 0.3
    boxes = frame["boxes"]
    assert boxes.shape[1] == 9 and set(frame["box_labels"].tolist()) <= {0, 1, 2}
    with pytest.raises(ValueError, match="frames must be a positive int"):
        WaymoDataset(tmp_path, "train", frames=0)
