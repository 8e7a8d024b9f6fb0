"""Point-cloud files: KITTI-style ``.bin`` and ``.npy`` with numpy alone, ``.pcd`` and ``.ply``
through open3d (the ``io`` extra, imported only when such a file is touched).

Points are float32 ``[N, C]`` arrays whose first three columns are x, y, z. Through open3d a
fourth column is stored as the point attribute ``intensity``; more columns have no standard
attribute in those formats and are refused rather than dropped.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import numpy as np

__all__ = ["read_bin", "write_bin", "read_points", "write_points", "label_colors", "save_prediction_ply",
           "require_open3d"]

PathLike = Union[str, os.PathLike]
_OPEN3D_SUFFIXES = (".pcd", ".ply")


def require_open3d():
    """The open3d module, or an ImportError that says how to install it."""
    try:
        import open3d
    except ImportError as err:  # also raised when open3d's system libraries (libusb-1.0) are missing
        raise ImportError(
            "reading or writing .pcd/.ply files needs open3d, which comes with the 'io' extra: "
            "pip install 'torchsparse-pp[io]' (open3d also needs the system library libusb-1.0-0; "
            f"scripts/setup.sh installs it). Import failed with: {err}") from err
    return open3d


def _existing_file(path: PathLike, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist" if not path.exists()
                                else f"{what} {str(path)!r} is not a file")
    return path


def read_bin(path: PathLike, columns: int = 4, dtype=np.float32) -> np.ndarray:
    """A flat binary file of fixed-size records as ``[N, columns]`` (KITTI velodyne: 4 float32,
    nuScenes ``.pcd.bin``: 5 float32). Raises if the size is not a whole number of records."""
    path = _existing_file(path, "point file")
    if columns < 1:
        raise ValueError(f"columns must be positive, got {columns}")
    record = columns * np.dtype(dtype).itemsize
    size = path.stat().st_size
    if size % record:
        raise ValueError(f"{str(path)!r} has {size} bytes, not a multiple of the {record}-byte record "
                         f"({columns} x {np.dtype(dtype).name}): the file is truncated or not in this format")
    return np.fromfile(path, dtype=dtype).reshape(-1, columns)


def write_bin(path: PathLike, points: np.ndarray, dtype=np.float32) -> None:
    """Writes ``[N, C]`` values as flat little-endian records (the layout read_bin reads)."""
    points = np.asarray(points)
    if points.ndim != 2:
        raise ValueError(f"points must be [N, C], got shape {points.shape}")
    np.ascontiguousarray(points, dtype=np.dtype(dtype).newbyteorder("<")).tofile(path)


def _check_points(points: np.ndarray, max_columns: Optional[int] = None) -> np.ndarray:
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"points must be [N, 3+] (x, y, z, ...), got shape {points.shape}")
    if max_columns is not None and points.shape[1] > max_columns:
        raise ValueError(f"points have {points.shape[1]} columns; .pcd/.ply files here store x, y, z and "
                         f"optionally intensity (at most {max_columns}); save more columns as .npy or .bin")
    if not np.issubdtype(points.dtype, np.number):
        raise TypeError(f"points must be numeric, got {points.dtype}")
    return points


def read_points(path: PathLike, columns: int = 4) -> np.ndarray:
    """Points from ``.bin`` (``columns`` float32 per point), ``.npy``, ``.pcd`` or ``.ply``.

    ``.pcd``/``.ply`` give ``[N, 3]`` float32, or ``[N, 4]`` when the file has an intensity
    attribute. ``columns`` only applies to ``.bin``.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".bin":
        return read_bin(path, columns)
    if suffix == ".npy":
        points = np.load(_existing_file(path, "point file"), allow_pickle=False)
        return _check_points(points).astype(np.float32, copy=False)
    if suffix in _OPEN3D_SUFFIXES:
        o3d = require_open3d()
        _existing_file(path, "point file")
        cloud = o3d.t.io.read_point_cloud(str(path))
        if "positions" not in cloud.point:
            raise ValueError(f"open3d could not read points from {str(path)!r} (corrupt or not a point cloud)")
        xyz = cloud.point.positions.numpy().astype(np.float32, copy=False)
        if "intensity" in cloud.point:
            intensity = cloud.point.intensity.numpy().reshape(len(xyz), -1).astype(np.float32, copy=False)
            return np.concatenate([xyz, intensity], axis=1)
        return xyz
    raise ValueError(f"unsupported point file suffix {suffix!r} for {str(path)!r}; "
                     "use .bin, .npy, .pcd or .ply")


def write_points(path: PathLike, points: np.ndarray, colors: Optional[np.ndarray] = None) -> None:
    """Writes points to ``.bin``/``.npy`` (all columns, float32) or ``.pcd``/``.ply`` (x, y, z and
    an optional intensity column, plus optional uint8 ``[N, 3]`` RGB colours)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".bin", ".npy"):
        if colors is not None:
            raise ValueError(f"{suffix} files hold no colours; write .ply or .pcd to keep them")
        points = _check_points(points).astype(np.float32)
        if suffix == ".bin":
            write_bin(path, points)
        else:
            np.save(path, points)
        return
    if suffix not in _OPEN3D_SUFFIXES:
        raise ValueError(f"unsupported point file suffix {suffix!r} for {str(path)!r}; "
                         "use .bin, .npy, .pcd or .ply")
    points = _check_points(points, max_columns=4).astype(np.float32)
    o3d = require_open3d()
    cloud = o3d.t.geometry.PointCloud()
    cloud.point.positions = o3d.core.Tensor(np.ascontiguousarray(points[:, :3]))
    if points.shape[1] == 4:
        cloud.point.intensity = o3d.core.Tensor(np.ascontiguousarray(points[:, 3:4]))
    if colors is not None:
        colors = np.asarray(colors)
        if colors.shape != (len(points), 3) or colors.dtype != np.uint8:
            raise ValueError(f"colors must be uint8 [{len(points)}, 3], got {colors.dtype} {colors.shape}")
        cloud.point.colors = o3d.core.Tensor(np.ascontiguousarray(colors))
    if not o3d.t.io.write_point_cloud(str(path), cloud):
        raise OSError(f"open3d could not write {str(path)!r}")


def label_colors(labels: np.ndarray, ignore_index: Optional[int] = 255) -> np.ndarray:
    """uint8 RGB per label: a fixed palette of 20 distinct colours (cycled for larger ids);
    ``ignore_index`` is drawn grey."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be non-negative, got {labels.min()}")
    colors = _PALETTE[labels % len(_PALETTE)]
    if ignore_index is not None:
        colors[labels == ignore_index] = _IGNORE_COLOR
    return colors


def save_prediction_ply(path: PathLike, points: np.ndarray, labels: np.ndarray,
                        ignore_index: Optional[int] = 255) -> None:
    """A ``.ply`` of the points coloured by predicted (or ground-truth) label (see label_colors)."""
    if Path(path).suffix.lower() != ".ply":
        raise ValueError(f"save_prediction_ply writes .ply files, got {str(path)!r}")
    points = _check_points(points)
    labels = np.asarray(labels)
    if labels.shape != (len(points),):
        raise ValueError(f"labels must have one entry per point ({len(points)}), got shape {labels.shape}")
    write_points(path, points[:, :3], colors=label_colors(labels, ignore_index))


def _palette(count: int) -> np.ndarray:
    """``count`` distinct colours: hues a golden-ratio step apart, alternating in brightness so
    neighbouring ids also differ in lightness."""
    hue = (np.arange(count) * 0.618033988749895) % 1.0
    value = np.where(np.arange(count) % 2 == 0, 0.95, 0.7)
    saturation = 0.8
    # HSV -> RGB
    sector = np.floor(hue * 6.0)
    frac = hue * 6.0 - sector
    p, q, t = value * (1 - saturation), value * (1 - saturation * frac), value * (1 - saturation * (1 - frac))
    table = [(value, t, p), (q, value, p), (p, value, t), (p, q, value), (t, p, value), (value, p, q)]
    rgb = np.zeros((count, 3))
    for k, (r, g, b) in enumerate(table):
        pick = sector == k
        rgb[pick] = np.stack([r, g, b], 1)[pick]
    return np.round(rgb * 255).astype(np.uint8)


_PALETTE = _palette(20)  # one colour per class of the 19- and 16-class tasks
_IGNORE_COLOR = np.array([128, 128, 128], dtype=np.uint8)
