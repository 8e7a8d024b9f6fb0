"""SPVNAS's own model code (../shared/upstream/spvnas, unmodified) imported under
alias('torchsparse') and alias('torch_scatter'), and inputs as its SemanticKITTI loader makes
them: generated scans quantised to voxel coordinates >= 0 (one point per voxel, features
x, y, z, intensity), collated by torchsparse's own sparse_collate. The voxels are finer in z
(``z_voxel``) so that the small crops still span 16 voxels in height: without a spatial_range,
2.1 clips a k2 s2 conv's outputs to (max - 1) // 2, which empties stride 16 for flatter scans."""
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchsparse_pp.compat import alias

UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "upstream"
SPVNAS = UPSTREAM / "spvnas"
MISSING = f"SPVNAS's upstream code is not at {SPVNAS} (the shared/upstream folder of CI checkouts)"


def load():
    """(core.models.semantic_kitti, core.models.utils, torchsparse) of the upstream checkout."""
    if not SPVNAS.is_dir():
        pytest.skip(MISSING)
    alias("torchsparse")
    alias("torch_scatter")
    sys.path.insert(0, str(SPVNAS))
    try:
        models = importlib.import_module("core.models.semantic_kitti")
        utils = importlib.import_module("core.models.utils")
    finally:
        sys.path.remove(str(SPVNAS))
    return models, utils, importlib.import_module("torchsparse")


def scan_input(torchsparse, seed: int, voxel: float = 0.25, z_voxel: float = 0.05, crop: float = 6.0, batch: int = 2,
               dtype=torch.float32):
    from torchsparse_pp.data import generate_scan

    samples = []
    for b in range(batch):
        pts = generate_scan(32, seed=seed + b)["points"].astype(np.float64)
        pts = pts[(np.abs(pts[:, :2]) < crop).all(1)]
        coords = np.round(pts[:, :3] / [voxel, voxel, z_voxel])
        coords -= coords.min(0, keepdims=True)
        coords, index = torchsparse.utils.quantize.sparse_quantize(coords, 1, return_index=True)
        feats = torch.as_tensor(pts[index, :4], dtype=dtype)
        samples.append(torchsparse.SparseTensor(feats, torch.as_tensor(coords, dtype=torch.int32)))
    return torchsparse.utils.collate.sparse_collate(samples)


def build(models, name: str, dtype=torch.float64):
    """One upstream model at a small width: MinkUNet and SPVCNN at cr 0.5, the SPVNAS supernet
    with a sampled sub-network of its narrowest channels (kept as ``model.sample``)."""
    if name == "MinkUNet":
        model = models.MinkUNet(num_classes=19, cr=0.5)
    elif name == "SPVCNN":
        model = models.SPVCNN(num_classes=19, cr=0.5, pres=0.05, vres=0.05)
    else:
        lower = models.SPVNAS.output_channels_lb
        model = models.SPVNAS(19, 1, pres=0.05, vres=0.05, output_channels_ub=lower)
        model.sample = model.random_sample()
    return model.to(dtype)


def randomize_norms(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Non-trivial BatchNorm parameters and statistics (SPVNAS initialises them to 1 and 0)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
