"""nuScenes detection: annotation boxes from the global frame into the key frame's LiDAR frame
(against Rodrigues' formula in float64, and back again), the devkit's size order, category ->
detection-class map and velocity estimate (two-sided, one-sided, too far apart, alone), and on a
synthetic set: object points inside their boxes, velocities along the cars' headings."""
import math

import numpy as np
import pytest

from conftest import fresh_seed
from nuscenes_handmade import HandTables, rodrigues
from torchsparse_pp.data import nuscenes
from torchsparse_pp.data.nuscenes_detection import DETECTION_CLASSES, NuScenesDetection
from torchsparse_pp.data.synth import write_synthetic

T0 = 1_600_000_000_000_000
# The devkit's mapping, restated by name (not the library's table).
DEVKIT_DETECTION = {"vehicle.car": "car", "human.pedestrian.child": "pedestrian", "vehicle.truck": "truck",
                    "vehicle.bus.rigid": "bus", "vehicle.emergency.police": None}


def hand_detection_set(tmp_path, rng):
    tables = HandTables(cs_axis=rng.normal(size=3), cs_angle=rng.uniform(-3, 3))
    samples = ["S0", "S1", "S2"]
    poses = {}
    for i, sample in enumerate(samples):
        axis, angle = rng.normal(size=3) * [0.05, 0.05, 1], rng.uniform(-3, 3)
        te = np.array([700.0, 300.0, 0.0]) + rng.uniform(-3, 3, 3)
        world = te + rng.uniform(-30, 30, (50, 3))
        tables.add_sweep(tmp_path, f"k{i}", T0 + 500_000 * i, te, axis, angle, world,
                         np.zeros((50, 2)), sample=sample, key=True,
                         prev=f"k{i - 1}" if i else "", next=f"k{i + 1}" if i < 2 else "")
        tables.add_sample(sample, T0 + 500_000 * i, prev=samples[i - 1] if i else "",
                          next=samples[i + 1] if i < 2 else "")
        poses[sample] = (axis, angle, te)
    centre = {name: np.array([700.0, 300.0, 1.0]) + rng.uniform(-20, 20, 3) for name in "abcde"}
    shift = {name: rng.uniform(-3, 3, 3) for name in "abcde"}
    box_axis = {name: rng.normal(size=3) * [0.1, 0.1, 1] for name in "abcde"}
    size = {name: rng.uniform(0.5, 5, 3) for name in "abcde"}
    add = tables.add_annotation
    # a: car with prev and next (centred difference over 1 s)
    add("a0", "S0", "ia", "vehicle.car", centre["a"] - shift["a"], size["a"], box_axis["a"], 0.3, next="a1")
    add("a1", "S1", "ia", "vehicle.car", centre["a"], size["a"], box_axis["a"], 0.4, prev="a0", next="a2")
    add("a2", "S2", "ia", "vehicle.car", centre["a"] + shift["a"], size["a"], box_axis["a"], 0.5, prev="a1")
    # b: a child, next only (one-sided over 0.5 s)
    add("b1", "S1", "ib", "human.pedestrian.child", centre["b"], size["b"], box_axis["b"], 1.0, next="b2")
    add("b2", "S2", "ib", "human.pedestrian.child", centre["b"] + shift["b"], size["b"], box_axis["b"], 1.0, prev="b1")
    # c: a police car (no detection class); d: a truck seen at S0 and S2 (1 s apart)
    add("c1", "S1", "ic", "vehicle.emergency.police", centre["c"], size["c"], box_axis["c"], 2.0)
    add("d0", "S0", "id", "vehicle.truck", centre["d"] - shift["d"], size["d"], box_axis["d"], -1.0, next="d2")
    add("d2", "S2", "id", "vehicle.truck", centre["d"], size["d"], box_axis["d"], -1.0, prev="d0")
    # e: a bus seen once (no velocity), without LiDAR points
    add("e1", "S1", "ie", "vehicle.bus.rigid", centre["e"], size["e"], box_axis["e"], 2.5, num_lidar_pts=0)
    tables.write(tmp_path)
    return tables, poses, centre, shift, size, box_axis


def lidar_from_global_by_hand(tables, pose):
    axis, angle, te = pose
    re = rodrigues(axis, angle)
    rotation = tables.cs_rotation.T @ re.T
    return rotation, -tables.cs_rotation.T @ (re.T @ te + tables.cs_translation)


def test_boxes_into_the_lidar_frame_by_hand_and_back(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    tables, poses, centre, shift, size, box_axis = hand_detection_set(tmp_path, rng)
    ds = NuScenesDetection(tmp_path, "v1.0-hand", scenes=["scene-hand"], sweeps=1, min_points=0)
    assert len(ds) == 3 and [s[0] for s in ds.samples] == ["S0", "S1", "S2"]
    frame = ds.read_frame(1)
    names = [DETECTION_CLASSES[i] for i in frame["box_labels"]]
    assert names == ["car", "pedestrian", "bus"]  # the police car has no detection class
    assert frame["boxes"].shape == (3, 9) and frame["boxes"].dtype == np.float32
    rotation, translation = lidar_from_global_by_hand(tables, poses["S1"])
    angles = {"a": 0.4, "b": 1.0, "e": 2.5}
    velocity = {"a": 2 * shift["a"] / 1.0, "b": shift["b"] / 0.5, "e": np.zeros(3)}  # a: from a0 to a2
    for box, name in zip(frame["boxes"].astype(np.float64), "abe"):
        np.testing.assert_allclose(box[:3], rotation @ centre[name] + translation, rtol=0, atol=1e-4)
        # size is (width, length, height) in the tables; dx is the length
        np.testing.assert_allclose(box[3:6], [size[name][1], size[name][0], size[name][2]], rtol=1e-6)
        box_x_axis = rotation @ rodrigues(box_axis[name], angles[name])[:, 0]
        assert abs(math.remainder(box[6] - math.atan2(box_x_axis[1], box_x_axis[0]), 2 * math.pi)) < 1e-5
        np.testing.assert_allclose(box[7:9], (rotation @ velocity[name])[:2], rtol=0, atol=1e-5)
        # back into the global frame: the annotation's centre and heading
        back = rotation.T @ (box[:3] - translation)
        np.testing.assert_allclose(back, centre[name], rtol=0, atol=1e-3)
        heading = rotation.T @ np.array([math.cos(box[6]), math.sin(box[6]), 0.0])
        world_axis = rodrigues(box_axis[name], angles[name])[:, 0]
        # equal headings seen from the LiDAR's x-y plane
        assert np.dot(rotation @ heading, rotation @ world_axis) > 0
    # the truck at S2: prev 1 s back, one-sided: allowed up to 1.5 s
    s2 = ds.read_frame(2)
    truck = s2["boxes"][[DETECTION_CLASSES[i] == "truck" for i in s2["box_labels"]]][0]
    rotation2, _ = lidar_from_global_by_hand(tables, poses["S2"])
    np.testing.assert_allclose(truck[7:9], (rotation2 @ (shift["d"] / 1.0))[:2], rtol=0, atol=1e-5)
    assert set(DEVKIT_DETECTION.values()) - {None} <= set(DETECTION_CLASSES)


def test_velocity_gaps_min_points_and_class_subsets(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    hand_detection_set(tmp_path, rng)
    import json
    table = tmp_path / "v1.0-hand" / "sample.json"
    rows = json.loads(table.read_text())
    rows[0]["timestamp"] -= 1_000_000  # S0 now 1.5 s before S1 and 2 s before S2
    table.write_text(json.dumps(rows))
    ds = NuScenesDetection(tmp_path, "v1.0-hand", scenes=["scene-hand"], sweeps=1, min_points=0)
    s2 = ds.read_frame(2)
    truck = s2["boxes"][[DETECTION_CLASSES[i] == "truck" for i in s2["box_labels"]]][0]
    assert np.array_equal(truck[7:9], [0.0, 0.0])  # one side, 2 s > 1.5 s: no estimate
    s1 = ds.read_frame(1)
    car = s1["boxes"][[DETECTION_CLASSES[i] == "car" for i in s1["box_labels"]]][0]
    assert np.linalg.norm(car[7:9]) > 0  # two sides over 2.5 s <= 3 s: still estimated
    assert len(NuScenesDetection(tmp_path, "v1.0-hand", scenes=["scene-hand"], sweeps=1).read_frame(1)["boxes"]) == 2
    only = NuScenesDetection(tmp_path, "v1.0-hand", scenes=["scene-hand"], sweeps=1, classes=("bus", "car"),
                             min_points=0).read_frame(1)
    assert only["box_labels"].tolist() == [1, 0]
    with pytest.raises(ValueError, match="distinct detection classes"):
        NuScenesDetection(tmp_path, "v1.0-hand", scenes=["scene-hand"], classes=("car", "police"))
    with pytest.raises(ValueError, match="not both"):
        NuScenesDetection(tmp_path, "v1.0-hand", "train", scenes=["scene-hand"])
    with pytest.raises(ValueError, match=r"unknown split 'train'"):
        NuScenesDetection(tmp_path, "v1.0-hand", "train")


def inside_any(points, boxes, margin):
    d = points[:, None, :3] - boxes[None, :, :3]
    c, s = np.cos(boxes[:, 6]), np.sin(boxes[:, 6])
    lx, ly = d[..., 0] * c + d[..., 1] * s, -d[..., 0] * s + d[..., 1] * c
    half = boxes[None, :, 3:6] / 2 + margin
    return ((np.abs(lx) <= half[..., 0]) & (np.abs(ly) <= half[..., 1]) & (np.abs(d[..., 2]) <= half[..., 2])).any(1)


def test_synthetic_objects_sit_in_their_boxes_and_cars_move_along_their_heading(tmp_path):
    seed = fresh_seed() % 1000
    write_synthetic(tmp_path, "nuscenes", scans=2, seed=seed, progress=False, sweeps=2)
    det = NuScenesDetection(tmp_path, "v1.0-synth", "val", sweeps=2, min_points=0)
    seg = nuscenes.NuScenesLidarSeg(tmp_path, "val", 0.2)
    assert len(det) == 2 and len(seg) == 2
    object_classes = [nuscenes.CLASS_NAMES.index("car"), nuscenes.CLASS_NAMES.index("pedestrian")]
    moving = 0
    for k in range(2):
        frame, labelled = det.read_frame(k), seg.read_frame(k)
        assert frame["sweeps"] == 2 and frame["points"].shape[1] == 5
        assert np.array_equal(frame["points"][frame["points"][:, 4] == 0][:, :4], labelled["points"][:, :4])
        objects = labelled["points"][np.isin(labelled["labels"], object_classes)]
        assert len(objects) > 50
        assert inside_any(objects, frame["boxes"].astype(np.float64), 0.05).mean() > 0.99
        cars = frame["boxes"][frame["box_labels"] == DETECTION_CLASSES.index("car")]
        fast = cars[np.linalg.norm(cars[:, 7:9], axis=1) > 2.0]
        heading = np.arctan2(fast[:, 8], fast[:, 7])
        assert np.abs(np.remainder(heading - fast[:, 6] + np.pi, 2 * np.pi) - np.pi).max() < 0.05
        moving += len(fast)
    assert moving > 0
