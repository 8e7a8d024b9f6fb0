"""`torchsparse-pp convert`: an OpenPCDet-layout VoxelResBackBone8x checkpoint (spconv, (z, y, x)
indices) becomes our CenterPoint backbone with equal outputs (real spconv 2.3.8 at one thread
against our native backbone on a generated scan); back to spconv's layout it gives spconv the
same outputs again; the CLI reports every tensor and fails in one line on a wrong config."""
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from torchsparse_pp import SparseTensor
from torchsparse_pp.compat.convert import table_for, to_native, to_peer
from torchsparse_pp.data import generate_scan
from torchsparse_pp.models import CenterPoint
from torchsparse_pp.utils import sparse_quantize
from spconv_models import voxel_res_backbone
from spconv_support import single_thread

real = pytest.importorskip("spconv.pytorch")
REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "centerpoint_synthetic.yaml"


def zyx_scan(seed: int, batch: int = 2):
    """Generated scans voxelised at (0.1, 0.1, 0.15) m; spconv indices (b, z, y, x)."""
    rows = []
    for b in range(batch):
        xyz = generate_scan(32, seed=seed + b)["points"][:, :3].astype(np.float64)
        xyz = xyz[(np.abs(xyz[:, :2]) < 12.8).all(1)] - [-12.8, -12.8, -2.0]
        xyz = xyz[(xyz[:, 2] >= 0) & (xyz[:, 2] < 6.0)]
        v = torch.from_numpy(sparse_quantize(xyz, (0.1, 0.1, 0.15)))
        rows.append(torch.cat([torch.full((len(v), 1), b, dtype=torch.int32), v.flip(1)], 1))
    indices = torch.cat(rows)
    return indices, [40, 256, 256]


def bn_eval(model):
    """BatchNorm in eval mode; spconv's CPU convs cannot run biased layers in eval mode, so the
    convs stay in training mode (which changes nothing else for them)."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.eval()
    return model


def random_backbone(seed: int):
    torch.manual_seed(seed)
    model = voxel_res_backbone(real, eps=1e-5).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=g, dtype=t.dtype) + 0.5 if "running_var" in name
                        else torch.randn(t.shape, generator=g, dtype=t.dtype) * (0.2 if "running" in name or "bias" in name else 1))
    return bn_eval(model)


def sorted_rows(coords: torch.Tensor, feats: torch.Tensor):
    c = coords.long()
    key = ((c[:, 0] * 4096 + c[:, 1]) * 4096 + c[:, 2]) * 4096 + c[:, 3]
    order = torch.argsort(key)
    return coords[order], feats[order]


def native_backbone_output(model: CenterPoint, indices, shape, feats):
    coords = torch.cat([indices[:, :1], indices[:, 1:].flip(1)], 1)  # (b, z, y, x) -> (b, x, y, z)
    x = SparseTensor(feats, coords.contiguous(), spatial_range=shape[::-1])
    with torch.no_grad():
        y = model.backbone(x)
    return sorted_rows(y.C, y.F)


def spconv_output(backbone, indices, shape, feats):
    with single_thread(), torch.no_grad():
        y = backbone(real.SparseConvTensor(feats, indices, shape, 2))
    coords = torch.cat([y.indices[:, :1], y.indices[:, 1:].flip(1)], 1)
    return sorted_rows(coords, y.features)


def native_model() -> CenterPoint:
    from torchsparse_pp.compat.convert.command import _model
    name, model = _model(str(CONFIG))
    assert name == "centerpoint"
    return model.double().eval()


def test_spconv_backbone_converts_with_equal_outputs(seed):
    indices, shape = zyx_scan(seed)
    feats = torch.randn(len(indices), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    theirs = random_backbone(seed)
    model = native_model()
    state, report = to_native(theirs.state_dict(), model, table_for("spconv", "centerpoint"), axes="zyx")
    model.load_state_dict(state, strict=True)
    want_c, want_f = spconv_output(theirs, indices, shape, feats)
    got_c, got_f = native_backbone_output(model, indices, shape, feats)
    assert torch.equal(got_c, want_c)
    assert torch.allclose(got_f, want_f, rtol=1e-9, atol=1e-9 * want_f.abs().max().item())
    text = str(report)
    assert "folded into backbone.stages.0.0.body.1.running_mean" in text
    assert re.search(r"conv_out\.0\.weight \[128x3x1x1x128\] -> backbone\.conv_out\.0\.kernel \[3x128x128\]", text)
    assert "head." in text and "kept at initialisation" in text

    # Back to spconv's layout: spconv computes the same outputs from it.
    peer_state, _ = to_peer(state, model, table_for("spconv", "centerpoint"), axes="zyx")
    peer_state = {k[len("backbone_3d."):]: v for k, v in peer_state.items()}
    again = bn_eval(voxel_res_backbone(real, eps=1e-5).double())
    again.load_state_dict(peer_state, strict=True)
    back_c, back_f = spconv_output(again, indices, shape, feats)
    assert torch.equal(back_c, want_c) and torch.allclose(back_f, want_f, rtol=1e-9, atol=1e-9 * want_f.abs().max().item())


def test_convert_cli_reports_every_tensor(tmp_path, capsys, seed):
    from torchsparse_pp.cli import main

    theirs = random_backbone(seed)
    ckpt = tmp_path / "openpcdet.pth"
    torch.save({"model_state": {"backbone_3d." + k: v for k, v in theirs.state_dict().items()}, "epoch": 3}, ckpt)
    out = tmp_path / "ours.pt"
    assert main(["convert", "--from", "spconv", str(ckpt), "--model", str(CONFIG), str(out)]) == 0
    printed = capsys.readouterr().out
    model = native_model()
    state = torch.load(out, weights_only=True)
    model.load_state_dict(state, strict=True)
    for key in theirs.state_dict():
        assert f"backbone_3d.{key} [" in printed, key  # every peer tensor is named in the report
    assert main(["convert", "--from", "spconv", str(ckpt), "--model", str(CONFIG), str(out)]) == 2  # exists
    assert "exists" in capsys.readouterr().err
    back = tmp_path / "back.pth"
    assert main(["convert", "--to", "spconv", str(out), "--model", str(CONFIG), str(back)]) == 0
    assert set(torch.load(back, weights_only=True)) == {"backbone_3d." + k for k in theirs.state_dict()}


def test_convert_cli_wrong_model_is_one_line(tmp_path, capsys, seed):
    from torchsparse_pp.cli import main

    ckpt = tmp_path / "backbone.pth"
    torch.save(random_backbone(seed).state_dict(), ckpt)
    assert main(["convert", "--from", "torchsparse", str(ckpt), "--model", str(CONFIG), str(tmp_path / "o.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no parameter-name table") and "\n" not in err
    minkunet = REPO / "configs" / "demo_minkunet.yaml"
    assert main(["convert", "--from", "spconv", str(ckpt), "--model", str(minkunet), str(tmp_path / "o.pt")]) == 2
    assert "no parameter-name table" in capsys.readouterr().err
