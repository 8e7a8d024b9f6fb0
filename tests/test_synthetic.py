import numpy as np
import pytest

import torchsparse_pp.data.synthetic as synthetic
from torchsparse_pp.data.synthetic import SEMANTIC_KITTI_LABELS, generate_scan

ROAD, SIDEWALK, BUILDING, CAR, PERSON = 40, 48, 50, 10, 30
HDL64 = synthetic.BEAM_PATTERNS["hdl64"]
NUSC32 = synthetic.BEAM_PATTERNS["nuscenes32"]


@pytest.fixture(scope="module")
def scan64():
    return generate_scan(64, seed=0, return_boxes=True)


@pytest.fixture(scope="module")
def scan32():
    return generate_scan(32, seed=0, return_boxes=True)


def _inside(points, boxes, margin):
    """[N, M] mask: point n lies in box m grown by margin on every side."""
    d = points[:, None, :3] - boxes[None, :, :3]
    c, s = np.cos(boxes[:, 6]), np.sin(boxes[:, 6])
    lx = d[..., 0] * c + d[..., 1] * s  # rotate into the box frame
    ly = -d[..., 0] * s + d[..., 1] * c
    half = boxes[None, :, 3:6] / 2 + margin
    return (np.abs(lx) <= half[..., 0]) & (np.abs(ly) <= half[..., 1]) & (np.abs(d[..., 2]) <= half[..., 2])


@pytest.mark.parametrize("beams, lo, hi", [(64, 100_000, 140_000), (32, 28_000, 42_000)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_point_count(beams, lo, hi, seed):
    n = len(generate_scan(beams, seed=seed)["points"])
    assert lo <= n <= hi


@pytest.mark.parametrize("name", ["scan64", "scan32"])
def test_dtypes_and_values(name, request):
    scan = request.getfixturevalue(name)
    pts, labels = scan["points"], scan["labels"]
    assert pts.dtype == np.float32 and pts.ndim == 2 and pts.shape[1] == 4
    assert labels.dtype == np.uint32 and labels.shape == (len(pts),)
    assert np.isfinite(pts).all()
    assert pts[:, 3].min() >= 0.0 and pts[:, 3].max() <= 1.0
    assert pts[:, 3].std() > 0.02  # intensity carries information
    assert scan["boxes"].dtype == np.float32 and scan["boxes"].shape[1] == 7
    assert scan["box_labels"].dtype == np.int64 and scan["box_labels"].shape == (len(scan["boxes"]),)
    assert set(np.unique(scan["box_labels"])) <= {0, 1}


def test_boxes_only_on_request():
    scan = generate_scan(32, seed=0)
    assert set(scan) == {"points", "labels"}


def test_determinism():
    a = generate_scan(64, seed=123, return_boxes=True)
    b = generate_scan(64, seed=123, return_boxes=True)
    for key in a:
        assert a[key].tobytes() == b[key].tobytes()
    c = generate_scan(64, seed=124)
    assert a["points"].shape != c["points"].shape or not np.array_equal(a["points"], c["points"])


def test_seed_none_gives_fresh_scenes():
    a, b = generate_scan(32)["points"], generate_scan(32)["points"]
    assert a.shape != b.shape or not np.array_equal(a, b)


@pytest.mark.parametrize("seed", [0, 5, 11])
def test_labels(seed):
    labels = generate_scan(64, seed=seed)["labels"]
    present = set(np.unique(labels).tolist())
    assert present <= set(SEMANTIC_KITTI_LABELS)
    assert {ROAD, BUILDING, CAR} <= present


def test_range(scan64, scan32):
    for scan, pattern in ((scan64, HDL64), (scan32, NUSC32)):
        r = np.linalg.norm(scan["points"][:, :3], axis=1)
        assert r.max() < pattern["max_range"] + 1e-3
        assert r.min() > 2.0  # nothing right at the sensor


def test_max_range_crops_the_same_scan():
    full = generate_scan(32, seed=4)
    crop = generate_scan(32, seed=4, max_range=25.0)
    r_full = np.linalg.norm(full["points"][:, :3], axis=1)
    assert np.linalg.norm(crop["points"][:, :3], axis=1).max() < 25.0 + 1e-3
    np.testing.assert_array_equal(crop["points"], full["points"][r_full < 25.0])
    np.testing.assert_array_equal(crop["labels"], full["labels"][r_full < 25.0])


def test_ground_height(scan64, scan32):
    for scan, pattern in ((scan64, HDL64), (scan32, NUSC32)):
        pts = scan["points"][scan["labels"] == ROAD]
        dist = np.linalg.norm(pts[:, :2], axis=1)
        near = dist < 30.0
        dz = pts[near, 2] + pattern["sensor_height"]
        # gentle street grade (< 1 %) plus range noise
        assert np.all(np.abs(dz) < 0.01 * dist[near] + 0.1)
        assert abs(np.median(dz)) < 0.05


def test_density_falls_with_range(scan64):
    dist = np.linalg.norm(scan64["points"][:, :2], axis=1)
    near = np.sum((dist > 5) & (dist < 10)) / (np.pi * (10**2 - 5**2))
    far = np.sum((dist > 20) & (dist < 40)) / (np.pi * (40**2 - 20**2))
    assert near > 5 * far


@pytest.mark.parametrize("seed", [0, 3])
def test_object_points_inside_boxes(seed):
    scan = generate_scan(64, seed=seed, return_boxes=True)
    pts, labels = scan["points"], scan["labels"]
    for label, cls in ((CAR, 0), (PERSON, 1)):
        boxes = scan["boxes"][scan["box_labels"] == cls]
        obj = pts[labels == label]
        if cls == 0:
            assert len(boxes) >= 5
        inside = _inside(obj, boxes, margin=0.1)
        # Points outside every box may only come from objects too occluded or far
        # to get a box (< MIN_BOX_POINTS points), so they must be isolated.
        stray = obj[~inside.any(axis=1), :3]
        near = np.linalg.norm(stray[:, None] - obj[None, :, :3], axis=2) < 0.5
        assert (near.sum(axis=1) < synthetic.MIN_BOX_POINTS).all()
        # every returned box holds enough points of its class
        assert (inside.sum(axis=0) >= synthetic.MIN_BOX_POINTS).all()
    # cars stand on the road
    cars = scan["boxes"][scan["box_labels"] == 0]
    bottom = cars[:, 2] - cars[:, 5] / 2
    dist = np.linalg.norm(cars[:, :2], axis=1)
    assert np.all(np.abs(bottom + HDL64["sensor_height"]) < 0.01 * dist + 0.05)
    assert np.all((cars[:, 3] > 3.5) & (cars[:, 3] < 5.5) & (cars[:, 4] > 1.5) & (cars[:, 4] < 2.2))


def test_num_cars():
    scan = generate_scan(32, seed=1, num_cars=0, return_boxes=True)
    assert not np.any(scan["labels"] == CAR)
    assert not np.any(scan["box_labels"] == 0)
    scan = generate_scan(64, seed=1, num_cars=12, return_boxes=True)
    assert 1 <= np.sum(scan["box_labels"] == 0) <= 12


def test_culling_is_exact(monkeypatch):
    """Testing every primitive against every ray must give the same scan."""
    fast = generate_scan(32, seed=7, return_boxes=True)
    monkeypatch.setattr(synthetic, "_ray_block", lambda *args: np.s_[:, :])
    brute = generate_scan(32, seed=7, return_boxes=True)
    for key in fast:
        np.testing.assert_array_equal(fast[key], brute[key])


@pytest.mark.parametrize("beams", [0, 16, 128, -64])
def test_bad_beams(beams):
    with pytest.raises(ValueError, match="32, 64"):
        generate_scan(beams)
