"""torchsparse_pp.compat.torchsparse: client code written from torchsparse 2.1's documented API
and semantics (no torchsparse install exists for our machines).

The conv checks follow torchsparse's own dense-conv comparison (tests/python/test_single_layer_conv.py
of 2.1): filters ``[k, k, k, C_in, C_out]`` are the kernel reshaped; the dense torch.conv3d weight
is ``filters.permute(4, 3, 2, 1, 0)`` for odd kernels (x-fastest rows) and
``filters.permute(4, 3, 0, 1, 2)`` for even ones, whose input is padded by k - 1 at the far end;
every kernel size and stride it tests (2, 3, 5 x 1, 2, 3). The output sets are checked against
dense occupancy and 2.1's clipping to [0, (max + 2p - (k - 1)) // s].
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from torchsparse_pp import nn as native_nn
from torchsparse_pp import SparseTensor as NativeTensor
from torchsparse_pp.compat import torchsparse
from torchsparse_pp.compat.torchsparse import nn as spnn
from torchsparse_pp.compat.torchsparse.nn import functional as F
from conftest import lidar_coords
from oracle import reference_conv, reference_output_coords, sort_coords

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)


def dense_case(generator, shape=(6, 5, 7), points=45, c_in=3, batch=2):
    """Random sites of a small grid per sample and float64 features, as 2.1's generate_feature_map."""
    rows = []
    for b in range(batch):
        flat = torch.randperm(int(np.prod(shape)), generator=generator)[:points]
        xyz = torch.stack([flat // (shape[1] * shape[2]), (flat // shape[2]) % shape[1], flat % shape[2]], 1)
        rows.append(torch.cat([torch.full((points, 1), b), xyz], 1))
    coords = torch.cat(rows).int()
    feats = torch.rand(len(coords), c_in, generator=generator, dtype=torch.float64) * 2 - 1
    return coords, feats


def dense_grid(coords, feats, shape, batch=2):
    grid = torch.zeros(batch, feats.shape[1], *shape, dtype=feats.dtype)
    c = coords.long()
    grid[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]] = feats
    return grid


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_dense_conv_comparison(k, stride, generator):
    """2.1's dense-conv test: Conv3d(k, stride, padding=(k-1)//2 for odd k, 0 for even)."""
    shape, c_in, c_out = (6, 5, 7), 3, 4
    coords, feats = dense_case(generator, shape, c_in=c_in)
    pad = 0 if k % 2 == 0 else (k - 1) // 2
    filters = torch.rand(k, k, k, c_in, c_out, generator=generator, dtype=torch.float64) * 2 - 1
    conv = spnn.Conv3d(c_in, c_out, k, stride, pad).double()
    with torch.no_grad():
        conv.kernel.copy_(filters.reshape(-1, c_in, c_out))
    out = conv(torchsparse.SparseTensor(feats, coords))

    w = filters.permute(4, 3, 2, 1, 0) if k % 2 == 1 else filters.permute(4, 3, 0, 1, 2)
    grid = dense_grid(coords, feats, shape)
    if k % 2 == 0:
        grid = TF.pad(grid, (0, k - 1) * 3)
    ref = TF.conv3d(grid, w, stride=stride, padding=pad)
    c = out.C.long()
    assert (c[:, 1:] < torch.tensor(ref.shape[2:])).all()
    want = ref[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]]
    assert torch.allclose(out.F, want, rtol=1e-12, atol=1e-12)

    # The output set: every site some input reaches (p = q*s - pad + delta), clipped like 2.1.
    if stride == 1:
        assert out.C is coords
    else:
        reach = reference_output_coords(coords, k, stride, 1, pad, "spconv")
        top = torch.tensor([(int(m) + 2 * pad - (k - 1)) // stride for m in coords[:, 1:].amax(0)])
        keep = ((reach[:, 1:] >= 0) & (reach[:, 1:] <= top)).all(1)
        assert torch.equal(sort_coords(out.C), reach[keep])
        assert out.s == (stride,) * 3


@pytest.mark.parametrize("kernel_size", [3, 2, (3, 1, 1), (1, 3, 3)])
def test_offset_order_matches_get_kernel_offsets(kernel_size, generator):
    """A kernel with one non-zero row r reads the input at q + get_kernel_offsets(k)[r] (stride 1):
    2.1's rows are x-fastest for odd volumes, z-fastest for even ones."""
    coords, feats = dense_case(generator, (7, 7, 7), points=120, c_in=2, batch=1)
    conv = spnn.Conv3d(2, 2, kernel_size, bias=False).double()
    offsets = spnn.utils.get_kernel_offsets(kernel_size)
    x = torchsparse.SparseTensor(feats, coords)
    lookup = {tuple(c): i for i, c in enumerate(coords.tolist())}
    for row in torch.randperm(len(offsets), generator=generator)[:4].tolist():
        with torch.no_grad():
            conv.kernel.zero_()
            conv.kernel[row] = torch.eye(2, dtype=torch.float64)
        out = conv(x).F
        for i, c in enumerate(coords.tolist()):
            src = lookup.get((c[0], c[1] + int(offsets[row, 0]), c[2] + int(offsets[row, 1]), c[3] + int(offsets[row, 2])))
            assert torch.equal(out[i], feats[src] if src is not None else torch.zeros(2, dtype=torch.float64))


def test_1x1_kernel_is_c_in_by_c_out(generator):
    conv = spnn.Conv3d(3, 5, 1)
    assert conv.kernel.shape == (3, 5)
    assert spnn.Conv3d(3, 5, 1, stride=2).kernel.shape == (1, 3, 5)
    coords, feats = dense_case(generator, c_in=3)
    out = conv.double()(torchsparse.SparseTensor(feats, coords))
    assert torch.allclose(out.F, feats @ conv.kernel.detach()) and out.C is coords


def test_strided_defaults_differ_from_native_as_documented(generator):
    """k5 s2 on a LiDAR crop: 2.1 pads 0 and clips to [0, (max - 4) // 2]; the native API centres
    odd kernels (padding 2) and keeps every reached site (docs/semantics.md)."""
    coords = lidar_coords(int(generator.initial_seed()) % 10000, batch=1, voxel=0.25, box=16)
    coords[:, 1:] -= coords[:, 1:].amin(0)
    feats = torch.randn(len(coords), 2, generator=generator, dtype=torch.float64)
    ours = spnn.Conv3d(2, 2, 5, stride=2).double()(torchsparse.SparseTensor(feats, coords))
    top = (coords[:, 1:].amax(0) - 4) // 2
    reach = reference_output_coords(coords, 5, 2, 1, 0, "spconv")
    assert torch.equal(sort_coords(ours.C), reach[((reach[:, 1:] >= 0) & (reach[:, 1:] <= top)).all(1)])
    native = native_nn.Conv3d(2, 2, 5, stride=2).double()(NativeTensor(feats, coords))
    assert torch.equal(native.C, reference_output_coords(coords, 5, 2, 1, 2, "spconv"))
    assert native.C.shape[0] > ours.C.shape[0]


def test_transposed_conv_reuses_the_strided_map_and_its_padding(generator):
    """2.1 finds the map by (tensor stride, kernel, stride, dilation): an up conv with the default
    padding 0 inverts a down conv with padding 1 with that conv's padding."""
    coords, feats = dense_case(generator, (8, 7, 9), points=150, c_in=3)
    down = spnn.Conv3d(3, 4, 3, stride=2, padding=1).double()
    up = spnn.Conv3d(4, 2, 3, stride=2, transposed=True).double()
    x = torchsparse.SparseTensor(feats, coords)
    mid = down(x)
    y = up(mid)
    assert y.C is coords and y.s == (1, 1, 1)
    native_kernel = F.conv.library_kernel(up.kernel.detach(), (3, 3, 3))
    want = reference_conv(mid.C, mid.F.detach(), native_kernel, coords, 3, 2, 1, 1, transposed=True)
    assert torch.allclose(y.F, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="no conv with that kernel"):
        spnn.Conv3d(4, 2, 2, stride=2, transposed=True).double()(mid)


def test_empty_clip_range_gives_no_outputs_like_2_1(generator):
    """2.1 clips a strided conv's outputs to [0, (max - (k - 1)) // s]: with max 1, k3 s2 has none
    (the native map would refuse a range smaller than the kernel); the transposed conv that reuses
    that map writes only its bias onto the fine coordinates."""
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 0], [0, 1, 0, 1]], dtype=torch.int32)
    feats = torch.randn(3, 2, generator=generator, dtype=torch.float64)
    x = torchsparse.SparseTensor(feats, coords)
    down = spnn.Conv3d(2, 4, 3, stride=2).double()
    mid = down(x)
    assert mid.C.shape == (0, 4) and mid.F.shape == (0, 4) and mid.s == (2, 2, 2)
    up = spnn.Conv3d(4, 2, 3, stride=2, transposed=True, bias=True).double()
    y = up(mid)
    assert y.C is coords and torch.equal(y.F, up.bias.detach().expand(3, 2))
    y.F.sum().backward()
    assert torch.equal(up.bias.grad, torch.full((2,), 3.0, dtype=torch.float64))


def test_sparse_tensor_api(generator):
    coords = torch.randint(0, 9, (30, 3), generator=generator).int()
    coords = torch.unique(coords, dim=0)
    feats, labels = torch.randn(len(coords), 4, generator=generator), torch.randint(0, 5, (len(coords),))
    samples = [{"input": torchsparse.SparseTensor(feats, coords), "label": torchsparse.SparseTensor(labels, coords)}
               for _ in range(2)]
    batch = torchsparse.utils.collate.sparse_collate_fn(samples)
    x, y = batch["input"], batch["label"]
    assert x.C.shape == (2 * len(coords), 4) and torch.equal(x.C[:, 0], torch.arange(2).repeat_interleave(len(coords)).int())
    assert y.feats.dtype == torch.int64 and torch.equal(x.coords[:, 1:], coords.repeat(2, 1))
    x.F = x.F * 2  # setters, as spvnas assigns z.F
    assert torch.equal(x.feats, feats.repeat(2, 1) * 2)
    x.s = 2
    assert x.stride == (2, 2, 2)
    x.spatial_range = (2, 9, 9, 9)
    dense = x.dense()
    c = x.C.long()
    assert dense.shape == (2, 9, 9, 9, 4) and torch.equal(dense[c[:, 0], c[:, 1], c[:, 2], c[:, 3]], x.F)
    assert torch.equal(torchsparse.utils.to_dense(x.F, x.C, x.spatial_range), dense)
    both = torchsparse.cat([x, x])
    assert both.F.shape[1] == 8 and both.C is x.C


def test_missing_names_exist():
    config = F.get_default_conv_config()
    F.set_global_conv_config(config)
    try:
        assert F.get_global_conv_config() is config and F.Dataflow.GatherScatter.value == 1
        assert F.conv_config.get_default_conv_config() is config
    finally:
        F.clear_global_conv_config()
    F.set_kmap_mode("hashmap")
    F.set_kmap_mode("hashmap_on_the_fly")
    assert torchsparse.utils.make_ntuple(3, 3) == (3, 3, 3) and torchsparse.utils.make_divisible(5, 4) == 8
    assert torch.equal(torchsparse.utils.make_tensor((1, 2), torch.int, "cpu"), torch.tensor([1, 2]).int())
    assert callable(torchsparse.tune) and torchsparse.backbones.SparseResUNet42 is not None


def run_with(config, coords, feats, seed):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(spnn.Conv3d(3, 4, 3), spnn.Conv3d(4, 4, 2, stride=2),
                              spnn.Conv3d(4, 3, 2, stride=2, transposed=True)).double()
    if config is not None:
        F.set_global_conv_config(config)
    try:
        x = torchsparse.SparseTensor(feats.clone().requires_grad_(), coords)
        out = net(x)
        out.F.square().sum().backward()
        return out.F.detach(), x.F.grad
    finally:
        F.clear_global_conv_config()


@pytest.mark.parametrize("dataflow,extra", [("ImplicitGEMM", {"ifsort": True, "split_mask_num": 2}),
                                            ("ImplicitGEMM", {}), ("GatherScatter", {"mm_thresh": 1000, "epsilon": 0.5}),
                                            ("FetchOnDemand", {})])
def test_conv_configs_map_to_dataflows(dataflow, extra, generator):
    coords, feats = dense_case(generator, c_in=3)
    config = F.get_default_conv_config().copy()
    config.update(dataflow=F.Dataflow[dataflow], **extra)
    configs = F.conv_config.library_configs(config)
    assert configs.forward.dataflow == {"ImplicitGEMM": "implicit_gemm", "GatherScatter": "gather_scatter",
                                        "FetchOnDemand": "fetch_on_demand"}[dataflow]
    seed = int(generator.initial_seed())
    got, base = run_with(config, coords, feats, seed), run_with(None, coords, feats, seed)
    assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(got, base))


def test_unsupported_settings_raise(generator):
    coords, feats = dense_case(generator, c_in=3)
    x = torchsparse.SparseTensor(feats.float(), coords)
    bad = F.get_default_conv_config().copy()
    bad.kmap_mode = "hashmap"
    with pytest.raises(NotImplementedError, match="hashmap_on_the_fly"):
        spnn.Conv3d(3, 3, 3, config=bad)(x)
    bad.update(kmap_mode="hashmap_on_the_fly", dataflow=F.Dataflow.CodedCSR)
    with pytest.raises(NotImplementedError, match="CodedCSR"):
        spnn.Conv3d(3, 3, 3, config=bad)(x)
    with pytest.raises(NotImplementedError, match="dilation"):
        spnn.Conv3d(3, 3, 3, dilation=2)
    with pytest.raises(NotImplementedError, match="generative"):
        spnn.Conv3d(3, 3, 2, 2, transposed=True, generative=True)
    with pytest.raises(ValueError, match=r"\[N, 3\] coords"):
        spnn.Conv3d(3, 3, 3)(torchsparse.SparseTensor(feats.float(), coords[:, 1:].contiguous()))
    with pytest.raises(ValueError, match=">= 0"):
        spnn.Conv3d(3, 3, 3)(torchsparse.SparseTensor(feats.float(), coords - 1))
    with pytest.raises(NotImplementedError):
        spnn.ToBEVReduction(1)


def test_backbones_run_like_examples_backbones_py(seed):
    """examples/backbones.py: both backbones on a quantised scan (here a generated LiDAR crop)."""
    coords = lidar_coords(seed % 10000, batch=1, voxel=0.3, box=56)
    coords[:, 1:] -= coords[:, 1:].amin(0)
    feats = torch.randn(len(coords), 4, generator=torch.Generator().manual_seed(seed))
    x = torchsparse.SparseTensor(feats, coords)
    with torch.no_grad():
        outs = torchsparse.backbones.SparseResNet21D(in_channels=4).eval()(x)
        assert [o.s for o in outs] == [(1, 1, 1), (2, 2, 2), (4, 4, 4), (8, 8, 8), (8, 16, 8)]
        assert [o.F.shape[1] for o in outs] == [16, 32, 64, 128, 128]
        outs = torchsparse.backbones.SparseResUNet42(in_channels=4, width_multiplier=0.25).eval()(
            torchsparse.SparseTensor(feats, coords))
    assert len(outs) == 9 and outs[-1].C is outs[0].C and outs[-1].F.shape[1] == 24
    assert all(torch.isfinite(o.F).all() for o in outs)


def test_tune_sets_group_configs(tmp_path, generator):
    coords, feats = dense_case(generator, c_in=3)
    model = torch.nn.Sequential(spnn.Conv3d(3, 4, 3), spnn.Conv3d(4, 4, 2, stride=2),
                                spnn.Conv3d(4, 4, 2, stride=2, transposed=True), spnn.Conv3d(4, 2, 1))
    loader = [{"input": torchsparse.SparseTensor(feats.float(), coords)}] * 2
    kwargs = dict(n_samples=1, collect_fn=lambda d: d["input"], save_dir=str(tmp_path), tune_tag="t",
                  dataflow_range=list(F.Dataflow)[:3], verbose=False)
    torchsparse.tune(model, loader, **kwargs)
    configs = [m._config for m in model if m.kernel.dim() == 3]
    assert all(c is not None and "dataflow" in c for c in configs)
    assert configs[1]["dataflow"] == configs[2]["dataflow"]  # one group: the strided map and its transpose
    assert (tmp_path / "t").exists()
    fresh = torch.nn.Sequential(*[type(m)(m.in_channels, m.out_channels, m.kernel_size, m.stride,
                                          transposed=m.transposed) for m in model])
    torchsparse.tune(fresh, loader, **kwargs)  # reloads the saved result
    assert [m._config for m in fresh if m.kernel.dim() == 3] == configs


def test_example_py_runs_through_alias(tmp_path):
    """torchsparse's examples/example.py, as a user runs it on a CPU with the alias: training
    steps work, and so does float16 inference of the model in float16 (computed in float32)."""
    script = textwrap.dedent("""
        from torchsparse_pp.compat import alias
        alias("torchsparse")
        import numpy as np, torch
        import torchsparse
        from torchsparse import SparseTensor
        from torchsparse import nn as spnn
        from torchsparse.nn import functional as F
        from torchsparse.utils.collate import sparse_collate_fn
        from torchsparse.utils.quantize import sparse_quantize
        from torchsparse.nn.functional.devoxelize import calc_ti_weights  # spvnas imports it this way
        from torchsparse.nn.utils import fapply, get_kernel_offsets
        from torchsparse.utils.tensor_cache import TensorCache

        class RandomDataset:
            def __getitem__(self, _):
                inputs = np.random.uniform(-100, 100, size=(3000, 4))
                labels = np.random.choice(10, size=3000)
                coords, feats = inputs[:, :3], inputs
                coords -= np.min(coords, axis=0, keepdims=True)
                coords, indices = sparse_quantize(coords, 2.0, return_index=True)
                coords = torch.tensor(coords, dtype=torch.int)
                feats = torch.tensor(feats[indices], dtype=torch.float)
                labels = torch.tensor(labels[indices], dtype=torch.long)
                return {"input": SparseTensor(coords=coords, feats=feats), "label": SparseTensor(coords=coords, feats=labels)}
            def __len__(self):
                return 4

        F.set_global_conv_config(F.get_default_conv_config())
        np.random.seed(0); torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(RandomDataset(), batch_size=2, collate_fn=sparse_collate_fn)
        model = torch.nn.Sequential(
            spnn.Conv3d(4, 32, 3), spnn.BatchNorm(32), spnn.ReLU(True),
            spnn.Conv3d(32, 64, 2, stride=2), spnn.BatchNorm(64), spnn.ReLU(True),
            spnn.Conv3d(64, 64, 2, stride=2, transposed=True), spnn.BatchNorm(64), spnn.ReLU(True),
            spnn.Conv3d(64, 32, 3), spnn.BatchNorm(32), spnn.ReLU(True), spnn.Conv3d(32, 10, 1))
        criterion = torch.nn.CrossEntropyLoss()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for feed in loader:
            outputs = model(feed["input"])
            loss = criterion(outputs.feats, feed["label"].feats)
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            assert torch.isfinite(loss)
        model.eval().half()
        torchsparse.backends.benchmark = True
        with torch.no_grad():
            out = model(next(iter(loader))["input"].half())
        assert out.feats.dtype == torch.float16 and torch.isfinite(out.feats).all()
        print("ok", type(torchsparse).__name__, torchsparse.__name__)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ok module" in done.stdout
