"""CenterPoint: sparse 3-D backbone, BEV compression, 2-D backbone/neck and center head."""
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from ...tensor import SparseTensor
from ...utils.cpu_bf16 import dense_autocast
from .backbone import VoxelResBackBone8x
from .bev import BEVBackbone, height_compression
from .config import CenterPointConfig
from .decode import decode_boxes
from .head import CenterHead
from .loss import focal_heatmap_loss, regression_loss
from .targets import build_targets


class CenterPoint(nn.Module):
    """Voxels -> head maps (``forward``), head maps + boxes -> losses (``loss``), head maps ->
    boxes (``predict``). Make the input with ``centerpoint.voxelize(points, config)``.

    BEV maps are ``[B, C, Y, X]``; boxes are (x, y, z, dx, dy, dz, yaw) in metres / radians, and
    (vx, vy) in m/s after them with ``config.velocity``.
    """

    def __init__(self, config: Optional[CenterPointConfig] = None):
        super().__init__()
        self.config = CenterPointConfig.synthetic() if config is None else config
        cfg = self.config
        self.backbone = VoxelResBackBone8x(cfg.point_features)
        self.bev_backbone = BEVBackbone(cfg.bev_in_channels, cfg.bev_layer_nums, cfg.bev_strides, cfg.bev_filters,
                                        cfg.bev_upsample_strides, cfg.bev_upsample_filters)
        self.head = CenterHead(self.bev_backbone.out_channels, cfg.num_classes, cfg.head_channels, cfg.velocity)
        self.register_buffer("code_weights", torch.tensor(cfg.code_weights, dtype=torch.float32), persistent=False)

    def forward(self, voxels: SparseTensor, batch_size: int) -> Dict[str, torch.Tensor]:
        if not isinstance(voxels, SparseTensor):
            raise TypeError(f"CenterPoint expects a SparseTensor, got {type(voxels).__name__}")
        if voxels.spatial_range != self.config.sparse_shape or voxels.s != (1, 1, 1):
            raise ValueError(f"CenterPoint needs voxels at stride 1 with spatial_range {self.config.sparse_shape} "
                             f"(got stride {voxels.s}, spatial_range {voxels.spatial_range}); make them with "
                             "torchsparse_pp.models.centerpoint.voxelize")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        features = self.backbone(voxels)
        bev = height_compression(features, batch_size)
        # The BEV backbone and head are dense torch layers (see utils.cpu_bf16.dense_autocast).
        return dense_autocast(lambda b: self.head(self.bev_backbone(b)), bev)

    def loss(self, outputs: Dict[str, torch.Tensor], boxes_list: Sequence[torch.Tensor],
             labels_list: Sequence[torch.Tensor]) -> Dict[str, torch.Tensor]:
        """``loss`` = focal heatmap loss + loc_weight * regression loss (each also returned)."""
        heatmap = outputs["heatmap"]
        x_cells, y_cells = self.config.bev_size
        if tuple(heatmap.shape[2:]) != (y_cells, x_cells):
            raise ValueError(f"the heatmap is {tuple(heatmap.shape[2:])} but this model's BEV map is "
                             f"{(y_cells, x_cells)} (Y, X)")
        if len(boxes_list) != heatmap.shape[0]:
            raise ValueError(f"the outputs hold {heatmap.shape[0]} samples but {len(boxes_list)} box sets were given")
        targets = build_targets(boxes_list, labels_list, self.config, tuple(heatmap.shape[-2:]), heatmap.device)
        heat = focal_heatmap_loss(heatmap, targets.heatmap)
        reg = regression_loss(outputs, targets, self.code_weights)
        return {"loss": heat + self.config.loc_weight * reg, "heatmap_loss": heat.detach(),
                "regression_loss": reg.detach()}

    @torch.no_grad()
    def predict(self, outputs: Dict[str, torch.Tensor]) -> List[Dict[str, torch.Tensor]]:
        """Per sample: ``boxes`` [M, 7], ``scores`` [M], ``labels`` [M], best first."""
        return decode_boxes(outputs, self.config)
