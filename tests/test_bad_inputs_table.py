"""docs/bad_inputs.md, row by row: every row of its tables names a case here (by id), the
exception type the library raises for it and a fragment of the message; this file runs each case
and checks both. A row without a case, a case without a row, a call that raises something else,
or one that does not raise at all, fails.

Each case builds random (seeded) but valid data and breaks one thing; the seed comes from the
case id, so a failure reproduces."""
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from torchsparse_pp import SparseTensor, ops
from torchsparse_pp import nn as spnn
from torchsparse_pp.io import read_bin, read_pcd, read_ply, read_points, write_points
from torchsparse_pp.kmap import ConvGeometry, torch_ops
from torchsparse_pp.nn import functional as F
from torchsparse_pp.nn.functional import ConvConfig
from torchsparse_pp.train.checkpoint import CheckpointError, load_checkpoint
from torchsparse_pp.train.config import ConfigError, load_config
from torchsparse_pp.utils import sparse_collate, sparse_quantize

DOC = Path(__file__).resolve().parents[1] / "docs" / "bad_inputs.md"
EXCEPTIONS = {cls.__name__: cls for cls in (TypeError, ValueError, RuntimeError, NotImplementedError, IndexError,
                                             FileNotFoundError, CheckpointError, ConfigError)}
CASES = {}


def case(name):
    def register(fn):
        assert name not in CASES, name
        CASES[name] = fn
        return fn
    return register


# --- random, valid data ----------------------------------------------------------------------------
class Data:
    """Seeded random inputs for one case; ``tmp`` is a fresh directory."""

    def __init__(self, name: str, tmp: Path, monkeypatch):
        self.gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.tmp, self.monkeypatch = tmp, monkeypatch

    def coords(self, n=60, extent=10, batch=2):
        raw = torch.cat([torch.randint(0, batch, (4 * n, 1), generator=self.gen),
                         torch.randint(-extent, extent, (4 * n, 3), generator=self.gen)], 1)
        unique = torch.unique(raw, dim=0)
        return unique[torch.randperm(len(unique), generator=self.gen)[:n]].int()

    def feats(self, n, c=4, dtype=torch.float32):
        return torch.randn(n, c, generator=self.gen, dtype=dtype)

    def tensor(self, c=4, n=60, **kwargs):
        coords = self.coords(n)
        return SparseTensor(self.feats(len(coords), c), coords, **kwargs)

    def points(self, n=50, columns=4):
        return self.rng.normal(scale=10, size=(n, columns)).astype(np.float32)

    def file(self, name, data: bytes) -> Path:
        path = self.tmp / name
        path.write_bytes(data)
        return path


# --- SparseTensor construction ---------------------------------------------------------------------
@case("tensor-float-coords")
def _(d):
    coords = d.coords()
    SparseTensor(d.feats(len(coords)), coords.float())


@case("tensor-int64-coords")
def _(d):
    coords = d.coords()
    SparseTensor(d.feats(len(coords)), coords.long())


@case("tensor-coords-not-tensor")
def _(d):
    coords = d.coords()
    SparseTensor(d.feats(len(coords)), coords.numpy())


@case("tensor-coords-three-columns")
def _(d):
    coords = d.coords()
    SparseTensor(d.feats(len(coords)), coords[:, 1:].contiguous())


@case("tensor-rows-mismatch")
def _(d):
    coords = d.coords()
    SparseTensor(d.feats(len(coords) - 1), coords)


@case("tensor-feats-1d")
def _(d):
    coords = d.coords()
    SparseTensor(d.feats(len(coords), 1)[:, 0], coords)


@case("tensor-int-feats")
def _(d):
    coords = d.coords()
    SparseTensor(torch.randint(0, 9, (len(coords), 3), generator=d.gen), coords)


@case("tensor-nan-feats")
def _(d):
    coords = d.coords()
    feats = d.feats(len(coords))
    feats[len(coords) // 2, 1] = float("nan")
    SparseTensor(feats, coords)


@case("tensor-inf-feats")
def _(d):
    coords = d.coords()
    feats = d.feats(len(coords))
    feats[3, 0] = float("-inf")
    SparseTensor(feats, coords)


@case("tensor-empty")
def _(d):
    SparseTensor(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.int32))


@case("tensor-zero-channels")
def _(d):
    coords = d.coords()
    SparseTensor(torch.zeros(len(coords), 0), coords)


@case("tensor-x-out-of-range")
def _(d):
    coords = d.coords()
    coords[5, 1] = 40000
    SparseTensor(d.feats(len(coords)), coords)


@case("tensor-negative-batch")
def _(d):
    coords = d.coords()
    coords[0, 0] = -1
    SparseTensor(d.feats(len(coords)), coords)


@case("tensor-devices-differ")
def _(d):
    coords = d.coords()
    SparseTensor(torch.empty(len(coords), 4, device="meta"), coords)


@case("tensor-duplicate-coords")
def _(d):
    x = d.tensor()
    coords = x.C.clone()
    coords[7] = coords[2]
    spnn.Conv3d(4, 8, 3)(SparseTensor(x.F, coords))


@case("tensor-stride-zero")
def _(d):
    d.tensor(stride=0)


@case("tensor-spatial-range-negative")
def _(d):
    d.tensor(spatial_range=(-4, 20, 20))


@case("tensor-outside-spatial-range")
def _(d):
    coords = d.coords(extent=10).abs()
    coords[:, 3] = coords[:, 3] % 8
    SparseTensor(d.feats(len(coords)), coords, spatial_range=(11, 11, 5))


@case("tensor-add-other-coords")
def _(d):
    a, b = d.tensor(), d.tensor()
    a + b


@case("tensor-add-plain-tensor")
def _(d):
    x = d.tensor()
    x + x.F


@case("tensor-replace-feats-rows")
def _(d):
    x = d.tensor()
    x.replace_feats(d.feats(len(x) + 3))


@case("tensor-dense-negative-coords")
def _(d):
    coords = d.coords()
    coords[0, 1] = -3
    SparseTensor(d.feats(len(coords)), coords).dense()


@case("tensor-dense-too-large")
def _(d):
    coords = d.coords().abs()
    coords[0, 1:] = 30000
    SparseTensor(d.feats(len(coords)), coords).dense()


@case("tensor-from-dense-4d")
def _(d):
    SparseTensor.from_dense(torch.randn(2, 5, 5, 5, generator=d.gen))


# --- conv modules ------------------------------------------------------------------------------------
@case("conv-zero-channels")
def _(d):
    spnn.Conv3d(0, 8, 3)


@case("conv-channel-mismatch")
def _(d):
    spnn.Conv3d(5, 8, 3)(d.tensor(c=4))


@case("conv-float-channels")
def _(d):
    spnn.Conv3d(4.0, 8, 3)


@case("conv-kernel-zero")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=0)


@case("conv-kernel-too-large")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=(3, 3, 99))


@case("conv-kernel-four-values")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=(3, 3, 3, 3))


@case("conv-kernel-float")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=2.5)


@case("conv-stride-zero")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=2, stride=0)


@case("conv-stride-huge")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=2, stride=1 << 21)


@case("conv-dilation-negative")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=3, dilation=(1, -1, 1))


@case("conv-padding-negative")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=3, stride=2, padding=-1)


@case("conv-generative-not-transposed")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=2, stride=2, generative=True)


@case("conv-downsample-mode")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=2, stride=2, downsample_mode="torchsparse")


@case("conv-transposed-alone")
def _(d):
    spnn.Conv3d(4, 8, kernel_size=2, stride=2, transposed=True)(d.tensor(stride=2))


@case("conv-weight-shape")
def _(d):
    conv = spnn.Conv3d(4, 8, 3)
    conv.kernel = torch.nn.Parameter(torch.randn(27, 8, 4, generator=d.gen))
    conv(d.tensor(c=4))


@case("conv-weight-dtype")
def _(d):
    spnn.Conv3d(4, 8, 3).double()(d.tensor())


@case("conv-config-string")
def _(d):
    spnn.Conv3d(4, 8, 3, config="gather_scatter")


@case("conv-plain-tensor-input")
def _(d):
    spnn.Conv3d(4, 8, 3)(d.feats(30))


# --- functional -------------------------------------------------------------------------------------
@case("fconv-kernel-volume")
def _(d):
    F.conv3d(d.tensor(), torch.randn(26, 4, 8, generator=d.gen), kernel_size=3)


@case("fconv-weight-2d")
def _(d):
    F.conv3d(d.tensor(), torch.randn(4, 8, generator=d.gen), kernel_size=1)


@case("fconv-bias-shape")
def _(d):
    F.conv3d(d.tensor(), torch.randn(27, 4, 8, generator=d.gen), 3, bias=torch.randn(7, generator=d.gen))


@case("fconv-bias-dtype")
def _(d):
    F.conv3d(d.tensor(), torch.randn(27, 4, 8, generator=d.gen), 3, bias=torch.randn(8, generator=d.gen).double())


@case("fconv-plain-tensor-input")
def _(d):
    F.conv3d(d.feats(40), torch.randn(27, 4, 8, generator=d.gen), kernel_size=3)


@case("fconv-generative-not-transposed")
def _(d):
    F.conv3d(d.tensor(stride=2), torch.randn(8, 4, 8, generator=d.gen), 2, stride=2, generative=True)


@case("kernel-offsets-zero")
def _(d):
    F.kernel_offsets(0)


# --- pooling and norms ------------------------------------------------------------------------------
@case("pool-kernel-zero")
def _(d):
    spnn.MaxPool3d(kernel_size=0)


@case("pool-stride-zero")
def _(d):
    F.avg_pool3d(d.tensor(), kernel_size=2, stride=0)


@case("global-pool-plain-tensor")
def _(d):
    F.global_avg_pool(d.feats(30))


@case("batchnorm-channels")
def _(d):
    spnn.BatchNorm(6)(d.tensor(c=4))


@case("groupnorm-groups")
def _(d):
    spnn.GroupNorm(3, 8)


@case("groupnorm-channels")
def _(d):
    spnn.GroupNorm(2, 8)(d.tensor(c=4))


@case("instancenorm-channels")
def _(d):
    spnn.InstanceNorm(5)(d.tensor(c=4))


@case("batchnorm-one-point-training")
def _(d):
    coords = d.coords(n=1)
    spnn.BatchNorm(4).train()(SparseTensor(d.feats(1), coords))


# --- ConvConfig ---------------------------------------------------------------------------------------
@case("config-unknown-dataflow")
def _(d):
    ConvConfig("cutlass")


@case("config-unknown-backend")
def _(d):
    ConvConfig("fetch_on_demand", backend="cuda")


@case("config-parameter-of-other-dataflow")
def _(d):
    ConvConfig("fetch_on_demand", epsilon=0.3)


@case("config-epsilon-range")
def _(d):
    ConvConfig("gather_scatter", epsilon=1.5)


@case("config-mm-thresh-negative")
def _(d):
    ConvConfig("gather_scatter", mm_thresh=-1)


@case("config-split-negative")
def _(d):
    ConvConfig("implicit_gemm", split_mask_num=-2)


@case("config-sorted-without-splits")
def _(d):
    ConvConfig("implicit_gemm", sorted=True, split_mask_num=0)


@case("config-sorted-not-bool")
def _(d):
    ConvConfig("implicit_gemm", sorted="yes")


@case("config-tile-native")
def _(d):
    ConvConfig("implicit_gemm", tile="m64n64k32")


@case("config-tile-unknown")
def _(d):
    ConvConfig("implicit_gemm", backend="triton", tile="m7n7k7")


# --- kernel maps ----------------------------------------------------------------------------------------
@case("geometry-kernel-zero")
def _(d):
    ConvGeometry.make(0)


@case("kmap-op-float-coords")
def _(d):
    ops.kmap_submanifold(d.coords().float(), [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)


@case("kmap-op-duplicates")
def _(d):
    coords = d.coords()
    coords[4] = coords[9]
    ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)


@case("kmap-op-rows-past-int32")
def _(d):
    ops.kmap_downsample(d.coords(n=1).expand(1 << 31, 4), [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0],
                        "spconv", None, 128)


@case("kmap-pairs-num-in")
def _(d):
    coords = d.coords()
    out_in = ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    ops.kmap_pairs(out_in, len(coords) // 2, len(coords))


@case("kmap-memory-native")
def _(d):
    d.monkeypatch.setenv("TSPP_MEMORY_LIMIT_BYTES", str(1 << 20))
    ops.kmap_generative(d.coords(n=400, extent=30), [9, 9, 9], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128)


@case("kmap-memory-torch")
def _(d):
    d.monkeypatch.setenv("TSPP_MEMORY_LIMIT_BYTES", str(1 << 20))
    torch_ops.kmap_generative(d.coords(n=400, extent=30), [9, 9, 9], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128)


@case("kmap-memory-limit-text")
def _(d):
    d.monkeypatch.setenv("TSPP_MEMORY_LIMIT_BYTES", "2GB")
    ops.kmap_generative(d.coords(n=400, extent=30), [3, 3, 3], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128)


# --- data readers ---------------------------------------------------------------------------------------
@case("read-bin-misaligned")
def _(d):
    read_bin(d.file("scan.bin", d.points().tobytes()[:-6]))


@case("read-bin-missing")
def _(d):
    read_bin(d.tmp / "nowhere.bin")


@case("read-points-extension")
def _(d):
    read_points(d.file("scan.xyz", d.points().tobytes()))


@case("read-points-nonfinite-error")
def _(d):
    points = d.points()
    points[3, 1] = np.nan
    read_points(d.file("scan.bin", points.tobytes()), nonfinite="error")


@case("read-npy-truncated")
def _(d):
    path = d.tmp / "scan.npy"
    np.save(path, d.points())
    path.write_bytes(path.read_bytes()[:-17])
    read_points(path)


@case("read-pcd-truncated")
def _(d):
    path = d.tmp / "scan.pcd"
    write_points(path, d.points()[:, :3].astype(np.float64))
    path.write_bytes(path.read_bytes()[:-20])
    read_pcd(path)


@case("read-ply-truncated")
def _(d):
    path = d.tmp / "scan.ply"
    write_points(path, d.points()[:, :3].astype(np.float64))
    path.write_bytes(path.read_bytes()[:-20])
    read_ply(path)


@case("read-ply-not-ply")
def _(d):
    read_ply(d.file("scan.ply", b"solid cube\nfacet normal 0 0 1\n"))


@case("read-labels-count")
def _(d):
    from torchsparse_pp.data.semantickitti import read_labels
    labels = d.rng.integers(0, 260, size=40).astype(np.uint32)
    read_labels(d.file("000000.label", labels.tobytes()), num_points=41)


# --- checkpoints -----------------------------------------------------------------------------------------
def _saved_state(d) -> bytes:
    path = d.tmp / "state.pt"
    torch.save({"format": 1, "model": {"w": torch.randn(64, 64, generator=d.gen)}}, path)
    return path.read_bytes()


@case("checkpoint-truncated")
def _(d):
    data = _saved_state(d)
    load_checkpoint(d.file("last.pt", data[:len(data) // 2]))


@case("checkpoint-empty")
def _(d):
    load_checkpoint(d.file("last.pt", b""))


@case("checkpoint-yaml")
def _(d):
    load_checkpoint(d.file("run.yaml", b"model:\n  name: minkunet\n"))


@case("checkpoint-foreign")
def _(d):
    path = d.tmp / "weights.pt"
    torch.save({"state_dict": {"w": torch.randn(3, 3, generator=d.gen)}}, path)
    load_checkpoint(path)


@case("checkpoint-missing")
def _(d):
    load_checkpoint(d.tmp / "runs" / "last.pt")


# --- config overrides (the CLI's section.key=value) ------------------------------------------------------
@case("override-without-equals")
def _(d):
    load_config(None, ["train.epochs"])


@case("override-unknown-section")
def _(d):
    load_config(None, ["trian.epochs=3"])


@case("override-unknown-key")
def _(d):
    load_config(None, ["train.epoch=3"])


@case("override-wrong-type")
def _(d):
    load_config(None, ["train.epochs=three"])


@case("override-non-positive")
def _(d):
    load_config(None, ["data.root=" + str(d.tmp), "train.epochs=0"])


# --- quantize and collate --------------------------------------------------------------------------------
@case("quantize-nan")
def _(d):
    xyz = d.points(columns=3)
    xyz[11, 2] = np.nan
    sparse_quantize(xyz, 0.1)


@case("quantize-voxel-zero")
def _(d):
    sparse_quantize(d.points(columns=3), 0.0)


@case("quantize-voxel-size-length")
def _(d):
    sparse_quantize(d.points(columns=3), (0.1, 0.1))


@case("quantize-overflow")
def _(d):
    sparse_quantize(d.points(columns=3) * 1e4, 0.01)


@case("collate-channels")
def _(d):
    one = [SparseTensor(d.feats(len(c), ch), c) for c, ch in ((d.coords(batch=1), 4), (d.coords(batch=1), 5))]
    sparse_collate(one)


@case("collate-not-sparse")
def _(d):
    sparse_collate([d.tensor(), d.feats(10)])


# --- compat: spconv -----------------------------------------------------------------------------------------
def _spconv():
    from torchsparse_pp.compat.spconv import pytorch as spconv
    return spconv


def _indices(d, n=50, shape=(20, 20, 20), batch=2):
    coords = d.coords(n=n, extent=10)
    coords[:, 1:] += 10
    coords[:, 0] = coords[:, 0] % batch
    return coords


@case("spconv-indices-int64")
def _(d):
    idx = _indices(d)
    _spconv().SparseConvTensor(d.feats(len(idx)), idx.long(), [20, 20, 20], 2)


@case("spconv-batch-out-of-range")
def _(d):
    idx = _indices(d)
    _spconv().SparseConvTensor(d.feats(len(idx)), idx, [20, 20, 20], 1)


@case("spconv-spatial-shape-length")
def _(d):
    idx = _indices(d)
    _spconv().SparseConvTensor(d.feats(len(idx)), idx, [20, 20], 2)


@case("spconv-feature-rows")
def _(d):
    idx = _indices(d)
    _spconv().SparseConvTensor(d.feats(len(idx) + 1), idx, [20, 20, 20], 2)


@case("spconv-benchmark-flag")
def _(d):
    idx = _indices(d)
    _spconv().SparseConvTensor(d.feats(len(idx)), idx, [20, 20, 20], 2, benchmark=True)


@case("spconv-algo")
def _(d):
    _spconv().SubMConv3d(4, 8, 3, algo="fast")


@case("spconv-input-type")
def _(d):
    _spconv().SubMConv3d(4, 8, 3)(d.tensor())


# --- compat: torchsparse -------------------------------------------------------------------------------------
def _torchsparse():
    from torchsparse_pp.compat import torchsparse
    return torchsparse


@case("torchsparse-dilation")
def _(d):
    _torchsparse().nn.Conv3d(4, 8, 3, dilation=2)


@case("torchsparse-generative-not-transposed")
def _(d):
    _torchsparse().nn.Conv3d(4, 8, 2, stride=2, generative=True)


@case("torchsparse-negative-coords")
def _(d):
    ts = _torchsparse()
    coords = d.coords().abs()
    coords[0, 2] = -4
    ts.nn.Conv3d(4, 8, 2, stride=2)(ts.SparseTensor(d.feats(len(coords)), coords))


@case("torchsparse-kmap-mode")
def _(d):
    _torchsparse().nn.functional.set_kmap_mode("octree")


@case("torchsparse-conv-mode")
def _(d):
    _torchsparse().nn.functional.set_conv_mode(7)


# --- the table ------------------------------------------------------------------------------------------------
def doc_rows():
    """(case id, exception name, message fragment) of every table row in docs/bad_inputs.md whose
    first cell is a case id in backticks."""
    rows = []
    if not DOC.is_file():  # test_the_table_and_the_cases_match says so
        return rows
    for number, line in enumerate(DOC.read_text().splitlines(), 1):
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"docs/bad_inputs.md:{number}: expected 4 cells (case | input | error | message), " \
                                f"got {len(cells)}: {line!r}"
        ident, _, error, fragment = cells
        assert ident.startswith("`") and ident.endswith("`"), f"docs/bad_inputs.md:{number}: {ident!r}"
        assert fragment.startswith("`") and fragment.endswith("`") and len(fragment) > 2, \
            f"docs/bad_inputs.md:{number}: the message fragment must be in backticks: {fragment!r}"
        rows.append((ident.strip("`"), error.strip("`"), fragment[1:-1]))
    return rows


ROWS = doc_rows()


def test_the_table_and_the_cases_match():
    assert DOC.is_file(), f"{DOC} is missing"
    ids = [r[0] for r in ROWS]
    assert len(ids) >= 50, f"docs/bad_inputs.md has {len(ids)} rows"
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})
    assert not set(ids) - set(CASES), f"rows without a case: {sorted(set(ids) - set(CASES))}"
    assert not set(CASES) - set(ids), f"cases without a row: {sorted(set(CASES) - set(ids))}"
    assert all(r[1] in EXCEPTIONS for r in ROWS), [r for r in ROWS if r[1] not in EXCEPTIONS]


@pytest.mark.parametrize("ident,error,fragment", ROWS, ids=[r[0] for r in ROWS])
def test_row(ident, error, fragment, tmp_path, monkeypatch):
    if ident not in CASES:
        pytest.fail(f"docs/bad_inputs.md row {ident!r} has no case in {__file__}")
    monkeypatch.delenv("TSPP_MEMORY_LIMIT_BYTES", raising=False)
    with pytest.raises(Exception) as raised:
        CASES[ident](Data(ident, tmp_path, monkeypatch))
    err = raised.value
    assert type(err).__name__ == error, f"{ident}: documented {error}, raised {type(err).__name__}: {err}"
    assert fragment in str(err), f"{ident}: {fragment!r} is not in the message: {err}"
