"""Real spconv client models, unmodified (OpenPCDet's and Pointcept's files in ../shared/upstream),
under ``alias("spconv")`` against the same files on real spconv 2.3.8 (CPU, one thread), each side
in its own process (tests/spconv_upstream_models.py):

- OpenPCDet's DataProcessor voxelization (spconv.utils.Point2VoxelCPU3d) gives spconv's voxels,
  coordinates and point counts, bit for bit, also when the voxel capacity overflows;
- VoxelBackBone8x, VoxelResBackBone8x, UNetV2, VoxelResBackBone8xVoxelNeXt and
  PillarRes18BackBone8x on those voxels, Pointcept's SpUNet-v1m1 and PointTransformerV3's
  sparse-conv embedding and positional encoding: the real model's state dict loads with
  strict=True; every output's indices are equal (same rows, same order); features and every
  parameter's gradient (training mode, backward of sum(output * r)) match float64's rounding.

Tolerance: both sides compute in float64 and differ only in summation order, so each floating
result is held norm-wise (``||ours - spconv|| / ||spconv||``, never element-wise) to
FLOAT64_REORDERED. Gradients are held jointly, over all parameters of the model: a conv bias
before a BatchNorm in training mode has an exactly-zero gradient, whose few rounding units have
no meaningful size of their own.
"""
import numpy as np
import pytest
import torch

from precision import rel_err
from spconv_upstream import run_here, upstream_file
from torchsparse_pp.data import generate_scan
from torchsparse_pp.utils import sparse_quantize

pytestmark = pytest.mark.spconv
pytest.importorskip("spconv")

# float64's unit roundoff is 1.1e-16; a sum of n terms in another order differs by up to
# n * 1.1e-16 of its terms' magnitude, amplified by the BatchNorms and depth of the networks.
# Measured: 1e-16 to 3e-15 on these models; 1e-12 leaves room, and any wrong pair, offset or
# row is of order 1.
FLOAT64_REORDERED = 1e-12

RANGE = [-12.0, -12.0, -3.0, 12.0, 12.0, 1.0]
OPENPCDET = {  # model: (voxel size, max voxels per scan: fewer than a scan has in RANGE)
    "VoxelBackBone8x": ([0.1, 0.1, 0.1], 5000),
    "VoxelResBackBone8x": ([0.1, 0.1, 0.1], 5000),
    "UNetV2": ([0.1, 0.1, 0.1], 5000),
    "VoxelResBackBone8xVoxelNeXt": ([0.1, 0.1, 0.1], 5000),
    "PillarRes18BackBone8x": ([0.2, 0.2, 4.0], 2000),
}
POINTCEPT = ["SpUNet-v1m1", "PTv3-sparse-parts"]
UPSTREAM_FILES = {"OpenPCDet": ("OpenPCDet", "pcdet", "models", "backbones_3d", "spconv_backbone.py"),
                  "Pointcept": ("Pointcept", "pointcept", "models", "sparse_unet", "spconv_unet_v1m1_base.py")}


def scans(seed: int, batch: int = 2):
    """Generated 32-beam scans (x, y, z, intensity; float32, as OpenPCDet loads them)."""
    return [generate_scan(32, seed=seed + b)["points"].astype(np.float32) for b in range(batch)]


def openpcdet_inputs(model: str, seed: int, gen: torch.Generator) -> dict:
    voxel_size, max_voxels = OPENPCDET[model]
    return {"seed": seed, "points": scans(seed), "point_cloud_range": RANGE, "voxel_size": voxel_size,
            "max_voxels": max_voxels, "pillar_projection": torch.randn(4, 32, generator=gen, dtype=torch.float64)}


def pointcept_inputs(seed: int, gen: torch.Generator) -> dict:
    """Two grid-sampled scans (one point per 0.15 m voxel, within 10 m) as Pointcept batches them."""
    coords, grids = [], []
    for points in scans(seed):
        xyz = points[(np.abs(points[:, :2]) < 10).all(1), :3].astype(np.float64)
        grid = sparse_quantize(xyz - xyz.min(0), 0.15)
        grids.append(torch.from_numpy(grid).long())
        coords.append(torch.from_numpy(grid * 0.15 + xyz.min(0)))
    grid_coord, coord = torch.cat(grids), torch.cat(coords)
    return {"seed": seed, "grid_coord": grid_coord, "coord": coord,
            "feat": torch.randn(len(grid_coord), 4, generator=gen, dtype=torch.float64),
            "offset": torch.tensor([len(grids[0]), len(grid_coord)])}


def run_both(model: str, inputs: dict, tmp_path):
    """The model on real spconv (which also makes the state dict), then on the alias."""
    files = {k: tmp_path / f"{k}.pt" for k in ("inputs", "real", "ours")}
    torch.save(inputs, files["inputs"])
    run_here("model", model, "real", str(files["inputs"]), str(files["real"]))
    theirs = torch.load(files["real"], weights_only=False)
    torch.save({**inputs, "state_dict": theirs["state_dict"]}, files["inputs"])
    run_here("model", model, "ours", str(files["inputs"]), str(files["ours"]))
    return torch.load(files["ours"], weights_only=False), theirs


def assert_matches(ours: dict, theirs: dict) -> dict:
    for name in ("voxels", "outputs"):
        assert ours[name].keys() == theirs[name].keys()
    for key, ref in theirs["voxels"].items():
        assert torch.equal(ours["voxels"][key], ref), key
    errors = {}
    for key, ref in theirs["outputs"].items():
        mine = ours["outputs"][key]
        assert mine.shape == ref.shape and mine.dtype == ref.dtype, key
        if ref.is_floating_point():
            errors[key] = rel_err(mine, ref)
        else:
            assert torch.equal(mine, ref), f"{key}: indices differ"
    assert ours["grads"].keys() == theirs["grads"].keys()
    names = sorted(theirs["grads"])
    errors["gradients (jointly)"] = rel_err(torch.cat([ours["grads"][n].flatten() for n in names]),
                                            torch.cat([theirs["grads"][n].flatten() for n in names]))
    print({k: f"{v:.2g}" for k, v in errors.items()})
    bad = {k: v for k, v in errors.items() if not v <= FLOAT64_REORDERED}
    assert not bad, f"norm-wise errors above {FLOAT64_REORDERED}: {bad}"
    return errors


@pytest.mark.parametrize("model", sorted(OPENPCDET))
def test_openpcdet_model_matches_spconv(model, seed, gen, tmp_path):
    upstream_file(*UPSTREAM_FILES["OpenPCDet"])
    ours, theirs = run_both(model, openpcdet_inputs(model, seed, gen), tmp_path)
    assert_matches(ours, theirs)
    # The scans overflow the voxel capacity: the DataProcessor's cap is part of what is compared.
    assert len(theirs["voxels"]["voxel_coords"]) == 2 * OPENPCDET[model][1]


@pytest.mark.parametrize("model", POINTCEPT)
def test_pointcept_model_matches_spconv(model, seed, gen, tmp_path):
    upstream_file(*UPSTREAM_FILES["Pointcept"])
    ours, theirs = run_both(model, pointcept_inputs(seed, gen), tmp_path)
    assert_matches(ours, theirs)
