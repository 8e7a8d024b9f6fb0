"""Synthetic sequences: the same world seen from a moving sensor. Deterministic per seed; object
points inside their (moving) boxes in every sweep; the sensor moves along the street at the
drawn speed; static structure coincides across sweeps once the true poses are applied."""
import numpy as np
import pytest

from conftest import fresh_seed
from torchsparse_pp.data.synthetic import BUILDING, POLE
from torchsparse_pp.data.synthetic_sequence import generate_sequence


def inside(points, box, margin):
    d = points[:, :3] - box[:3]
    c, s = np.cos(box[6]), np.sin(box[6])
    lx, ly = d[:, 0] * c + d[:, 1] * s, -d[:, 0] * s + d[:, 1] * c
    return (np.abs(lx) <= box[3] / 2 + margin) & (np.abs(ly) <= box[4] / 2 + margin) & \
        (np.abs(d[:, 2]) <= box[5] / 2 + margin)


@pytest.fixture(scope="module")
def sequence():
    return generate_sequence("nuscenes32", fresh_seed() % 10000, [-0.3, -0.15, 0.0, 0.4])


def test_deterministic_and_shaped(sequence):
    again = generate_sequence("nuscenes32", 7, [0.0, 0.1])
    other = generate_sequence("nuscenes32", 7, [0.0, 0.1])
    assert all(np.array_equal(a, b) for a, b in zip(again.points, other.points))
    assert np.array_equal(again.sensor_poses, other.sensor_poses)
    for k in range(4):
        p = sequence.points[k]
        assert p.dtype == np.float32 and p.shape[1] == 4 and 25_000 < len(p) < 45_000
        assert len(sequence.labels[k]) == len(p) == len(sequence.instances[k])
    with pytest.raises(ValueError, match="pattern must be one of"):
        generate_sequence("hdl128", 0, [0.0])
    with pytest.raises(ValueError, match="times must be a non-empty list"):
        generate_sequence("hdl64", 0, [])


def test_objects_stay_in_their_moving_boxes(sequence):
    moving = np.linalg.norm(sequence.velocities, axis=1) > 1.0
    assert moving.any()
    for k in range(4):
        boxes, points, owner = sequence.boxes_at(k), sequence.points[k], sequence.instances[k]
        for m in np.unique(owner[owner >= 0]):
            assert inside(points[owner == m], boxes[m], 0.1).all(), (k, m)
    # a moving object's box has moved by its velocity between the first and the last sweep
    m = int(np.flatnonzero(moving)[0])
    shift = (sequence.boxes[m, :3] + sequence.velocities[m] * 0.4) - (sequence.boxes[m, :3] - sequence.velocities[m] * 0.3)
    assert np.linalg.norm(shift) == pytest.approx(0.7 * np.linalg.norm(sequence.velocities[m]))


def test_the_sensor_drives_along_the_street_and_the_world_stands_still(sequence):
    poses = sequence.sensor_poses
    steps = np.diff(poses[:, 0, 3]) / np.diff(sequence.times)
    assert np.allclose(steps, steps[0]) and 4.0 <= steps[0] <= 9.0
    for k in range(4):
        np.testing.assert_allclose(poses[k, :3, :3] @ poses[k, :3, :3].T, np.eye(3), atol=1e-12)

    def static_in_scene(k, label):
        p = sequence.points[k][sequence.labels[k] == label][:, :3].astype(np.float64)
        return p @ poses[k, :3, :3].T + poses[k, :3, 3]

    for label, tolerance in ((POLE, 0.1), (BUILDING, 0.1)):
        first, last = static_in_scene(0, label)[::7], static_in_scene(3, label)
        distance = np.sqrt(((first[:, None, :2] - last[None, :, :2]) ** 2).sum(-1)).min(1)
        assert np.median(distance) < tolerance
