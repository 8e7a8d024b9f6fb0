"""Looking at scans: a bird's-eye-view PNG (matplotlib, no display needed) and the open3d
viewer (only where a display exists). Both colour points by label with ``io.label_colors``."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import numpy as np

from .io import label_colors, require_open3d

__all__ = ["bev_png", "box_corners_xy", "show_open3d", "has_display"]


def _check_inputs(points, labels, boxes):
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[1] < 3 or len(points) == 0:
        raise ValueError(f"points must be a non-empty [N, 3+] array, got shape {points.shape}")
    if labels is not None:
        labels = np.asarray(labels)
        if labels.shape != (len(points),):
            raise ValueError(f"labels must have one entry per point ({len(points)}), got shape {labels.shape}")
    if boxes is not None:
        boxes = np.asarray(boxes, dtype=np.float64)
        if boxes.ndim != 2 or boxes.shape[1] != 7:
            raise ValueError(f"boxes must be [M, 7] (x, y, z, dx, dy, dz, yaw), got shape {boxes.shape}")
    return points, labels, boxes


def box_corners_xy(boxes: np.ndarray) -> np.ndarray:
    """[M, 4, 2] footprint corners of [M, 7] boxes, counter-clockwise from front-left."""
    boxes = np.asarray(boxes, dtype=np.float64)
    local = np.array([[0.5, 0.5], [-0.5, 0.5], [-0.5, -0.5], [0.5, -0.5]])[None] * boxes[:, None, 3:5]
    c, s = np.cos(boxes[:, 6])[:, None], np.sin(boxes[:, 6])[:, None]
    x = local[..., 0] * c - local[..., 1] * s + boxes[:, None, 0]
    y = local[..., 0] * s + local[..., 1] * c + boxes[:, None, 1]
    return np.stack([x, y], -1)


def bev_png(path: Union[str, Path], points: np.ndarray, labels: Optional[np.ndarray] = None,
            boxes: Optional[np.ndarray] = None, *, extent: Optional[float] = None, ignore_index: Optional[int] = 255,
            size_inches: float = 8.0, dpi: int = 100, title: Optional[str] = None) -> Path:
    """Writes a top view of the points (x right, y up) to a PNG.

    Points are coloured by ``labels`` (ground truth or prediction; see io.label_colors) or, without
    labels, by height. ``boxes`` [M, 7] are drawn as footprints with a heading tick. ``extent``
    crops to |x|, |y| <= extent metres (default: all points).
    """
    points, labels, boxes = _check_inputs(points, labels, boxes)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import LineCollection, PolyCollection
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("bev_png needs matplotlib: pip install matplotlib") from err
    if extent is not None and not extent > 0:
        raise ValueError(f"extent must be positive, got {extent!r}")

    fig = Figure(figsize=(size_inches, size_inches), dpi=dpi)
    FigureCanvasAgg(fig)  # Agg draws without a display and without touching pyplot's state
    ax = fig.add_subplot(1, 1, 1)
    ax.set_facecolor("black")
    if labels is not None:
        colors = label_colors(labels.astype(np.int64), ignore_index) / 255.0
        ax.scatter(points[:, 0], points[:, 1], c=colors, s=0.8, marker=".", linewidths=0)
    else:
        ax.scatter(points[:, 0], points[:, 1], c=points[:, 2], cmap="viridis", s=0.8, marker=".", linewidths=0)
    if boxes is not None and len(boxes):
        corners = box_corners_xy(boxes)
        ax.add_collection(PolyCollection(corners, facecolors="none", edgecolors="white", linewidths=1.0))
        heading = np.stack([boxes[:, :2], corners[:, [0, 3]].mean(1)], 1)  # centre -> front edge
        ax.add_collection(LineCollection(heading, colors="white", linewidths=1.0))
    if extent is not None:
        ax.set_xlim(-extent, extent)
        ax.set_ylim(-extent, extent)
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    return path


def has_display() -> bool:
    """Whether a window can open: always on macOS/Windows, with DISPLAY or WAYLAND_DISPLAY elsewhere."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _box_lineset(o3d, box: Sequence[float], color: Tuple[float, float, float]):
    c, s = np.cos(box[6]), np.sin(box[6])
    rotation = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    obb = o3d.geometry.OrientedBoundingBox(np.asarray(box[:3], dtype=np.float64), rotation,
                                           np.asarray(box[3:6], dtype=np.float64))
    lines = o3d.geometry.LineSet.create_from_oriented_bounding_box(obb)
    lines.paint_uniform_color(color)
    return lines


def show_open3d(points: np.ndarray, labels: Optional[np.ndarray] = None, boxes: Optional[np.ndarray] = None,
                *, ignore_index: Optional[int] = 255, window_name: str = "torchsparse_pp") -> None:
    """Opens open3d's viewer on the points (coloured by label when given) and boxes.

    Raises RuntimeError without a display (use bev_png or io.save_prediction_ply there) and
    ImportError without open3d.
    """
    points, labels, boxes = _check_inputs(points, labels, boxes)
    if not has_display():
        raise RuntimeError("show_open3d needs a display (DISPLAY or WAYLAND_DISPLAY is not set); on a headless "
                           "machine write a picture with torchsparse_pp.viz.bev_png or a coloured cloud with "
                           "torchsparse_pp.io.save_prediction_ply instead")
    o3d = require_open3d()
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(points[:, :3].astype(np.float64)))
    if labels is not None:
        colors = label_colors(labels.astype(np.int64), ignore_index) / 255.0
        cloud.colors = o3d.utility.Vector3dVector(colors)
    geometries = [cloud]
    if boxes is not None:
        geometries += [_box_lineset(o3d, box, (0.9, 0.1, 0.1)) for box in boxes]  # the viewer background is white
    o3d.visualization.draw_geometries(geometries, window_name=window_name)
