"""torchsparse_pp.compat.spconv against real spconv 2.3.8 (CPU, one thread: its only race-free
setting), on generated LiDAR scans: layers and whole models written against spconv's API load
spconv's state_dict with strict=True and give spconv's indices (same row order), features and
gradients. spconv's 1x1 layers are compared too: the adapter reproduces what spconv computes with
its own stored weights (it is converted dense weights that spconv's 1x1 path gets wrong)."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

real = pytest.importorskip("spconv.pytorch")

from torchsparse_pp.compat import spconv as ours  # noqa: E402
from torchsparse_pp.data import generate_scan  # noqa: E402
from torchsparse_pp.utils import sparse_quantize  # noqa: E402
from spconv_models import minkunet, voxel_res_backbone  # noqa: E402
from spconv_support import cpu_backward, single_thread  # noqa: E402,F401  (cpu_backward is a fixture)

pytestmark = pytest.mark.spconv
TOL = 1e-9  # float64 throughout: only the summation order differs


def scan_indices(seed: int, axes=(0, 1, 2), voxel=(0.1, 0.1, 0.1), crop=18.0, batch=2):
    """Generated 32-beam scans (one per batch entry), cropped, shifted to >= 0 and voxelised;
    ``axes`` orders the spatial columns (OpenPCDet uses (2, 1, 0): z, y, x)."""
    rows = []
    for b in range(batch):
        xyz = generate_scan(32, seed=seed + b)["points"][:, :3].astype(np.float64)
        xyz = xyz[(np.abs(xyz[:, 0]) < crop) & (np.abs(xyz[:, 1]) < crop)]
        xyz = xyz - [-crop, -crop, xyz[:, 2].min()]
        v = torch.from_numpy(sparse_quantize(xyz, voxel))[:, list(axes)]
        rows.append(torch.cat([torch.full((len(v), 1), b, dtype=torch.int32), v], 1))
    indices = torch.cat(rows)
    order = torch.randperm(len(indices), generator=torch.Generator().manual_seed(seed))
    return indices[order].contiguous(), (indices[:, 1:].amax(0) + 1).tolist()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def twins(make, seed: int):
    """The module built on real spconv (random weights, float64) and ours loaded from its state_dict."""
    torch.manual_seed(seed)
    theirs = make(real).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    mine = make(ours).double()
    mine.load_state_dict(theirs.state_dict(), strict=True)
    return theirs, mine


def run_both(theirs, mine, feats, indices, shape, batch_size, grad_seed=None):
    """Forward (and backward of sum(out * r)) of both; returns their outputs and gradients."""
    results = []
    for ns, module in ((real, theirs), (ours, mine)):
        x = feats.clone().requires_grad_(grad_seed is not None)
        with single_thread():
            y = module(ns.SparseConvTensor(x, indices, shape, batch_size))
            if grad_seed is not None:
                r = torch.randn(y.features.shape, dtype=y.features.dtype,
                                generator=torch.Generator().manual_seed(grad_seed))
                (y.features * r).sum().backward()
        grads = [x.grad] + [p.grad for p in module.parameters()] if grad_seed is not None else []
        results.append((y, grads))
    return results


LAYERS = {
    "subm_k3_bias": lambda ns: ns.SubMConv3d(5, 7, 3, bias=True),
    "subm_k3_dilated": lambda ns: ns.SubMConv3d(5, 7, 3, dilation=2, bias=False),
    "subm_k1": lambda ns: ns.SubMConv3d(5, 7, 1, bias=True),
    "strided_k3_s2_p1": lambda ns: ns.SparseConv3d(5, 7, 3, stride=2, padding=1, bias=True),
    "strided_k2_s2": lambda ns: ns.SparseConv3d(5, 7, 2, stride=2, bias=False),
    "strided_k311_s211": lambda ns: ns.SparseConv3d(5, 7, (3, 1, 1), stride=(2, 1, 1), bias=False),
    "strided_k3_s2_p011": lambda ns: ns.SparseConv3d(5, 7, 3, stride=2, padding=(0, 1, 1), bias=False),
    "transposed_k3_s2_p1": lambda ns: ns.SparseConvTranspose3d(5, 7, 3, stride=2, padding=1, bias=True),
    "maxpool_k3_s2_p1": lambda ns: ns.SparseMaxPool3d(3, 2, padding=1),
    # Regular (non-submanifold) stride-1 layers: every site some input reaches, clipped to the
    # dense output size.
    "strided_k3_s1_p1": lambda ns: ns.SparseConv3d(5, 7, 3, padding=1, bias=True),
    "strided_k3_s1_p0": lambda ns: ns.SparseConv3d(5, 7, 3, bias=False),
    "strided_k2_s1_p2": lambda ns: ns.SparseConv3d(5, 7, 2, padding=2, bias=False),
    "strided_k3_s1_p102_d2": lambda ns: ns.SparseConv3d(5, 7, 3, padding=(1, 0, 2), dilation=2, bias=False),
    "maxpool_k3_s1_p1": lambda ns: ns.SparseMaxPool3d(3, 1, padding=1),
    "stride1_inverse": lambda ns: ns.SparseSequential(
        ns.SparseConv3d(5, 6, 3, 1, 1, bias=False, indice_key="d"), ns.SparseInverseConv3d(6, 4, 3, indice_key="d")),
    # Submanifold layers ignore stride and padding, as spconv does (Pointcept's stems and heads).
    "subm_k5_p1": lambda ns: ns.SubMConv3d(5, 7, 5, padding=1, bias=False),
    "subm_k3_s2_p0": lambda ns: ns.SubMConv3d(5, 7, 3, stride=2, bias=True),
    "subm_k1_p1": lambda ns: ns.SubMConv3d(5, 7, 1, padding=1, bias=True),
    "down_subm_inverse": lambda ns: ns.SparseSequential(
        ns.SparseConv3d(5, 6, 3, 2, 1, bias=False, indice_key="d"), ns.SubMConv3d(6, 6, 3, indice_key="s"),
        ns.SubMConv3d(6, 6, 3, indice_key="s"), ns.SparseInverseConv3d(6, 4, 3, indice_key="d", bias=True)),
    "transposed_inverse": lambda ns: ns.SparseSequential(
        ns.SparseConvTranspose3d(5, 6, 3, 2, 1, bias=False, indice_key="t"), ns.SparseInverseConv3d(6, 4, 3, indice_key="t")),
    "pool_inverse": lambda ns: ns.SparseSequential(
        ns.SparseMaxPool3d(2, 2, indice_key="p"), ns.SparseInverseConv3d(5, 3, 2, indice_key="p", bias=False)),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_matches_spconv(name, seed, cpu_backward):
    indices, shape = scan_indices(seed)
    feats = torch.randn(len(indices), 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    theirs, mine = twins(LAYERS[name], seed)
    (yt, gt), (ym, gm) = run_both(theirs, mine, feats, indices, shape, 2, grad_seed=seed + 1)
    assert torch.equal(ym.indices, yt.indices)  # spconv's sites in spconv's row order
    assert ym.spatial_shape == yt.spatial_shape
    assert rel(ym.features, yt.features) < TOL
    for a, b in zip(gm, gt):
        assert rel(a, b) < TOL


@pytest.mark.parametrize("name", ["subm", "strided", "strided_s1", "inverse"])
def test_2d_layers_match_spconv(name, seed):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(40 * 30, generator=g)[:500]
    indices = torch.stack([torch.zeros_like(flat), flat // 30, flat % 30], 1).int()
    feats = torch.randn(len(indices), 3, dtype=torch.float64, generator=g)
    make = {"subm": lambda ns: ns.SubMConv2d(3, 4, 3, bias=True),
            "strided": lambda ns: ns.SparseConv2d(3, 4, 3, stride=2, padding=1),
            "strided_s1": lambda ns: ns.SparseConv2d(3, 4, 3, stride=1, padding=1),
            "inverse": lambda ns: ns.SparseSequential(ns.SparseConv2d(3, 4, 3, 2, indice_key="k"),
                                                      ns.SparseInverseConv2d(4, 2, 3, indice_key="k"))}[name]
    theirs, mine = twins(make, seed)
    (yt, _), (ym, _) = run_both(theirs, mine, feats, indices, [40, 30], 1)
    assert torch.equal(ym.indices, yt.indices)
    assert rel(ym.features, yt.features) < TOL


@pytest.mark.parametrize("model", ["voxel_res_backbone", "minkunet"])
def test_model_matches_spconv(model, seed, cpu_backward):
    """Whole models written against spconv's API: strict state_dict load, equal outputs in train
    mode (forward and every gradient) and in eval mode (with non-trivial running statistics)."""
    if model == "voxel_res_backbone":
        make = voxel_res_backbone
        indices, shape = scan_indices(seed, axes=(2, 1, 0), voxel=(0.1, 0.1, 0.15), crop=12.0)  # (z, y, x) like OpenPCDet
    else:
        make = minkunet
        indices, shape = scan_indices(seed, voxel=(0.2, 0.2, 0.2))
    feats = torch.randn(len(indices), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    theirs, mine = twins(make, seed)
    (yt, gt), (ym, gm) = run_both(theirs, mine, feats, indices, shape, 2, grad_seed=seed + 2)
    assert torch.equal(ym.indices, yt.indices) and ym.spatial_shape == yt.spatial_shape
    assert rel(ym.features, yt.features) < TOL
    # Biases before BatchNorm have a zero gradient: compare at the scale of all gradients.
    scale = max(b.abs().max().item() for b in gt)
    assert len(gm) == len(gt) and all((a - b).abs().max().item() < 1e-9 * scale for a, b in zip(gm, gt))

    # BatchNorm in eval mode, after the step moved the running statistics (spconv's CPU convs
    # cannot run biased layers in eval mode, so the convs stay in training mode).
    mine.load_state_dict(theirs.state_dict(), strict=True)
    for module in list(theirs.modules()) + list(mine.modules()):
        if isinstance(module, torch.nn.BatchNorm1d):
            module.eval()
    with torch.no_grad():
        (yt, _), (ym, _) = run_both(theirs, mine, feats, indices, shape, 2)
    assert torch.equal(ym.indices, yt.indices) and rel(ym.features, yt.features) < TOL


def test_avg_pool_is_the_mean_of_present_inputs(seed):
    """spconv runs SparseAvgPool3d on GPUs only; here it runs on the CPU: the dense sum over the
    window divided by the number of present inputs, on the sites (and in the row order) of
    spconv's max pool with the same geometry."""
    from oracle import reference_conv

    indices, shape = scan_indices(seed, voxel=(0.3, 0.3, 0.3))
    feats = torch.randn(len(indices), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    y = ours.SparseAvgPool3d(3, 2, padding=1)(ours.SparseConvTensor(feats, indices, shape, 2))
    with single_thread():
        ref = real.SparseMaxPool3d(3, 2, padding=1)(real.SparseConvTensor(feats, indices, shape, 2))
    assert torch.equal(y.indices, ref.indices) and y.spatial_shape == ref.spatial_shape
    total = reference_conv(indices, feats, torch.eye(3, dtype=torch.float64).repeat(27, 1, 1), y.indices, 3, 2, 1, 1)
    count = reference_conv(indices, torch.ones(len(indices), 1, dtype=torch.float64),
                           torch.ones(27, 1, 1, dtype=torch.float64), y.indices, 3, 2, 1, 1)
    assert count.min() >= 1 and rel(y.features, total / count) < TOL


def test_state_dicts_load_both_ways():
    theirs, mine = voxel_res_backbone(real), voxel_res_backbone(ours)
    a, b = theirs.state_dict(), mine.state_dict()
    assert list(a) == list(b) and all(a[k].shape == b[k].shape for k in a)
    theirs.load_state_dict(b, strict=True)
    assert all(torch.equal(theirs.state_dict()[k], b[k]) for k in b)


def test_record_voxel_count_buffer_matches_spconv(seed):
    indices, shape = scan_indices(seed, batch=1)
    feats = torch.randn(len(indices), 2, dtype=torch.float64)
    theirs, mine = twins(lambda ns: ns.SparseConv3d(2, 3, 3, 2, 1, record_voxel_count=True), seed)
    run_both(theirs, mine, feats, indices, shape, 1)
    assert torch.equal(mine.get_max_num_voxels(), theirs.get_max_num_voxels())
    ours.SparseConv3d(2, 3, 3, 2, record_voxel_count=True).load_state_dict(
        ours.SparseConv3d(2, 3, 3, 2).state_dict(), strict=True)  # checkpoints without the buffer load


def test_dense_from_dense_and_sparse_add_match_spconv(seed):
    indices, shape = scan_indices(seed, voxel=(0.4, 0.4, 0.4))
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(len(indices), 3, dtype=torch.float64, generator=g)
    xt, xm = real.SparseConvTensor(feats, indices, shape, 2), ours.SparseConvTensor(feats, indices, shape, 2)
    assert torch.equal(xm.dense(), xt.dense()) and torch.equal(xm.dense(False), xt.dense(False))
    dense = xt.dense(channels_first=False)
    ft, fm = real.SparseConvTensor.from_dense(dense), ours.SparseConvTensor.from_dense(dense)
    assert torch.equal(fm.indices, ft.indices) and torch.equal(fm.features, ft.features)
    half = torch.randperm(len(indices), generator=g)[: len(indices) // 2]
    other = torch.randn(len(half), 3, dtype=torch.float64, generator=g)
    st = real.functional.sparse_add(xt, real.SparseConvTensor(other, indices[half], shape, 2))
    sm = ours.functional.sparse_add(xm, ours.SparseConvTensor(other, indices[half], shape, 2))
    assert torch.equal(sm.indices, st.indices) and rel(sm.features, st.features) < TOL


def test_algo_maps_to_dataflows_with_equal_results(seed):
    indices, shape = scan_indices(seed, batch=1)
    feats = torch.randn(len(indices), 4, dtype=torch.float64)
    outputs = []
    for algo in (None, ours.ConvAlgo.Native, ours.ConvAlgo.MaskImplicitGemm, ours.ConvAlgo.MaskSplitImplicitGemm):
        torch.manual_seed(seed)
        conv = ours.SubMConv3d(4, 6, 3, algo=algo).double()
        x = ours.SparseConvTensor(feats, indices, shape, 1)
        outputs.append(conv(x).features)
        if algo is not None:
            assert conv._configs(x).dataflow == ("gather_scatter" if algo == ours.ConvAlgo.Native else "implicit_gemm")
    forced = ours.SparseConvTensor(feats, indices, shape, 1, force_algo=ours.ConvAlgo.Native)
    assert conv._configs(forced).dataflow == "gather_scatter"
    assert all(rel(o, outputs[0]) < TOL for o in outputs)


UNSUPPORTED = {
    "groups": (lambda: ours.SubMConv3d(4, 4, 3, groups=2), ValueError, "groups"),
    "act_type": (lambda: ours.SparseConvolution(3, 4, 4, act_type="relu"), NotImplementedError, "act_type"),
    "fp32_accum": (lambda: ours.SubMConv3d(4, 4, 3, fp32_accum=False), NotImplementedError, "fp32_accum"),
    "output_padding": (lambda: ours.SparseConvolution(3, 4, 4, 3, 2, output_padding=1, transposed=True),
                       NotImplementedError, "output_padding"),
    "subm_even": (lambda: ours.SubMConv3d(1, 4, 2)(ours.SparseConvTensor(torch.ones(1, 1), torch.zeros(1, 4).int(),
                                                                         [1, 1, 1], 1)), ValueError, "odd"),
    "conv1x1_padding": (lambda: ours.SparseConv3d(4, 4, 1, padding=1), ValueError, "padding"),
    "dilated_transpose": (lambda: ours.SparseConvTranspose3d(4, 4, 3, 2, dilation=2), NotImplementedError, "dilat"),
    "global_avg_pool": (lambda: ours.SparseGlobalAvgPool(), NotImplementedError, "channel 0"),
    "4d": (lambda: ours.SparseConvolution(4, 4, 4), NotImplementedError, "4-D"),
    "benchmark": (lambda: ours.SparseConvTensor(torch.zeros(1, 1), torch.zeros(1, 4, dtype=torch.int32),
                                                [1, 1, 1], 1, benchmark=True), NotImplementedError, "benchmark"),
    "out_of_range": (lambda: ours.SparseConvTensor(torch.zeros(1, 1), torch.tensor([[0, 0, 5, 0]]).int(),
                                                   [4, 4, 4], 1), ValueError, "outside"),
    "setting_features": (lambda: setattr(ours.SparseConvTensor(torch.zeros(1, 1), torch.zeros(1, 4).int(),
                                                               [1, 1, 1], 1), "features", None),
                         ValueError, "replace_feature"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_arguments_raise(case):
    make, error, words = UNSUPPORTED[case]
    with pytest.raises(error, match=words):
        make()


def test_indice_key_rules(seed):
    indices, shape = scan_indices(seed, batch=1)
    x = ours.SparseConvTensor(torch.randn(len(indices), 2), indices, shape, 1)
    y = ours.SparseConv3d(2, 3, 3, 2, 1, indice_key="d")(x)
    with pytest.raises(ValueError, match="already exists"):
        ours.SparseConv3d(3, 3, 3, 2, 1, indice_key="d")(y)
    with pytest.raises(ValueError, match="same kernel size"):
        ours.SparseInverseConv3d(3, 2, 2, indice_key="d")(y)
    with pytest.raises(ValueError, match="was not recorded"):
        ours.SparseInverseConv3d(3, 2, 3, indice_key="nope")(y)
    with pytest.raises(ValueError, match="same algo"):
        ours.SparseInverseConv3d(3, 2, 3, indice_key="d", algo=ours.ConvAlgo.Native)(y)
    z = ours.SubMConv3d(3, 3, 3, indice_key="s")(y)
    with pytest.raises(ValueError, match="same dilation"):
        ours.SubMConv3d(3, 3, 3, dilation=2, indice_key="s")(z)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_alias_runs_unchanged_spconv_code():
    done = _python("""
        from torchsparse_pp.compat import alias
        alias("spconv")
        import torch
        import spconv.pytorch as spconv
        from spconv.core import ConvAlgo
        from spconv.pytorch import SparseConvTensor, functional
        import spconv as top
        assert spconv.SubMConv3d.__module__.startswith("torchsparse_pp.compat"), spconv.SubMConv3d.__module__
        assert top.SubMConv3d is spconv.SubMConv3d and ConvAlgo is spconv.ConvAlgo
        net = spconv.SparseSequential(spconv.SubMConv3d(2, 4, 3, indice_key="a", algo=ConvAlgo.Native),
                                      torch.nn.ReLU(), spconv.ToDense())
        idx = torch.tensor([[0, 1, 2, 3], [0, 2, 2, 3]], dtype=torch.int32)
        out = net(SparseConvTensor(torch.randn(2, 2), idx, [4, 4, 4], 1))
        assert out.shape == (1, 4, 4, 4, 4)
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_alias_gives_spconvs_surface():
    """The names client code reads besides the layers: OpenPCDet's version check and constant,
    spconv's tests' imports, the voxel generators."""
    done = _python("""
        from torchsparse_pp.compat import alias
        alias("spconv")
        import spconv
        assert spconv.__version__ == "2.3.8" and float(spconv.__version__[2:]) >= 2.2
        import torchsparse_pp
        assert spconv.__torchsparse_pp_version__ == torchsparse_pp.__version__
        assert spconv.SPCONV_VERSION_NUMBERS == [2, 3, 8]
        spconv.constants.SPCONV_USE_DIRECT_TABLE = False
        from spconv.constants import ALL_WEIGHT_IS_KRSC, FILTER_HWIO
        assert ALL_WEIGHT_IS_KRSC is True and FILTER_HWIO is False
        from spconv.core import AlgoHint, ConvAlgo
        assert ConvAlgo.Native.value == 0 and AlgoHint.BackwardWeight.value == 4
        from spconv.test_utils import TestCase, generate_sparse_data, params_grid
        assert params_grid([1, 2], "ab") == [[1, "a"], [1, "b"], [2, "a"], [2, "b"]]
        data = generate_sparse_data([5, 6, 7], [20, 10], 3)
        assert data["indices"].shape == (30, 4) and data["features_dense"].shape == (2, 3, 5, 6, 7)
        from spconv.utils import Point2VoxelCPU3d, Point2VoxelCPU4d
        from spconv.pytorch.utils import PointToVoxel, gather_features_by_pc_voxel_id
        assert Point2VoxelCPU3d([0.1] * 3, [0, 0, 0, 1, 1, 1], 4, 10, 2).grid_size == [10, 10, 10]
        import sys
        assert all(m.__name__.startswith("torchsparse_pp.compat.spconv") for n, m in sys.modules.items()
                   if n.split(".")[0] == "spconv"), "a module of the real spconv was imported"
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_alias_after_real_import_raises():
    done = _python("""
        import spconv.pytorch
        from torchsparse_pp.compat import alias
        alias("spconv")
    """)
    assert done.returncode != 0 and "already imported" in done.stderr, done.stderr
