"""Data: synthetic LiDAR scans (readers and datasets come with the models issue)."""
from .synthetic import BEAM_PATTERNS, BOX_CLASSES, SEMANTIC_KITTI_LABELS, generate_scan

__all__ = ["generate_scan", "SEMANTIC_KITTI_LABELS", "BEAM_PATTERNS", "BOX_CLASSES"]
