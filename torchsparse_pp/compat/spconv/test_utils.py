"""``spconv.test_utils``: what spconv's own tests import (TestCase, params_grid,
generate_sparse_data), so they run unchanged under the alias.

generate_sparse_data draws from numpy's global generator (spconv's tests seed it) and returns
spconv's layout: ``indices [N, ndim + 1]`` with the batch index in the *last* column,
``features [N, C]`` and ``features_dense [B, C, *shape]``.
"""
import itertools
import unittest
from typing import Dict, List, Sequence

import numpy as np


class TestCase(unittest.TestCase):
    """unittest.TestCase with numpy comparisons (arrays, or dicts of arrays with equal keys)."""

    def assertAllEqual(self, a, b) -> None:
        a, b = np.asarray(a), np.asarray(b)
        self.assertEqual(a.shape, b.shape, f"shape mismatch: expected {a.shape}, got {b.shape}")
        np.testing.assert_array_equal(a, b)  # NaNs in the same places count as equal

    def assertAllClose(self, a, b, rtol: float = 1e-6, atol: float = 1e-6, msg: str = "") -> None:
        if isinstance(a, dict) != isinstance(b, dict):
            raise ValueError(f"cannot compare a dict with a non-dict. {msg}")
        if isinstance(a, dict):
            self.assertCountEqual(a.keys(), b.keys(), msg=f"mismatched keys. {msg}")
            for key in a:
                self._assert_close(a[key], b[key], rtol, atol, f"{key}: {msg}")
        else:
            self._assert_close(a, b, rtol, atol, msg)

    def _assert_close(self, a, b, rtol: float, atol: float, msg: str) -> None:
        a, b = np.asarray(a), np.asarray(b)
        self.assertEqual(a.shape, b.shape, f"shape mismatch: expected {a.shape}, got {b.shape}")
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=msg)


def params_grid(*params: Sequence) -> List[list]:
    """Every combination of the parameter lists, the last one varying fastest."""
    return [list(combo) for combo in itertools.product(*params)]


def generate_sparse_data(shape: Sequence[int], num_points: Sequence[int], num_channels: int, integer: bool = False,
                         data_range=(-1, 1), with_dense: bool = True, dtype=np.float32,
                         shape_scale: int = 1) -> Dict[str, np.ndarray]:
    """``num_points[b]`` distinct sites per sample ``b`` on the grid ``shape`` (coordinates
    multiples of ``shape_scale``), with features drawn uniformly from ``data_range`` (integers
    in ``[low, high)`` with ``integer``)."""
    ndim = len(shape)
    cells = np.stack(np.meshgrid(*[np.arange(0, s // shape_scale) for s in shape], indexing="ij"), -1)
    cells = cells.reshape(-1, ndim) * shape_scale
    rows = []
    for b, n in enumerate(num_points):
        chosen = cells[np.random.permutation(len(cells))[:n]]
        rows.append(np.concatenate([chosen, np.full((len(chosen), 1), b)], 1))
    indices = np.concatenate(rows).astype(np.int32)
    total = len(indices)
    low, high = data_range
    if integer:
        features = np.random.randint(low, high, size=[total, num_channels]).astype(dtype)
    else:
        features = np.random.uniform(low, high, size=[total, num_channels]).astype(dtype)
    result = {"features": features, "indices": indices}
    if with_dense:
        dense = np.zeros([len(num_points), num_channels, *shape], dtype=dtype)
        batch, spatial = indices[:, -1], tuple(indices[:, i] for i in range(ndim))
        dense[(batch, slice(None)) + spatial] = features
        result["features_dense"] = dense
    return result
