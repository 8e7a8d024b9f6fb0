"""Dataset readers on files written in the real formats, transforms, the synth CLI and the BEV PNG."""
import math

import numpy as np
import pytest
import torch

from torchsparse_pp.cli import main as cli_main
from torchsparse_pp.data import (Compose, DetectionDataset, NuScenesLidarSeg, PointCap, RandomFlip, RandomRotation,
                                 RandomScale, SemanticKITTI, Voxelize, generate_scan, write_synthetic)
from torchsparse_pp.data import nuscenes, semantickitti
from torchsparse_pp.data.detection import read_boxes, write_boxes
from torchsparse_pp.data.transforms import rotate_z
from torchsparse_pp.utils import sparse_collate_fn

# The official tables, restated by class name so the test does not reuse the library's numbers.
KITTI_RAW_TO_NAME = {
    0: None, 1: None, 10: "car", 11: "bicycle", 13: "other-vehicle", 15: "motorcycle", 16: "other-vehicle",
    18: "truck", 20: "other-vehicle", 30: "person", 31: "bicyclist", 32: "motorcyclist", 40: "road",
    44: "parking", 48: "sidewalk", 49: "other-ground", 50: "building", 51: "fence", 52: None, 60: "road",
    70: "vegetation", 71: "trunk", 72: "terrain", 80: "pole", 81: "traffic-sign", 99: None, 252: "car",
    253: "bicyclist", 254: "person", 255: "motorcyclist", 256: "other-vehicle", 257: "other-vehicle",
    258: "truck", 259: "other-vehicle",
}
NUSC_RAW_TO_NAME = {
    0: None, 1: None, 2: "pedestrian", 3: "pedestrian", 4: "pedestrian", 5: None, 6: "pedestrian", 7: None,
    8: None, 9: "barrier", 10: None, 11: None, 12: "traffic_cone", 13: None, 14: "bicycle", 15: "bus",
    16: "bus", 17: "car", 18: "construction_vehicle", 19: None, 20: None, 21: "motorcycle", 22: "trailer",
    23: "truck", 24: "driveable_surface", 25: "other_flat", 26: "sidewalk", 27: "terrain", 28: "manmade",
    29: None, 30: "vegetation", 31: None,
}
# generator's raw ids -> the nuScenes challenge class synth should give them
GENERATOR_TO_NUSC = {10: "car", 30: "pedestrian", 40: "driveable_surface", 48: "sidewalk", 72: "terrain",
                     50: "manmade", 51: "manmade", 80: "manmade", 70: "vegetation", 71: "vegetation"}


def _kitti_class(raw):
    name = KITTI_RAW_TO_NAME[int(raw)]
    return 255 if name is None else semantickitti.CLASS_NAMES.index(name)


def _nusc_class(raw):
    name = NUSC_RAW_TO_NAME[int(raw)]
    return 255 if name is None else nuscenes.CLASS_NAMES.index(name)


def _random_points(rng, n, columns=4):
    points = rng.uniform(-20.0, 20.0, (n, columns)).astype(np.float32)
    points[:, 2] = rng.uniform(-2.0, 3.0, n)
    return points


def _write_kitti_scan(root, seq, name, points, raw_labels=None):
    velodyne = root / "sequences" / seq / "velodyne"
    velodyne.mkdir(parents=True, exist_ok=True)
    points.astype(np.float32).tofile(velodyne / f"{name}.bin")
    if raw_labels is not None:
        labels = root / "sequences" / seq / "labels"
        labels.mkdir(parents=True, exist_ok=True)
        raw_labels.astype(np.uint32).tofile(labels / f"{name}.label")


def _check_voxel_sample(sample, points, voxel):
    """coords/feats/inverse_map/targets agree with an independent floor-voxelisation of points."""
    lidar = sample["lidar"]
    coords = lidar.C.numpy()
    assert (coords[:, 0] == 0).all()
    inverse = sample["inverse_map"].numpy()
    expected = np.floor(points[:, :3].astype(np.float64) / voxel).astype(np.int64)
    assert np.array_equal(coords[inverse, 1:], expected)  # every point maps to its own voxel
    assert len(np.unique(coords[:, 1:], axis=0)) == len(coords)
    feats = lidar.F.numpy()
    for v in np.random.default_rng(0).choice(len(coords), 50):
        members = np.flatnonzero(inverse == v)
        assert np.array_equal(feats[v], points[members[0]])  # represented by its first point
        if "targets" in sample:
            assert sample["targets"][v] == sample["point_targets"][members[0]]


# --- SemanticKITTI -----------------------------------------------------------------------------
def test_semantickitti_learning_map_and_instances(tmp_path, seed):
    rng = np.random.default_rng(seed)
    raw_ids = np.array(sorted(KITTI_RAW_TO_NAME))
    n = 3000
    semantic = np.concatenate([raw_ids, rng.choice(raw_ids, n - len(raw_ids))])
    rng.shuffle(semantic)
    instance = rng.integers(0, 1 << 16, n)
    points = _random_points(rng, n)
    _write_kitti_scan(tmp_path, "08", "000000", points, semantic | (instance << 16))

    ds = SemanticKITTI(tmp_path, "val", voxel_size=0.5)
    assert ds.sequences == ["08"] and len(ds) == 1
    frame = ds.read_frame(0)
    assert np.array_equal(frame["points"], points)
    expected = np.array([_kitti_class(r) for r in semantic])
    assert np.array_equal(frame["labels"], expected)
    assert np.array_equal(frame["raw_labels"], semantic)
    assert np.array_equal(frame["instances"], instance)

    sample = ds[0]
    assert np.array_equal(sample["point_targets"].numpy(), expected)
    assert np.array_equal(sample["point_instances"].numpy(), instance)
    _check_voxel_sample(sample, points, 0.5)


def test_semantickitti_map_labels_rejects_unknown_ids():
    with pytest.raises(ValueError, match=r"\[5, 300\].*not in the learning map"):
        semantickitti.map_labels(np.array([10, 5, 40, 300], dtype=np.uint32))


def test_semantickitti_splits_and_sequences(tmp_path, seed):
    rng = np.random.default_rng(seed)
    for seq, count in (("00", 2), ("03", 1), ("08", 1), ("11", 2)):
        for i in range(count):
            points = _random_points(rng, 200)
            labels = None if seq == "11" else rng.choice([10, 40, 252], 200)
            _write_kitti_scan(tmp_path, seq, f"{i:06d}", points, labels)

    train = SemanticKITTI(tmp_path, "train", voxel_size=0.2)
    assert train.sequences == ["00", "03"] and len(train) == 3
    assert [p.parent.parent.name for p in train.scans] == ["00", "00", "03"]
    test = SemanticKITTI(tmp_path, "test", voxel_size=0.2)
    assert not test.with_labels and "targets" not in test[1] and "labels" not in test.read_frame(0)
    explicit = SemanticKITTI(tmp_path, "val", 0.2, sequences=[3, "08"])
    assert explicit.sequences == ["03", "08"] and len(explicit) == 2

    with pytest.raises(ValueError, match="unknown split 'training'"):
        SemanticKITTI(tmp_path, "training")
    with pytest.raises(FileNotFoundError, match=r"sequences \['05'\] do not exist"):
        SemanticKITTI(tmp_path, "train", sequences=["05"])
    with pytest.raises(TypeError, match="must be a list"):
        SemanticKITTI(tmp_path, "val", sequences="08")
    with pytest.raises(ValueError, match="sequence names are digits"):
        SemanticKITTI(tmp_path, "train", sequences=["seq0"])
    with pytest.raises(FileNotFoundError, match="has no label file"):
        SemanticKITTI(tmp_path, "val", sequences=["11"], with_labels=True).read_frame(0)
    with pytest.raises(FileNotFoundError, match="no 'sequences' directory"):
        SemanticKITTI(tmp_path / "missing", "train")


def test_semantickitti_corrupt_files(tmp_path, seed):
    rng = np.random.default_rng(seed)
    points = _random_points(rng, 100)
    _write_kitti_scan(tmp_path, "08", "000000", points, rng.choice([10, 40], 100))
    ds = SemanticKITTI(tmp_path, "val")
    scan = tmp_path / "sequences" / "08" / "velodyne" / "000000.bin"
    label = tmp_path / "sequences" / "08" / "labels" / "000000.label"

    label.write_bytes(label.read_bytes()[:-4])  # one label short
    with pytest.raises(ValueError, match="has 99 labels but its scan has 100 points"):
        ds[0]
    label.write_bytes(label.read_bytes()[:-2])
    with pytest.raises(ValueError, match="not a multiple of the 4-byte record"):
        ds[0]
    scan.write_bytes(scan.read_bytes()[:-3])  # truncated scan
    with pytest.raises(ValueError, match="not a multiple of the 16-byte record"):
        ds[0]


# --- nuScenes ----------------------------------------------------------------------------------
def _write_nusc_frame(root, name, points, raw):
    (root / "samples").mkdir(exist_ok=True)
    (root / "lidarseg").mkdir(exist_ok=True)
    points.astype(np.float32).tofile(root / "samples" / f"{name}.pcd.bin")
    raw.astype(np.uint8).tofile(root / "lidarseg" / f"{name}_lidarseg.bin")
    return f"samples/{name}.pcd.bin lidarseg/{name}_lidarseg.bin"


def test_nuscenes_index_and_label_map(tmp_path, seed):
    rng = np.random.default_rng(seed)
    lines = []
    frames = []
    for i in range(2):
        n = 500 + i
        raw = np.concatenate([np.arange(32), rng.integers(0, 32, n - 32)])
        points = _random_points(rng, n, columns=5)
        lines.append(_write_nusc_frame(tmp_path, f"f{i}", points, raw))
        frames.append((points, raw))
    (tmp_path / "splits").mkdir()
    (tmp_path / "splits" / "mini.txt").write_text("# frames\n" + lines[1] + "\n\n" + lines[0] + "\n")

    ds = NuScenesLidarSeg(tmp_path, "mini", voxel_size=0.7)
    assert len(ds) == 2
    for k, (points, raw) in zip((1, 0), frames):
        frame = ds.read_frame(k)
        assert np.array_equal(frame["points"], points)
        assert np.array_equal(frame["labels"], [_nusc_class(r) for r in raw])
    _check_voxel_sample(ds[0], frames[1][0], 0.7)

    with pytest.raises(ValueError, match=r"unknown split 'train'.*\['mini'\]"):
        NuScenesLidarSeg(tmp_path, "train")
    (tmp_path / "splits" / "bad.txt").write_text("samples/f0.pcd.bin\n")
    with pytest.raises(ValueError, match=r"bad.txt:1: expected '<points path> <labels path>'"):
        NuScenesLidarSeg(tmp_path, "bad")
    (tmp_path / "splits" / "gone.txt").write_text("samples/f9.pcd.bin lidarseg/f0_lidarseg.bin\n")
    with pytest.raises(FileNotFoundError, match="f9.pcd.bin"):
        NuScenesLidarSeg(tmp_path, "gone")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        NuScenesLidarSeg(tmp_path / "nowhere", "mini")


def test_nuscenes_bad_files(tmp_path, seed):
    rng = np.random.default_rng(seed)
    line = _write_nusc_frame(tmp_path, "f", _random_points(rng, 100, 5), rng.integers(0, 32, 100))
    (tmp_path / "splits").mkdir()
    (tmp_path / "splits" / "s.txt").write_text(line + "\n")
    ds = NuScenesLidarSeg(tmp_path, "s")
    labels = tmp_path / "lidarseg" / "f_lidarseg.bin"
    labels.write_bytes(labels.read_bytes() + b"\x01")
    with pytest.raises(ValueError, match="has 101 labels but .* has 100 points"):
        ds[0]
    labels.write_bytes(bytes([3, 40] + [0] * 98))
    with pytest.raises(ValueError, match=r"raw lidarseg ids \[40\] are outside"):
        ds[0]
    scan = tmp_path / "samples" / "f.pcd.bin"
    scan.write_bytes(scan.read_bytes()[:-4])  # 4 values in the last record instead of 5
    with pytest.raises(ValueError, match="not a multiple of the 20-byte record"):
        ds[0]


# --- detection ---------------------------------------------------------------------------------
def test_detection_boxes_round_trip_and_errors(tmp_path, seed):
    rng = np.random.default_rng(seed)
    boxes = np.concatenate([rng.uniform(-30, 30, (6, 3)), rng.uniform(0.3, 5, (6, 3)),
                            rng.uniform(-np.pi, np.pi, (6, 1))], 1).astype(np.float32)
    labels = rng.integers(0, 2, 6)
    write_boxes(tmp_path / "b.txt", boxes, labels)
    got_boxes, got_labels = read_boxes(tmp_path / "b.txt")
    assert np.array_equal(got_boxes, boxes) and np.array_equal(got_labels, labels)

    (tmp_path / "c.txt").write_text("# x\n\ntruck 1 2 3 4 5 6 0\n")
    with pytest.raises(ValueError, match=r"c.txt:3: unknown class 'truck'"):
        read_boxes(tmp_path / "c.txt")
    assert np.array_equal(read_boxes(tmp_path / "c.txt", classes=("truck",))[1], [0])
    (tmp_path / "d.txt").write_text("car 1 2 3 4 5 6\n")
    with pytest.raises(ValueError, match="expected '<class> x y z dx dy dz yaw'"):
        read_boxes(tmp_path / "d.txt")
    (tmp_path / "e.txt").write_text("car 1 2 3 4 -5 6 0\n")
    with pytest.raises(ValueError, match="positive sizes"):
        read_boxes(tmp_path / "e.txt")

    with pytest.raises(FileNotFoundError, match="does not exist"):
        DetectionDataset(tmp_path / "none")
    (tmp_path / "ImageSets").mkdir()
    (tmp_path / "ImageSets" / "train.txt").write_text("000007\n")
    with pytest.raises(ValueError, match=r"unknown split 'val'.*\['train'\]"):
        DetectionDataset(tmp_path, "val")
    with pytest.raises(FileNotFoundError, match="frame '000007' .* has no point file"):
        DetectionDataset(tmp_path, "train")


# --- transforms --------------------------------------------------------------------------------
def _inside(points, boxes, margin):
    """[N, M]: point n lies in box m grown by margin (independent of the library)."""
    d = points[:, None, :3].astype(np.float64) - boxes[None, :, :3]
    c, s = np.cos(boxes[:, 6]), np.sin(boxes[:, 6])
    lx, ly = d[..., 0] * c + d[..., 1] * s, -d[..., 0] * s + d[..., 1] * c
    half = boxes[None, :, 3:6] / 2 + margin
    return (np.abs(lx) <= half[..., 0]) & (np.abs(ly) <= half[..., 1]) & (np.abs(d[..., 2]) <= half[..., 2])


def _corners(boxes):
    """[M, 8, 3] box corners (independent of the library)."""
    signs = np.array([[i, j, k] for i in (-0.5, 0.5) for j in (-0.5, 0.5) for k in (-0.5, 0.5)])
    local = signs[None] * boxes[:, None, 3:6]
    c, s = np.cos(boxes[:, 6])[:, None], np.sin(boxes[:, 6])[:, None]
    x = local[..., 0] * c - local[..., 1] * s + boxes[:, None, 0]
    y = local[..., 0] * s + local[..., 1] * c + boxes[:, None, 1]
    return np.stack([x, y, local[..., 2] + boxes[:, None, 2]], -1)


def _front_centres(boxes):
    """[M, 3] centre of each box's front face (+x of the box frame): fixes the heading, which
    the corner set alone leaves open by pi."""
    half = boxes[:, 3] / 2
    return np.stack([boxes[:, 0] + half * np.cos(boxes[:, 6]), boxes[:, 1] + half * np.sin(boxes[:, 6]),
                     boxes[:, 2]], -1)


def _same_corner_sets(a, b, tol=1e-3):
    for ca, cb in zip(a, b):
        dist = np.linalg.norm(ca[:, None] - cb[None], axis=-1)
        assert (dist.min(1) < tol).all() and (dist.min(0) < tol).all()


@pytest.fixture(scope="module")
def scan_with_boxes():
    return generate_scan(32, seed=11, return_boxes=True)


def _frame(scan):
    return {"points": scan["points"].copy(), "labels": scan["labels"].copy(), "boxes": scan["boxes"].copy(),
            "box_labels": scan["box_labels"].copy(), "file": "scan"}


@pytest.mark.parametrize("kind", ["rotate", "flip_x", "flip_y", "scale"])
def test_transform_moves_points_and_boxes_alike(kind, scan_with_boxes, seed):
    gen = torch.Generator().manual_seed(seed)
    frame = _frame(scan_with_boxes)
    p, b = frame["points"][:, :3].astype(np.float64), frame["boxes"].astype(np.float64)
    angle = float(torch.empty(()).uniform_(-math.pi, math.pi, generator=gen))
    factor = float(torch.empty(()).uniform_(0.8, 1.2, generator=gen))
    if kind == "rotate":
        out = rotate_z(frame, angle)
        c, s = math.cos(angle), math.sin(angle)
        mapped = lambda q: np.stack([c * q[..., 0] - s * q[..., 1], s * q[..., 0] + c * q[..., 1], q[..., 2]], -1)
    elif kind == "scale":
        out = RandomScale(factor, factor)(frame)
        mapped = lambda q: q * factor
    else:
        out = RandomFlip(axes=(kind[-1],), p=1.0, generator=gen)(frame)
        col = 1 if kind == "flip_x" else 0
        mapped = lambda q: q * np.where(np.arange(3) == col, -1.0, 1.0)
    assert np.allclose(out["points"][:, :3], mapped(p), atol=1e-4)
    assert np.array_equal(out["points"][:, 3], frame["points"][:, 3])
    assert np.array_equal(out["labels"], frame["labels"]) and out["file"] == "scan"
    _same_corner_sets(_corners(out["boxes"].astype(np.float64)), mapped(_corners(b)))
    assert np.allclose(_front_centres(out["boxes"].astype(np.float64)), mapped(_front_centres(b)), atol=1e-3)
    assert (out["boxes"][:, 6] >= -np.pi).all() and (out["boxes"][:, 6] < np.pi).all()


def test_random_augmentation_keeps_points_in_their_boxes(scan_with_boxes, seed):
    gen = torch.Generator().manual_seed(seed)
    augment = Compose([RandomRotation(generator=gen), RandomFlip(generator=gen), RandomScale(0.9, 1.1, gen)])
    frame = _frame(scan_with_boxes)
    assert len(frame["boxes"]) > 0
    inside_before = _inside(frame["points"], frame["boxes"].astype(np.float64), -0.01)
    assert inside_before.sum() > 20
    for _ in range(3):
        out = augment(frame)
        boxes = out["boxes"].astype(np.float64)
        # points clearly inside stay inside, points clearly outside stay outside
        assert (_inside(out["points"], boxes, 0.01) >= inside_before).all()
        assert (_inside(out["points"], boxes, -0.03) <= _inside(frame["points"], frame["boxes"].astype(np.float64),
                                                                  0.0)).all()
        assert not np.allclose(out["points"][:, :3], frame["points"][:, :3])  # it did move


def test_point_cap(seed):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    points = _random_points(rng, 1000)
    frame = {"points": points, "labels": np.arange(1000), "instances": np.arange(1000) * 2,
             "boxes": np.zeros((1, 7), np.float32), "box_labels": np.zeros(1, np.int64)}
    out = PointCap(300, generator=gen)(frame)
    kept = out["labels"]
    assert len(out["points"]) == 300 and len(np.unique(kept)) == 300 and (np.diff(kept) > 0).all()
    assert np.array_equal(out["points"], points[kept]) and np.array_equal(out["instances"], kept * 2)
    assert out["boxes"] is frame["boxes"]
    assert PointCap(1000)(frame) is frame
    with pytest.raises(ValueError, match="max_points must be a positive int"):
        PointCap(0)
    with pytest.raises(ValueError, match=r"frame\['labels'\] has 5 entries but there are 1000 points"):
        PointCap(10)({"points": points, "labels": np.arange(5)})


def test_transform_argument_checks():
    with pytest.raises(ValueError, match="max_angle"):
        RandomRotation(4.0)
    with pytest.raises(ValueError, match="axes"):
        RandomFlip(axes=("z",))
    with pytest.raises(ValueError, match="low <= high"):
        RandomScale(1.2, 1.1)
    with pytest.raises(ValueError, match="voxel_size"):
        Voxelize(-0.1)
    with pytest.raises(ValueError, match="no points"):
        Voxelize(0.1)({"points": np.zeros((0, 4), np.float32)})


def test_samples_collate(tmp_path, seed):
    rng = np.random.default_rng(seed)
    for i, n in enumerate((400, 250)):
        _write_kitti_scan(tmp_path, "08", f"{i:06d}", _random_points(rng, n), rng.choice([10, 40, 50], n))
    ds = SemanticKITTI(tmp_path, "val", 0.5, transforms=PointCap(300, torch.Generator().manual_seed(seed)))
    batch = sparse_collate_fn([ds[0], ds[1]])
    lidar = batch["lidar"]
    sizes = [len(t) for t in batch["targets"]]
    assert lidar.num_points == sum(sizes) and torch.cat(batch["targets"]).shape == (lidar.num_points,)
    assert torch.equal(torch.bincount(lidar.C[:, 0].long()), torch.tensor(sizes))
    assert [len(t) for t in batch["point_targets"]] == [300, 250]
    assert batch["file"] == [str(s) for s in ds.scans]


# --- synth CLI ---------------------------------------------------------------------------------
def test_synth_cli_semantickitti(tmp_path, seed, capsys):
    seed = seed % 1000
    out = tmp_path / "kitti"
    assert cli_main(["synth", "--out", str(out), "--scans", "1", "--seed", str(seed)]) == 0
    assert "train 1, val 1" in capsys.readouterr().out
    non_canonical = 0
    for split, frame_no in (("train", 0), ("val", 1)):
        ds = SemanticKITTI(out, split, voxel_size=0.1)
        assert len(ds) == 1
        frame = ds.read_frame(0)
        scan = generate_scan(64, seed=seed + frame_no)
        assert np.array_equal(frame["points"], scan["points"])
        assert np.array_equal(frame["labels"], [_kitti_class(r) for r in scan["labels"]])
        non_canonical += int((frame["raw_labels"] != scan["labels"]).sum())
        obj = np.isin(scan["labels"], (10, 30))
        assert (frame["instances"][~obj] == 0).all() and (frame["instances"][obj] > 0).mean() > 0.9
        _check_voxel_sample(ds[0], frame["points"], 0.1)
    assert non_canonical > 0  # moving / lane-marking ids went through the learning map
    assert cli_main(["synth", "--out", str(out)]) == 2  # one line, `error: ...`
    assert "not an empty directory" in capsys.readouterr().err


def test_synth_nuscenes(tmp_path, seed):
    """Key frames are the sequence generator's sweeps (turned into the nuScenes LiDAR frame: same
    ranges), with the stuff labels mapped to their challenge classes and object points to theirs."""
    from torchsparse_pp.data.synth_nuscenes import KEY_INTERVAL_SWEEPS, SWEEP_INTERVAL
    from torchsparse_pp.data.synthetic_sequence import generate_sequence

    seed = seed % 1000
    write_synthetic(tmp_path, "nuscenes", scans=1, seed=seed, progress=False, sweeps=2)
    for number, split in enumerate(("train", "val")):
        ds = NuScenesLidarSeg(tmp_path, split, voxel_size=0.2)
        tables = NuScenesLidarSeg.from_tables(tmp_path, "v1.0-synth", 0.2, scenes=[f"synth-{split}"])
        assert ds.frames == tables.frames and len(ds) == 1
        frame = ds.read_frame(0)
        seq = generate_sequence("nuscenes32", seed + number, [-SWEEP_INTERVAL, 0.0])
        key = seq.points[1]
        assert np.allclose(np.linalg.norm(frame["points"][:, :3], axis=1), np.linalg.norm(key[:, :3], axis=1),
                           atol=1e-4)
        assert np.allclose(frame["points"][:, 3], key[:, 3] * 255, atol=1e-3)
        ring = frame["points"][:, 4]
        assert set(np.unique(ring)) <= set(range(32)) and len(np.unique(ring)) > 20
        stuff = seq.instances[1] < 0
        expected = [nuscenes.CLASS_NAMES.index(GENERATOR_TO_NUSC[int(r)]) for r in seq.labels[1][stuff]]
        assert np.array_equal(frame["labels"][stuff], expected)
        objects = set(frame["labels"][~stuff].tolist())
        assert objects <= {nuscenes.CLASS_NAMES.index("car"), nuscenes.CLASS_NAMES.index("pedestrian"), 255}
    assert KEY_INTERVAL_SWEEPS == 10
    assert len(NuScenesLidarSeg.from_tables(tmp_path, "v1.0-synth")) == 2
    with pytest.raises(TypeError, match="must be a list"):
        NuScenesLidarSeg.from_tables(tmp_path, "v1.0-synth", scenes="synth-val")
    with pytest.raises(ValueError, match=r"unknown scenes \['scene-0001'\]"):
        NuScenesLidarSeg.from_tables(tmp_path, "v1.0-synth", scenes=["scene-0001"])


def test_synth_detection(tmp_path, seed):
    seed = seed % 1000
    assert cli_main(["synth", "--out", str(tmp_path), "--format", "detection", "--seed", str(seed),
                     "--scans", "1"]) == 0
    ds = DetectionDataset(tmp_path, "val", voxel_size=0.2)
    scan = generate_scan(64, seed=seed + 1, return_boxes=True)
    frame = ds.read_frame(0)
    assert np.array_equal(frame["points"], scan["points"])
    assert np.array_equal(frame["boxes"], scan["boxes"]) and np.array_equal(frame["box_labels"], scan["box_labels"])
    sample = ds[0]
    assert torch.equal(sample["boxes"], torch.from_numpy(scan["boxes"]))
    batch = sparse_collate_fn([sample, DetectionDataset(tmp_path, "train", voxel_size=0.2)[0]])
    assert batch["lidar"].batch_size == 2 and len(batch["boxes"]) == 2


def test_synth_arguments(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown format 'kitti'"):
        write_synthetic(tmp_path / "a", "kitti")
    with pytest.raises(ValueError, match="scans must be a positive int"):
        write_synthetic(tmp_path / "b", scans=0)
    assert cli_main(["synth", "--out", str(tmp_path / "c"), "--format", "kitti360"]) == 2
    assert "argument --format: invalid choice" in capsys.readouterr().err


# --- BEV picture -------------------------------------------------------------------------------
def test_bev_png(tmp_path, scan_with_boxes):
    pytest.importorskip("matplotlib")
    import matplotlib.image
    from torchsparse_pp.viz import bev_png

    scan = scan_with_boxes
    labels = semantickitti.map_labels(scan["labels"])
    path = bev_png(tmp_path / "bev.png", scan["points"], labels, scan["boxes"], extent=40.0, dpi=60)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    image = matplotlib.image.imread(path)[..., :3]
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20  # points in several colours, not a blank canvas
    # without labels (coloured by height), and bad inputs
    assert bev_png(tmp_path / "h.png", scan["points"]).stat().st_size > 10_000
    with pytest.raises(ValueError, match="one entry per point"):
        bev_png(tmp_path / "x.png", scan["points"], labels[:-1])
    with pytest.raises(ValueError, match=r"boxes must be \[M, 7\]"):
        bev_png(tmp_path / "x.png", scan["points"], boxes=scan["boxes"][:, :6])
