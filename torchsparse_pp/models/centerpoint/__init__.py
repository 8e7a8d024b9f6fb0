"""CenterPoint for LiDAR 3-D detection on torchsparse_pp layers."""
from .backbone import VoxelResBackBone8x
from .bev import BEVBackbone, height_compression
from .config import CenterPointConfig
from .decode import decode_boxes
from .head import CenterHead
from .iou import rotated_iou_matrix, rotated_iou_pairs
from .model import CenterPoint
from .nms import rotated_nms
from .targets import build_targets, draw_gaussian, gaussian_radius
from .voxelize import voxelize

__all__ = [
    "CenterPoint", "CenterPointConfig", "VoxelResBackBone8x", "BEVBackbone", "height_compression", "CenterHead",
    "build_targets", "gaussian_radius", "draw_gaussian", "decode_boxes", "rotated_nms", "rotated_iou_pairs",
    "rotated_iou_matrix", "voxelize",
]
