"""Training and evaluation: YAML configs, the Trainer (AMP, exact resume, torchrun), metrics.

``torchsparse-pp train --config FILE`` and ``torchsparse-pp eval --config FILE --checkpoint CKPT``
run it from the command line; docs/training.md describes the configs."""
from .config import Config, ConfigError, config_from_dict, load_config
from .loop import Trainer, TrainingInterrupted, format_results
from .metrics import bev_map, confusion_matrix, iou_from_confusion, mean_iou

__all__ = ["Config", "ConfigError", "load_config", "config_from_dict", "Trainer", "TrainingInterrupted", "format_results",
           "confusion_matrix", "iou_from_confusion", "mean_iou", "bev_map"]
