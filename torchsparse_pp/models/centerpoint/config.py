"""CenterPoint configuration: the point-cloud range, the voxel grid and the network sizes.

Boxes are (x, y, z, dx, dy, dz, yaw) in metres and radians, z the box centre, yaw about +z
from +x. Voxel coordinates are (batch, x, y, z) with x = floor((px - x_min) / voxel_x), etc.
"""
import math
from dataclasses import dataclass
from typing import Tuple

from ...kmap.geometry import ConvGeometry
from .backbone import BACKBONE_DOWNSAMPLING, BACKBONE_OUT_CHANNELS


def _grid_cells(lo: float, hi: float, size: float, axis: str) -> int:
    cells = (hi - lo) / size
    n = round(cells)
    if n < 1 or abs(cells - n) > 1e-4:
        raise ValueError(f"the {axis} range [{lo}, {hi}] is not a whole number of {size} m voxels "
                         f"({cells:.4f})")
    return n


@dataclass(frozen=True)
class CenterPointConfig:
    """Everything that shapes a CenterPoint model; see the presets ``synthetic``, ``nuscenes``
    and ``waymo``.

    ``bev_*`` describe the 2-D BEV backbone: block i has ``bev_layer_nums[i]`` extra 3x3 convs
    after a 3x3 conv of stride ``bev_strides[i]`` with ``bev_filters[i]`` channels, and is brought
    back to the first block's resolution by a deconv of stride ``bev_upsample_strides[i]`` to
    ``bev_upsample_filters[i]`` channels; the outputs are concatenated.
    """
    point_cloud_range: Tuple[float, float, float, float, float, float]  # x, y, z min; x, y, z max
    voxel_size: Tuple[float, float, float]
    num_classes: int
    point_features: int = 4  # features per point; voxel features are their mean
    bev_layer_nums: Tuple[int, ...] = (2, 2)
    bev_strides: Tuple[int, ...] = (1, 2)
    bev_filters: Tuple[int, ...] = (64, 128)
    bev_upsample_strides: Tuple[int, ...] = (1, 2)
    bev_upsample_filters: Tuple[int, ...] = (128, 128)
    head_channels: int = 64
    # Targets: CornerNet gaussian radius at this IoU, never below min_radius cells.
    gaussian_overlap: float = 0.1
    min_radius: int = 2
    # Loss: focal (heatmap) + loc_weight * weighted L1 on the 8 regression channels
    # (offset x, y; z; log dx, dy, dz; sin, cos yaw), 10 with velocity (vx, vy in m/s).
    loc_weight: float = 0.25
    code_weights: Tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    # A velocity branch: boxes are then (x, y, z, dx, dy, dz, yaw, vx, vy).
    velocity: bool = False
    # Decoding.
    pre_nms_top_k: int = 500
    score_threshold: float = 0.1
    nms_iou_threshold: float = 0.5
    max_boxes: int = 100

    def __post_init__(self):
        if len(self.point_cloud_range) != 6 or len(self.voxel_size) != 3:
            raise ValueError("point_cloud_range needs 6 values (x, y, z min then max) and voxel_size 3")
        if any(not (v > 0 and math.isfinite(v)) for v in self.voxel_size):
            raise ValueError(f"voxel sizes must be positive, got {self.voxel_size}")
        if self.num_classes < 1 or self.point_features < 3:
            raise ValueError(f"need num_classes >= 1 and point_features >= 3 (x, y, z first), got "
                             f"{self.num_classes}, {self.point_features}")
        lengths = {len(self.bev_layer_nums), len(self.bev_strides), len(self.bev_filters),
                   len(self.bev_upsample_strides), len(self.bev_upsample_filters)}
        if len(lengths) != 1 or lengths == {0}:
            raise ValueError("bev_layer_nums, bev_strides, bev_filters, bev_upsample_strides and "
                             "bev_upsample_filters must be non-empty and of equal length")
        if len(self.code_weights) != self.regression_channels:
            raise ValueError(f"code_weights needs {self.regression_channels} entries (one per regression channel"
                             f"{', velocity included' if self.velocity else ''}), got {len(self.code_weights)}")
        if not 0 < self.gaussian_overlap < 1 or self.min_radius < 0:
            raise ValueError("gaussian_overlap must lie in (0, 1) and min_radius be >= 0")
        if not 0 <= self.nms_iou_threshold <= 1 or self.pre_nms_top_k < 1 or self.max_boxes < 1:
            raise ValueError("nms_iou_threshold must lie in [0, 1]; pre_nms_top_k and max_boxes >= 1")
        # Checks the range against the voxel size and the maps against the backbones' strides.
        if min(self.bev_size) < 1:
            raise ValueError(f"the BEV map would be empty: {self.bev_size} cells")

    @property
    def regression_channels(self) -> int:
        return 10 if self.velocity else 8

    @property
    def box_size(self) -> int:
        """Values per box: (x, y, z, dx, dy, dz, yaw) and, with velocity, (vx, vy)."""
        return 9 if self.velocity else 7

    @property
    def grid_size(self) -> Tuple[int, int, int]:
        """Voxels per axis (x, y, z) inside the point-cloud range."""
        lo, hi = self.point_cloud_range[:3], self.point_cloud_range[3:]
        return tuple(_grid_cells(a, b, v, axis) for a, b, v, axis in zip(lo, hi, self.voxel_size, "xyz"))

    @property
    def sparse_shape(self) -> Tuple[int, int, int]:
        """The sparse tensor's spatial_range: the grid plus one z layer, as in SECOND/OpenPCDet,
        so that 40 z voxels compress to 2 BEV layers."""
        nx, ny, nz = self.grid_size
        return nx, ny, nz + 1

    @property
    def backbone_output_shape(self) -> Tuple[int, int, int]:
        """The 3-D backbone's output grid (x, y, z): each strided conv's dense output size."""
        size = self.sparse_shape
        for kernel_size, stride, padding in BACKBONE_DOWNSAMPLING:
            size = ConvGeometry.make(kernel_size, stride, 1, padding).dense_output_size(size)
            if min(size) < 1:
                raise ValueError(f"sparse_shape {self.sparse_shape} is too small for VoxelResBackBone8x")
        return size

    @property
    def bev_size(self) -> Tuple[int, int]:
        """The BEV map (X, Y) that the head sees."""
        x, y, _ = self.backbone_output_shape
        first = self.bev_strides[0]
        for stride, up in zip(self.bev_strides, self.bev_upsample_strides):
            if stride < 1 or up < 1:
                raise ValueError("BEV strides and upsample strides must be >= 1")
        total = 1
        for stride in self.bev_strides:
            total *= stride
        if x % total or y % total:
            raise ValueError(f"the BEV map {x}x{y} is not divisible by the 2-D backbone's total stride {total}")
        for i, up in enumerate(self.bev_upsample_strides):
            # Each block must come back to the first block's resolution.
            level = 1
            for stride in self.bev_strides[:i + 1]:
                level *= stride
            if level != first * up:
                raise ValueError(f"BEV block {i} is at stride {level} but upsamples by {up}; it must "
                                 f"reach the first block's stride {first}")
        return x // first, y // first

    @property
    def bev_stride(self) -> Tuple[int, int]:
        """Voxels per BEV cell along x and y: the backbone's strides times the first BEV block's.
        Cell i along x covers voxels [i * stride, (i + 1) * stride)."""
        sx = sy = self.bev_strides[0]
        for _, stride, _ in BACKBONE_DOWNSAMPLING:
            step = (stride,) * 3 if isinstance(stride, int) else stride
            sx, sy = sx * step[0], sy * step[1]
        return sx, sy

    @property
    def bev_in_channels(self) -> int:
        """Channels of the height-compressed map: backbone channels x remaining z layers."""
        return BACKBONE_OUT_CHANNELS * self.backbone_output_shape[2]

    @staticmethod
    def synthetic(**overrides) -> "CenterPointConfig":
        """Small config for generated scans (torchsparse_pp.data.generate_scan; classes car,
        person): 0.2 m voxels in [-25.6, 25.6]^2 x [-2, 4]."""
        values = dict(point_cloud_range=(-25.6, -25.6, -2.0, 25.6, 25.6, 4.0), voxel_size=(0.2, 0.2, 0.2),
                      num_classes=2)
        values.update(overrides)
        return CenterPointConfig(**values)

    @staticmethod
    def nuscenes(**overrides) -> "CenterPointConfig":
        """nuScenes-like: 0.075 x 0.075 x 0.2 m voxels in [-54, 54]^2 x [-5, 3], 10 classes,
        point_features=5 (x, y, z, intensity, time lag) as in multi-sweep nuScenes, and velocity
        (code weights 0.2 on vx, vy, as CenterPoint's nuScenes configs)."""
        values = dict(point_cloud_range=(-54.0, -54.0, -5.0, 54.0, 54.0, 3.0), voxel_size=(0.075, 0.075, 0.2),
                      num_classes=10, point_features=5, bev_layer_nums=(5, 5), bev_filters=(128, 256),
                      bev_upsample_filters=(256, 256), velocity=True,
                      code_weights=(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.2))
        values.update(overrides)
        return CenterPointConfig(**values)

    @staticmethod
    def waymo(**overrides) -> "CenterPointConfig":
        """Waymo-like: 0.1 x 0.1 x 0.15 m voxels in [-75.2, 75.2]^2 x [-2, 4], 3 classes."""
        values = dict(point_cloud_range=(-75.2, -75.2, -2.0, 75.2, 75.2, 4.0), voxel_size=(0.1, 0.1, 0.15),
                      num_classes=3, point_features=5, bev_layer_nums=(5, 5), bev_filters=(128, 256),
                      bev_upsample_filters=(256, 256), loc_weight=2.0)
        values.update(overrides)
        return CenterPointConfig(**values)
