"""The rigid-transform math of torchsparse_pp.data.poses against independent float64 references:
Rodrigues' formula for the rotation of an axis and angle, the Hamilton product q v q* for what a
quaternion does to a vector, hand-worked rotations, and round trips."""
import math

import numpy as np
import pytest

from conftest import fresh_seed
from torchsparse_pp.data.poses import (invert_pose, matrix_quaternion, pose_matrix, quaternion_matrix,
                                       rotate_vectors, transform_points, yaw_of)


def rodrigues(axis, angle):
    """R = cos a I + sin a [n]x + (1 - cos a) n n^T for the unit axis n."""
    n = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    cross = np.array([[0, -n[2], n[1]], [n[2], 0, -n[0]], [-n[1], n[0], 0]])
    return math.cos(angle) * np.eye(3) + math.sin(angle) * cross + (1 - math.cos(angle)) * np.outer(n, n)


def axis_angle_quaternion(axis, angle):
    n = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    return np.concatenate([[math.cos(angle / 2)], n * math.sin(angle / 2)])


def hamilton(a, b):
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2])


def rotate_by_product(q, v):
    """The vector part of q (0, v) q*."""
    conjugate = q * np.array([1, -1, -1, -1])
    return hamilton(hamilton(q, np.concatenate([[0.0], v])), conjugate)[1:]


def random_rotations(rng, n):
    for _ in range(n):
        yield rng.normal(size=3), rng.uniform(-math.pi, math.pi)


def test_quaternion_matrix_is_rodrigues_and_the_hamilton_product():
    rng = np.random.default_rng(fresh_seed())
    for axis, angle in random_rotations(rng, 50):
        q = axis_angle_quaternion(axis, angle)
        r = quaternion_matrix(q)
        np.testing.assert_allclose(r, rodrigues(axis, angle), rtol=0, atol=1e-14)
        v = rng.normal(size=3) * 10
        np.testing.assert_allclose(r @ v, rotate_by_product(q, v), rtol=0, atol=1e-12)
        # -q is the same rotation
        np.testing.assert_allclose(quaternion_matrix(-q), r, rtol=0, atol=1e-14)


def test_hand_worked_rotations():
    half = math.sqrt(0.5)
    # 90 degrees about +z: x -> y, y -> -x
    np.testing.assert_allclose(quaternion_matrix([half, 0, 0, half]) @ [1, 0, 0], [0, 1, 0], atol=1e-15)
    np.testing.assert_allclose(quaternion_matrix([half, 0, 0, half]) @ [0, 1, 0], [-1, 0, 0], atol=1e-15)
    # 180 degrees about +x: y -> -y, z -> -z
    np.testing.assert_allclose(quaternion_matrix([0, 1, 0, 0]) @ [0, 2, 3], [0, -2, -3], atol=1e-15)
    # 120 degrees about (1, 1, 1): the axes cycle x -> y -> z -> x
    np.testing.assert_allclose(quaternion_matrix([0.5, 0.5, 0.5, 0.5]) @ [1, 0, 0], [0, 1, 0], atol=1e-15)
    np.testing.assert_allclose(quaternion_matrix([0.5, 0.5, 0.5, 0.5]) @ [0, 0, 1], [1, 0, 0], atol=1e-15)
    assert yaw_of(quaternion_matrix([half, 0, 0, half])) == pytest.approx(math.pi / 2, abs=1e-15)


def test_matrix_quaternion_round_trip_near_every_branch():
    rng = np.random.default_rng(fresh_seed())
    cases = list(random_rotations(rng, 40))
    # angles near pi about each axis: the trace is near -1 and Shepperd's other branches run
    cases += [(axis, math.pi - 1e-9) for axis in np.eye(3)] + [(rng.normal(size=3), math.pi) for _ in range(5)]
    for axis, angle in cases:
        r = rodrigues(axis, angle)
        q = matrix_quaternion(r)
        assert q[0] >= 0 and abs(np.linalg.norm(q) - 1) < 1e-14
        np.testing.assert_allclose(quaternion_matrix(q), r, rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="not a rotation matrix"):
        matrix_quaternion(np.diag([1.0, 1.0, -1.0]))


def test_pose_composition_and_inverse():
    rng = np.random.default_rng(fresh_seed())
    for axis, angle in random_rotations(rng, 20):
        t = rng.uniform(-500, 500, 3)
        m = pose_matrix(t, axis_angle_quaternion(axis, angle))
        points = rng.uniform(-80, 80, (30, 3))
        expected = points @ rodrigues(axis, angle).T + t  # p_B = R p_A + t
        np.testing.assert_allclose(transform_points(m, points), expected, rtol=0, atol=1e-11)
        np.testing.assert_allclose(transform_points(invert_pose(m), expected), points, rtol=0, atol=1e-11)
        np.testing.assert_allclose(invert_pose(m) @ m, np.eye(4), rtol=0, atol=1e-14)
        v = rng.normal(size=(5, 3))
        np.testing.assert_allclose(rotate_vectors(m, v), v @ rodrigues(axis, angle).T, rtol=0, atol=1e-14)


def test_bad_rotations_and_translations_are_named():
    with pytest.raises(ValueError, match=r"cs\.json: the rotation quaternion \[1\.0, 0\.0, 0\.0, 0\.1\] has norm"):
        quaternion_matrix([1.0, 0.0, 0.0, 0.1], "cs.json")
    with pytest.raises(ValueError, match="a rotation must be 4 finite numbers"):
        quaternion_matrix([1.0, 0.0, np.nan, 0.0])
    with pytest.raises(ValueError, match="a rotation must be 4 finite numbers"):
        quaternion_matrix([1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="pose x: a translation must be 3 finite numbers"):
        pose_matrix([0.0, 1.0], [1, 0, 0, 0], "pose x")
