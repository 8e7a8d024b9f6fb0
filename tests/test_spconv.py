"""Cross-checks against spconv 2.3.8 (CPU, Native algorithm) on generated LiDAR scans.

spconv is an optional test dependency; the module is skipped when it is missing.

Conventions that the comparison relies on (checked on tiny cases below against the dense oracle):
- spconv indices are (batch, x, y, z) in the axis order we give it, the same as ours;
- spconv's weight is [C_out, kx, ky, kz, C_in] for SubMConv3d, SparseConv3d and
  SparseInverseConv3d alike, so ours = w_sp.permute(1, 2, 3, 4, 0).reshape(K, C_in, C_out);
- spconv's CPU path races with more than one thread, so every spconv call runs with
  torch.set_num_threads(1);
- spconv's 1x1 stride-1 path is not cross-checked (it is wrong for converted weights);
- spconv 2.3.8's backward asks torch.cuda for the current stream before it branches to its CPU
  path, which raises on a CPU-only torch build; the stream is unused on the CPU path, so the
  gradient tests stand a dummy stream in for it (see ``cpu_backward``).

spconv returns output rows in its own order; rows are matched by sorting both sides by
(batch, x, y, z).
"""
import contextlib

import numpy as np
import pytest
import torch

pytest.importorskip("spconv")
spconv = pytest.importorskip("spconv.pytorch")

import torchsparse_pp as tsp  # noqa: E402
from torchsparse_pp.data.synthetic import generate_scan  # noqa: E402
from torchsparse_pp.nn import Conv3d  # noqa: E402
from torchsparse_pp.utils.quantize import sparse_quantize  # noqa: E402
from oracle import reference_conv  # noqa: E402

pytestmark = pytest.mark.spconv

C_IN, C_OUT = 16, 32
VOXEL = 0.1
SCAN_SEEDS = (101, 202)  # one 32-beam scan per batch entry
FEATURE_TOL = 1e-4  # max |ours - spconv| / max |spconv|
GRAD_TOL = 1e-4


@contextlib.contextmanager
def single_thread():
    """spconv's CPU kernels are only race-free at one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def cpu_backward(monkeypatch):
    """Lets spconv's CPU backward run on a torch built without CUDA (see the module docstring)."""
    import spconv.pytorch.ops as spconv_ops
    if not torch.cuda.is_available():
        monkeypatch.setattr(spconv_ops, "get_current_stream", lambda: 0)


def to_ours(w_sp: torch.Tensor) -> torch.Tensor:
    """spconv [C_out, kx, ky, kz, C_in] -> ours [kx*ky*kz, C_in, C_out] (z fastest)."""
    c_out, c_in = w_sp.shape[0], w_sp.shape[-1]
    return w_sp.permute(1, 2, 3, 4, 0).reshape(-1, c_in, c_out)


def sort_rows(coords: torch.Tensor, *values: torch.Tensor):
    """Sorts coords (and the rows of values) lexicographically by (batch, x, y, z)."""
    c = coords.long()
    key = c[:, 0]
    for a in range(1, 4):
        key = key * (1 << 20) + c[:, a]
    order = torch.argsort(key)
    return (coords[order].int(),) + tuple(v[order] for v in values)


def rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


@pytest.fixture(scope="module")
def scans():
    """Two generated 32-beam scans, each shifted to non-negative coordinates and voxelised at
    0.1 m, as one batch. Returns (coords int32 [N, 4] sorted, spatial_shape [x, y, z])."""
    rows = []
    for b, seed in enumerate(SCAN_SEEDS):
        xyz = generate_scan(32, seed=seed)["points"][:, :3].astype(np.float64)
        xyz -= xyz.min(0)
        voxels = torch.from_numpy(sparse_quantize(xyz, VOXEL))
        rows.append(torch.cat([torch.full((len(voxels), 1), b, dtype=torch.int32), voxels], 1))
    coords = torch.cat(rows)
    shape = (coords[:, 1:].amax(0) + 1).tolist()
    return coords, shape


def features(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, C_IN, generator=torch.Generator().manual_seed(seed))


def run_spconv(module, feats, coords, shape, grad_seed=None, indice_module=None):
    """Forward (and optionally backward of sum(out * r)) of an spconv module at one thread.

    Returns (out_indices, out_features, r, input_grad, weight_grad) — the last three None
    without grad_seed. ``indice_module`` is run first (for inverse convs) and its output fed in.
    """
    with single_thread():
        x_feats = feats.clone().requires_grad_(grad_seed is not None)
        x = spconv.SparseConvTensor(x_feats, coords, shape, int(coords[:, 0].max()) + 1)
        if indice_module is not None:
            x = indice_module(x)
        y = module(x)
        r = gx = gw = None
        if grad_seed is not None:
            r = torch.randn(y.features.shape, generator=torch.Generator().manual_seed(grad_seed))
            (y.features * r).sum().backward()
            gx, gw = x_feats.grad, module.weight.grad
        return y.indices, y.features.detach(), r, gx, gw


def run_ours(module, feats, coords, shape, r_by_sorted_row=None, spconv_indices=None, before=None):
    """Forward (and optionally backward of sum(out * r)) of our module on the same input.

    ``r_by_sorted_row`` is spconv's upstream gradient, reordered to our row order through the
    sorted coordinates so both backward passes see the same sum(out * r)."""
    x_feats = feats.clone().requires_grad_(r_by_sorted_row is not None)
    x = tsp.SparseTensor(x_feats, coords, spatial_range=shape)
    if before is not None:
        x = before(x)
    y = module(x)
    gx = gw = None
    if r_by_sorted_row is not None:
        # Our outputs are sorted already; map spconv's r to them through the sorted order.
        sp_sorted, r_sorted = sort_rows(spconv_indices, r_by_sorted_row)
        ours_sorted, order = sort_rows(y.C, torch.arange(y.C.shape[0]))
        assert torch.equal(sp_sorted, ours_sorted)
        r = torch.empty_like(r_sorted)
        r[order] = r_sorted
        (y.F * r).sum().backward()
        gx, gw = x_feats.grad, module.kernel.grad
    return y, gx, gw


def spconv_module(kind, kernel, stride, padding, seed, indice_key=None, c_in=C_IN, c_out=C_OUT):
    torch.manual_seed(seed)
    if kind == "subm":
        m = spconv.SubMConv3d(c_in, c_out, kernel, bias=False, indice_key=indice_key)
    elif kind == "sparse":
        m = spconv.SparseConv3d(c_in, c_out, kernel, stride=stride, padding=padding, bias=False,
                                indice_key=indice_key)
    else:
        m = spconv.SparseInverseConv3d(c_in, c_out, kernel, indice_key=indice_key, bias=False)
    with torch.no_grad():  # spconv's default init is small; use unit-scale weights
        m.weight.normal_()
    return m


def ours_like(m, stride=1, padding=None, transposed=False):
    c_out, c_in = m.weight.shape[0], m.weight.shape[-1]
    ours = Conv3d(c_in, c_out, tuple(m.weight.shape[1:4]), stride=stride, padding=padding,
                  transposed=transposed, downsample_mode="spconv")
    with torch.no_grad():
        ours.kernel.copy_(to_ours(m.weight.detach()))
    return ours


# --- layouts on tiny cases, against the dense oracle (independent of our kernels) ----------------

@pytest.mark.parametrize("kind,kernel,stride,padding",
                         [("subm", 3, 1, 1), ("sparse", 3, 2, 1), ("sparse", 2, 2, 0), ("sparse", 3, 2, 0)])
def test_spconv_weight_layout_matches_dense_oracle(kind, kernel, stride, padding):
    g = torch.Generator().manual_seed(7)
    shape = [7, 6, 8]
    xyz = torch.unique(torch.stack([torch.randint(0, n, (60,), generator=g) for n in shape], 1), dim=0)
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.long), xyz], 1).int()
    feats = torch.randn(len(coords), 3, generator=g, dtype=torch.float64)
    m = spconv_module(kind, kernel, stride, padding, seed=3, c_in=3, c_out=5).double()
    with single_thread():
        y = m(spconv.SparseConvTensor(feats, coords, shape, 1))
    want = reference_conv(coords, feats, to_ours(m.weight.detach()), y.indices.int(), kernel,
                          stride, 1, padding)
    assert rel_max(y.features, want) < 1e-10


def test_spconv_inverse_weight_layout_matches_dense_oracle():
    """SparseInverseConv3d's weight is [C_out, kx, ky, kz, C_in] too, with no kernel flip: it is
    conv_transpose3d with ours = w.permute(1, 2, 3, 4, 0).reshape(K, C_in, C_out)."""
    g = torch.Generator().manual_seed(8)
    shape = [7, 6, 8]
    xyz = torch.unique(torch.stack([torch.randint(0, n, (60,), generator=g) for n in shape], 1), dim=0)
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.long), xyz], 1).int()
    feats = torch.randn(len(coords), 3, generator=g, dtype=torch.float64)
    down = spconv_module("sparse", 3, 2, 1, seed=4, indice_key="d", c_in=3, c_out=4).double()
    inv = spconv_module("inverse", 3, None, None, seed=5, indice_key="d", c_in=4, c_out=2).double()
    with single_thread():
        coarse = down(spconv.SparseConvTensor(feats, coords, shape, 1))
        fine = inv(coarse)
    want = reference_conv(coarse.indices.int(), coarse.features.detach(), to_ours(inv.weight.detach()),
                          fine.indices.int(), 3, 2, 1, 1, transposed=True)
    assert rel_max(fine.features, want) < 1e-10


# --- generated scans --------------------------------------------------------------------------------

def test_submanifold_k3_forward_and_grads(scans, cpu_backward):
    coords, shape = scans
    feats = features(len(coords), seed=11)
    m = spconv_module("subm", 3, 1, 1, seed=12)
    sp_idx, sp_out, r, sp_gx, sp_gw = run_spconv(m, feats, coords, shape, grad_seed=13)
    ours = ours_like(m)
    y, gx, gw = run_ours(ours, feats, coords, shape, r, sp_idx)

    sp_c, sp_f = sort_rows(sp_idx, sp_out)
    assert torch.equal(y.C, coords)  # submanifold: outputs on the input coordinates
    assert torch.equal(sort_rows(y.C)[0], sp_c)
    assert rel_max(sort_rows(y.C, y.F)[1], sp_f) < FEATURE_TOL
    assert rel_max(gx, sp_gx) < GRAD_TOL
    assert rel_max(gw, to_ours(sp_gw)) < GRAD_TOL


def _t(v):
    return (v, v, v) if isinstance(v, int) else tuple(v)


# The last two are CenterPoint-like (VoxelResBackBone8x conv_out and the asymmetric-pad stage).
@pytest.mark.parametrize("kernel,stride,padding",
                         [(3, 2, 1), (2, 2, 0), (3, 2, 0), ((3, 1, 1), (2, 1, 1), 0), (3, 2, (1, 1, 0))])
def test_strided_forward_and_grads(scans, cpu_backward, kernel, stride, padding):
    coords, shape = scans
    feats = features(len(coords), seed=21)
    m = spconv_module("sparse", kernel, stride, padding, seed=22)
    sp_idx, sp_out, r, sp_gx, sp_gw = run_spconv(m, feats, coords, shape, grad_seed=23)
    ours = ours_like(m, stride=stride, padding=padding)
    y, gx, gw = run_ours(ours, feats, coords, shape, r, sp_idx)

    sp_c, sp_f = sort_rows(sp_idx, sp_out)
    our_c, our_f = sort_rows(y.C, y.F)
    assert torch.equal(our_c, y.C)  # ours come sorted
    assert our_c.shape == sp_c.shape and torch.equal(our_c, sp_c)
    assert y.s == _t(stride)
    dense = [(n + 2 * p - k) // st + 1 for n, k, st, p in zip(shape, _t(kernel), _t(stride), _t(padding))]
    assert list(y.spatial_range) == dense
    assert rel_max(our_f, sp_f) < FEATURE_TOL
    assert rel_max(gx, sp_gx) < GRAD_TOL
    assert rel_max(gw, to_ours(sp_gw)) < GRAD_TOL


def test_inverse_after_strided_k3_s2_p1(scans):
    coords, shape = scans
    feats = features(len(coords), seed=31)
    down_sp = spconv_module("sparse", 3, 2, 1, seed=32, indice_key="down")
    inv_sp = spconv_module("inverse", 3, None, None, seed=33, indice_key="down", c_in=C_OUT, c_out=C_IN)
    sp_idx, sp_out, _, _, _ = run_spconv(inv_sp, feats, coords, shape, indice_module=down_sp)

    down = ours_like(down_sp, stride=2, padding=1)
    inv = ours_like(inv_sp, stride=2, padding=1, transposed=True)
    with torch.no_grad():
        y, _, _ = run_ours(inv, feats, coords, shape, before=down)

    assert torch.equal(y.C, coords)  # back on the fine input coordinates, in input order
    assert y.s == (1, 1, 1) and list(y.spatial_range) == shape
    sp_c, sp_f = sort_rows(sp_idx, sp_out)
    assert torch.equal(sp_c, coords)
    assert rel_max(y.F, sp_f) < FEATURE_TOL
