"""What differs between segmentation and detection: the model, the loss of a batch, and the
evaluation of a batch (with the metric that sums them up)."""
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as TF

from ..models import SPVCNN, CenterPoint, MinkUNet
from ..models.centerpoint import voxelize
from ..point import PointTensor
from .config import Config
from .distributed import all_reduce_sum, gather_objects
from .metrics import IGNORE_INDEX, bev_map, confusion_matrix, iou_from_confusion, mean_iou

__all__ = ["SegmentationTask", "PointSegmentationTask", "DetectionTask", "build_task"]


class SegmentationTask:
    """MinkUNet, cross entropy over voxels (ignore 255), point-level confusion matrix -> mIoU."""

    def __init__(self, config: Config, class_names: Sequence[str]):
        self.config, self.class_names = config, tuple(class_names)
        self.num_classes = len(self.class_names)

    def build_model(self) -> torch.nn.Module:
        return MinkUNet(self.config.point_features, self.num_classes, self.config.model.cr)

    def forward(self, model, batch, device) -> torch.Tensor:
        """Per-voxel logits of a batch."""
        return model(batch["lidar"].to(device))

    def targets(self, batch) -> torch.Tensor:
        """The batch's loss targets (voxel labels), 255 where ignored."""
        return torch.cat(batch["targets"]) if isinstance(batch["targets"], list) else batch["targets"].reshape(-1)

    def target_count(self, batch) -> Optional[int]:
        """How many targets the batch's loss averages over (those that are not ignored)."""
        return int((self.targets(batch) != IGNORE_INDEX).sum())

    def loss(self, model, batch, device, normalizer: Optional[float] = None) -> Dict[str, torch.Tensor]:
        """Cross entropy: the mean over the batch's targets, or their sum / ``normalizer`` (the
        trainer's split of a mean over several batches and processes)."""
        logits = self.forward(model, batch, device)
        return {"loss": _cross_entropy(logits, self.targets(batch).to(device), normalizer)}

    def start_eval(self) -> None:
        self.confusion = torch.zeros(self.num_classes, self.num_classes, dtype=torch.int64)

    @torch.no_grad()
    def eval_batch(self, model, batch, device) -> List[torch.Tensor]:
        """Adds the batch to the confusion matrix; returns per-sample point predictions."""
        lidar = batch["lidar"]
        pred = model(lidar.to(device)).argmax(1).cpu()
        batch_index = lidar.C[:, 0].long().cpu()
        inverse, targets = _per_sample(batch["inverse_map"]), _per_sample(batch["point_targets"])
        out = []
        for b, (inv, tgt) in enumerate(zip(inverse, targets)):
            point_pred = pred[batch_index == b][inv]
            self.confusion += confusion_matrix(point_pred, tgt, self.num_classes)
            out.append(point_pred)
        return out

    def finish_eval(self) -> Dict[str, object]:
        confusion = all_reduce_sum(self.confusion)
        iou = iou_from_confusion(confusion)
        return {"miou": mean_iou(confusion), "iou": dict(zip(self.class_names, iou.tolist())),
                "confusion": confusion}

    @staticmethod
    def summary(result: Dict[str, object]) -> Dict[str, float]:
        return {"miou": result["miou"]}


class PointSegmentationTask(SegmentationTask):
    """SPVCNN: per-point logits, cross entropy over points (ignore 255), point confusion -> mIoU."""

    def build_model(self) -> torch.nn.Module:
        return SPVCNN(self.config.point_features, self.num_classes, self.config.model.cr)

    def points(self, batch, device) -> PointTensor:
        """The batch's points in voxel units, batch index first."""
        rows = [torch.cat([torch.full((len(p), 1), b, dtype=torch.float32), p[:, :3] / self.config.data.voxel_size], 1)
                for b, p in enumerate(_per_sample(batch["points"]))]
        return PointTensor(torch.cat(_per_sample(batch["points"])).to(device), torch.cat(rows).to(device))

    def forward(self, model, batch, device) -> torch.Tensor:
        """Per-point logits of a batch."""
        return model(self.points(batch, device))

    def targets(self, batch) -> torch.Tensor:
        """The batch's loss targets (point labels), 255 where ignored."""
        return torch.cat(_per_sample(batch["point_targets"]))

    def loss(self, model, batch, device, normalizer: Optional[float] = None) -> Dict[str, torch.Tensor]:
        logits = self.forward(model, batch, device)
        return {"loss": _cross_entropy(logits, self.targets(batch).to(device), normalizer)}

    @torch.no_grad()
    def eval_batch(self, model, batch, device) -> List[torch.Tensor]:
        """Adds the batch to the confusion matrix; returns per-sample point predictions."""
        pred = self.forward(model, batch, device).argmax(1).cpu()
        targets = _per_sample(batch["point_targets"])
        out = list(pred.split([len(t) for t in targets]))
        for point_pred, tgt in zip(out, targets):
            self.confusion += confusion_matrix(point_pred, tgt, self.num_classes)
        return out


class DetectionTask:
    """CenterPoint on its own voxel grid, its focal + L1 loss, BEV mAP of the decoded boxes."""

    def __init__(self, config: Config, class_names: Sequence[str]):
        self.config, self.class_names = config, tuple(class_names)
        self.num_classes = len(self.class_names)
        self.model_config = config.centerpoint_config(num_classes=self.num_classes,
                                                      point_features=config.point_features)

    def build_model(self) -> torch.nn.Module:
        return CenterPoint(self.model_config)

    def forward(self, model, batch, device):
        """Head outputs of a batch (voxelised on ``device``)."""
        voxels = voxelize([p.to(device) for p in batch["points"]], self.model_config)
        return model(voxels, len(batch["points"]))

    def target_count(self, batch) -> Optional[int]:
        """None: CenterPoint's loss normalises itself (per batch); the trainer averages it."""
        return None

    def loss(self, model, batch, device, normalizer: Optional[float] = None) -> Dict[str, torch.Tensor]:
        if normalizer is not None:
            raise ValueError("the detection loss normalises itself; it takes no normalizer")
        outputs = self.forward(model, batch, device)
        core = model.module if hasattr(model, "module") else model
        losses = core.loss(outputs, [self.model_boxes(b).to(device) for b in _per_sample(batch["boxes"])],
                           [b.to(device) for b in _per_sample(batch["box_labels"])])
        return losses

    def model_boxes(self, boxes: torch.Tensor) -> torch.Tensor:
        """A sample's boxes as the model regresses them: with their velocity (vx, vy) when it has a
        velocity branch (the data must give one), without it otherwise."""
        if self.model_config.velocity and boxes.shape[1] != 9:
            raise ValueError(f"the model regresses velocities (model.centerpoint.velocity), but "
                             f"data.format={self.config.data.format!r} gives boxes without them "
                             f"({boxes.shape[1]} values per box); set model.centerpoint.velocity=false")
        return boxes if self.model_config.velocity else boxes[:, :7]

    def start_eval(self) -> None:
        self.predictions, self.ground_truth = [], []

    @torch.no_grad()
    def eval_batch(self, model, batch, device) -> List[Dict[str, torch.Tensor]]:
        core = model.module if hasattr(model, "module") else model
        preds = [{k: v.cpu() for k, v in p.items()} for p in core.predict(self.forward(model, batch, device))]
        # BEV mAP matches boxes by their BEV footprint: (x, y, z, dx, dy, dz, yaw), velocity aside.
        self.predictions += [dict(p, boxes=p["boxes"][:, :7]) for p in preds]
        x_min, y_min, _, x_max, y_max, _ = self.model_config.point_cloud_range
        for boxes, labels in zip(_per_sample(batch["boxes"]), _per_sample(batch["box_labels"])):
            # Only boxes whose centre lies on the model's BEV map can be found.
            inside = ((boxes[:, 0] >= x_min) & (boxes[:, 0] < x_max) & (boxes[:, 1] >= y_min) & (boxes[:, 1] < y_max))
            self.ground_truth.append({"boxes": boxes[inside, :7], "labels": labels[inside]})
        return preds

    def finish_eval(self) -> Dict[str, object]:
        predictions, ground_truth = gather_objects(self.predictions), gather_objects(self.ground_truth)
        result = bev_map(predictions, ground_truth, self.num_classes, self.config.eval.iou_threshold)
        return {"map": result["map"], "ap": dict(zip(self.class_names, result["ap"]))}

    @staticmethod
    def summary(result: Dict[str, object]) -> Dict[str, float]:
        return {"map": result["map"]}


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor, normalizer: Optional[float]) -> torch.Tensor:
    if normalizer is None:
        return TF.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX)
    return TF.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum") / normalizer


def _per_sample(value) -> List[torch.Tensor]:
    """A collated per-sample entry as a list (stacked when all samples had equal shapes)."""
    return list(value) if isinstance(value, (list, tuple)) else list(value.unbind(0))


def build_task(config: Config, class_names: Sequence[str]):
    if config.task == "detection":
        return DetectionTask(config, class_names)
    if config.model.name == "spvcnn":
        return PointSegmentationTask(config, class_names)
    return SegmentationTask(config, class_names)
