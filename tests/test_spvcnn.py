"""SPVCNN (torchsparse_pp.models.SPVCNN): point-level logits, gradients, widths; equal to SPVNAS's
SPVCNN and MinkUNet written against torchsparse 2.1's API after `convert --from torchsparse`;
trainable with `torchsparse-pp train` (model.name: spvcnn) with point-level mIoU."""
import textwrap

import numpy as np
import pytest
import torch

from conftest import fresh_seed
from torchsparse_pp import SparseTensor
from torchsparse_pp.compat import torchsparse
from torchsparse_pp.compat.convert import table_for, to_native, to_peer
from torchsparse_pp.data import generate_scan
from torchsparse_pp.data.synth import write_synthetic
from torchsparse_pp.models import SPVCNN, MinkUNet
from torchsparse_pp.point import PointTensor
from torchsparse_models import spvnas_models


def scan_points(seed: int, voxel: float = 0.25, crop: float = 10.0, batch: int = 2):
    """Generated scans as points in voxel units, shifted to >= 0, with (x, y, z, intensity)."""
    rows, feats = [], []
    for b in range(batch):
        pts = generate_scan(32, seed=seed + b)["points"].astype(np.float64)
        pts = pts[(np.abs(pts[:, :2]) < crop).all(1)]
        xyz = (pts[:, :3] - [-crop, -crop, pts[:, 2].min()]) / voxel
        rows.append(np.concatenate([np.full((len(xyz), 1), b), xyz], 1))
        feats.append(pts[:, :4])
    return torch.from_numpy(np.concatenate(rows)), torch.from_numpy(np.concatenate(feats))


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Fresh initial weights and random, non-trivial BatchNorm parameters and statistics."""
    torch.manual_seed(seed)
    for m in model.modules():
        if hasattr(m, "reset_parameters") and not isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_parameters()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g, dtype=m.weight.dtype) + 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g, dtype=m.running_var.dtype) + 0.5)
                for t in (m.bias, m.running_mean):
                    t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype) * 0.1)


@pytest.mark.parametrize("cr", [0.5, 1.0])
def test_spvcnn_point_logits_and_gradients(cr, seed):
    coords, feats = scan_points(seed, crop=3.0, batch=1)
    model = SPVCNN(4, 7, cr).double()
    assert model.channels == [int(round(c * cr)) for c in (32, 32, 64, 128, 256, 256, 128, 96, 96)]
    logits = model(PointTensor(feats, coords))
    assert logits.shape == (len(coords), 7) and torch.isfinite(logits).all()
    logits.square().mean().backward()
    for name in ("stem.0.0.kernel", "encoder.3.0.0.kernel", "up.0.0.kernel", "point_transforms.2.0.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


def converted_pair(client, native, name: str, seed: int):
    """``client`` randomised, its state_dict converted into ``native``; both in eval mode."""
    randomize(client, seed)
    state, report = to_native(client.state_dict(), native, table_for("torchsparse", name))
    native.load_state_dict(state, strict=True)
    client.eval(), native.eval()
    return state, report


def covering_range(coords: torch.Tensor):
    """(batch, side, side, side) with a power-of-two side above every coordinate."""
    side = 1 << int(np.ceil(np.log2(float(coords[:, 1:].max()) + 2)))
    return (2, side, side, side)


def test_spvcnn_matches_spvnas_after_conversion(seed, monkeypatch):
    """SPVNAS's SPVCNN (2.1 API, its names and layouts) and ours on the same points: equal
    per-point logits once its state_dict is converted. A spatial_range that covers the scans
    keeps 2.1 from clipping the top-edge voxels of its k2 s2 convs (docs/migrating.md).
    2.1's calc_ti_weights divides by (sum + 1e-8) where ours divides by the sum (a relative
    1e-8 / sum apart, test_point_ops checks both); the client here renormalises to compare exactly."""
    ti_weights = torchsparse.nn.functional.calc_ti_weights

    def exact(coords, idx, scale=1):
        w = ti_weights(coords, idx, scale)
        total = w.sum(1, keepdim=True)
        return w / torch.where(total > 0, total, torch.ones_like(total))
    monkeypatch.setattr(torchsparse.nn.functional, "calc_ti_weights", exact)
    coords, feats = scan_points(seed, crop=6.0)
    _, ClientSPVCNN = spvnas_models(torchsparse)
    client, native = ClientSPVCNN(cr=0.25, num_classes=5).double(), SPVCNN(4, 5, 0.25).double()
    state, report = converted_pair(client, native, "spvcnn", seed)
    with torch.no_grad():
        want = client(torchsparse.PointTensor(feats, coords), covering_range(coords))
        got = native(PointTensor(feats, coords))
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-9 * want.abs().max().item())
    assert any("x-fastest" in line for line in report.lines)
    back, _ = to_peer(state, native, table_for("torchsparse", "spvcnn"))
    assert back.keys() == client.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in client.state_dict().items())


def test_minkunet_matches_spvnas_after_conversion(seed):
    coords, feats = scan_points(seed)
    cells = torch.unique(torch.cat([coords[:, :1], torch.floor(coords[:, 1:])], 1), dim=0).int()
    voxel_feats = torch.randn(len(cells), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    ClientMinkUNet, _ = spvnas_models(torchsparse)
    client, native = ClientMinkUNet(cr=0.25, num_classes=5).double(), MinkUNet(4, 5, 0.25).double()
    _, report = converted_pair(client, native, "minkunet", seed)
    assert any("point_transforms" in line and "never reads" in line for line in report.lines)
    with torch.no_grad():
        want = client(torchsparse.SparseTensor(voxel_feats, cells, 1, covering_range(cells)))
        got = native(SparseTensor(voxel_feats, cells))
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-10 * want.abs().max().item())


def test_train_spvcnn_with_the_cli(tmp_path, capsys):
    from torchsparse_pp.cli import main

    root = tmp_path / "data"
    write_synthetic(root, format="semantickitti", scans=2, seed=fresh_seed() % 10000, progress=False)
    config = tmp_path / "c.yaml"
    config.write_text(textwrap.dedent(f"""
        data: {{root: {root}, voxel_size: 0.3, crop: 8.0, batch_size: 1, max_points: 6000}}
        model: {{name: spvcnn, cr: 0.25}}
        train: {{epochs: 2, threads: 1, progress: false, run_dir: {tmp_path / 'run'}, conv_dataflow: fetch_on_demand}}
    """))
    assert main(["train", "--config", str(config), "optim.lr=0.02"]) == 0
    out = capsys.readouterr().out
    assert "mIoU" in out
    assert main(["eval", "--config", str(config), "--checkpoint", str(tmp_path / "run" / "last.pt")]) == 0
    assert "mIoU" in capsys.readouterr().out


def test_spvcnn_takes_a_sparse_tensor_of_points(seed):
    """As SPVNAS's SPVCNN: a SparseTensor of point coordinates (voxel units, rows may repeat a
    voxel) gives the logits of the PointTensor of those points, in its row order."""
    coords, feats = scan_points(seed, crop=3.0, batch=2)
    cells = torch.cat([coords[:, :1], torch.floor(coords[:, 1:])], 1).int()
    model = SPVCNN(4, 5, 0.25).double().eval()
    with torch.no_grad():
        got = model(SparseTensor(feats, cells))
        want = model(PointTensor(feats, cells.double()))
    assert torch.equal(got, want) and got.shape == (len(cells), 5)
    assert len(torch.unique(cells, dim=0)) < len(cells)  # several points per voxel
    with pytest.raises(TypeError, match="PointTensor or a SparseTensor"):
        model(feats)
