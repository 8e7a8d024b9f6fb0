"""Data: synthetic LiDAR scans and sequences, dataset readers (SemanticKITTI, nuScenes-lidarseg
with sweeps, nuScenes detection, Waymo in OpenPCDet's layout, KITTI-like detection), frame
transforms and synthetic datasets on disk."""
from .detection import DetectionDataset
from .nuscenes import NuScenesLidarSeg
from .nuscenes_detection import NuScenesDetection
from .semantickitti import SemanticKITTI
from .synth import write_synthetic
from .synthetic import BEAM_PATTERNS, BOX_CLASSES, SEMANTIC_KITTI_LABELS, generate_scan
from .transforms import Compose, PointCap, RandomFlip, RandomRotation, RandomScale, Voxelize
from .waymo import WaymoDataset

__all__ = ["generate_scan", "SEMANTIC_KITTI_LABELS", "BEAM_PATTERNS", "BOX_CLASSES",
           "SemanticKITTI", "NuScenesLidarSeg", "NuScenesDetection", "WaymoDataset", "DetectionDataset",
           "write_synthetic",
           "Compose", "RandomRotation", "RandomFlip", "RandomScale", "PointCap", "Voxelize"]
