"""Point-voxel operations (torchsparse_pp.point and the torchsparse 2.1 names in the compat
layer) against direct float64 references written point by point, plus gradcheck."""
import math

import numpy as np
import pytest
import torch

from torchsparse_pp import SparseTensor
from torchsparse_pp.compat.torchsparse.nn import functional as tsF
from torchsparse_pp.compat.torchsparse.nn.utils import get_kernel_offsets
from torchsparse_pp.data import generate_scan
from torchsparse_pp.point import PointTensor, initial_voxelize, point_to_voxel, voxel_to_point


def scan_points(seed: int, voxel: float = 0.4, crop: float = 5.0, batch: int = 2, channels: int = 3):
    """Points of generated scans in voxel units (batch column first) with float64 features."""
    rows = []
    for b in range(batch):
        xyz = generate_scan(32, seed=seed + b)["points"][:, :3].astype(np.float64)
        xyz = xyz[(np.abs(xyz[:, :2]) < crop).all(1)] / voxel
        rows.append(np.concatenate([np.full((len(xyz), 1), b), xyz], 1))
    coords = torch.from_numpy(np.concatenate(rows))
    feats = torch.randn(len(coords), channels, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return PointTensor(feats, coords)


def voxel_table(tensor: SparseTensor):
    return {tuple(c): i for i, c in enumerate(tensor.C.tolist())}


def test_initial_voxelize_is_the_mean_per_voxel(seed):
    z = scan_points(seed)
    x = initial_voxelize(z)
    sums, counts = {}, {}
    for c, f in zip(z.C.tolist(), z.F):
        key = (int(c[0]),) + tuple(math.floor(v) for v in c[1:])
        sums[key] = sums.get(key, 0) + f
        counts[key] = counts.get(key, 0) + 1
    assert sorted(sums) == [tuple(c) for c in x.C.tolist()]  # sorted, unique, every occupied voxel
    want = torch.stack([sums[tuple(c)] / counts[tuple(c)] for c in x.C.tolist()])
    assert torch.allclose(x.F, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stride", [(1, 1, 1), (2, 2, 2), (4, 4, 2)])
def test_point_to_voxel_is_the_mean_of_points_inside(stride, seed):
    z = scan_points(seed)
    base = initial_voxelize(z)
    g = torch.Generator().manual_seed(seed)
    # A voxel set at this stride with some voxels missing (their points are dropped) and one
    # voxel without points (it gets 0).
    cells = torch.unique(torch.cat([z.C[:, :1], torch.floor(z.C[:, 1:] / torch.tensor(stride))], 1).long(), dim=0)
    keep = torch.rand(len(cells), generator=g) < 0.8
    empty = cells[:1].clone()
    empty[0, 1] -= 1000
    coords = torch.cat([cells[keep], empty]).int()
    x = SparseTensor(torch.zeros(len(coords), 1, dtype=torch.float64), coords, stride=stride)
    y = point_to_voxel(x, z)
    table = voxel_table(x)
    sums = torch.zeros(len(coords), z.F.shape[1], dtype=torch.float64)
    counts = torch.zeros(len(coords), dtype=torch.float64)
    for c, f in zip(z.C.tolist(), z.F):
        row = table.get((int(c[0]),) + tuple(math.floor(v / s) for v, s in zip(c[1:], stride)))
        if row is not None:
            sums[row] += f
            counts[row] += 1
    want = sums / counts.clamp(min=1).unsqueeze(1)
    assert torch.allclose(y.F, want, rtol=1e-12, atol=1e-12) and y.C is x.C and y.s == x.s
    assert counts[-1] == 0 and torch.equal(y.F[-1], torch.zeros(z.F.shape[1], dtype=torch.float64))
    assert base.num_points > 0


def reference_trilinear(x: SparseTensor, z: PointTensor, nearest: bool) -> torch.Tensor:
    table = voxel_table(x)
    out = torch.zeros(z.num_points, x.F.shape[1], dtype=torch.float64)
    for i, c in enumerate(z.C.tolist()):
        u = [v / s for v, s in zip(c[1:], x.s)]
        base = [math.floor(v) for v in u]
        if nearest:
            row = table.get((int(c[0]),) + tuple(base))
            out[i] = x.F[row] if row is not None else 0
            continue
        total, acc = 0.0, torch.zeros(x.F.shape[1], dtype=torch.float64)
        for dx in (0, 1):
            for dy in (0, 1):
                for dz in (0, 1):
                    corner = (base[0] + dx, base[1] + dy, base[2] + dz)
                    row = table.get((int(c[0]),) + corner)
                    if row is None:
                        continue
                    w = np.prod([1 - abs(v - k) for v, k in zip(u, corner)])
                    total += w
                    acc += w * x.F[row]
        out[i] = acc / total if total > 0 else 0
    return out


@pytest.mark.parametrize("nearest", [False, True])
@pytest.mark.parametrize("stride", [(1, 1, 1), (2, 2, 2), (8, 8, 4)])
def test_voxel_to_point(stride, nearest, seed):
    z = scan_points(seed, crop=3.0)
    cells = torch.unique(torch.cat([z.C[:, :1], torch.floor(z.C[:, 1:] / torch.tensor(stride))], 1).long(), dim=0)
    # Add the neighbouring cells on one side so that many points see several corners.
    shifted = cells + torch.tensor([0, 1, 0, 1])
    coords = torch.unique(torch.cat([cells, shifted]), dim=0)
    coords = coords[torch.randperm(len(coords), generator=torch.Generator().manual_seed(seed))].int()
    x = SparseTensor(torch.randn(len(coords), 4, dtype=torch.float64), coords, stride=stride)
    got = voxel_to_point(x, z, nearest=nearest)
    assert got.C is z.C
    assert torch.allclose(got.F, reference_trilinear(x, z, nearest), rtol=1e-12, atol=1e-12)


def test_gradcheck_point_voxel_ops(seed):
    g = torch.Generator().manual_seed(seed)
    coords = torch.cat([torch.randint(0, 2, (40, 1), generator=g).double(), torch.rand(40, 3, generator=g, dtype=torch.float64) * 5], 1)
    feats = torch.randn(40, 2, dtype=torch.float64, generator=g, requires_grad=True)
    z0 = PointTensor(feats, coords)
    x = initial_voxelize(z0)
    vox_feats = torch.randn(x.num_points, 2, dtype=torch.float64, generator=g, requires_grad=True)

    def chain(point_feats, voxel_feats):
        z = z0.replace_feats(point_feats)
        v = point_to_voxel(SparseTensor._derive(voxel_feats, x.C, x.s, None, x.cache), z)
        return voxel_to_point(v.replace_feats(v.F * voxel_feats), z).F

    assert torch.autograd.gradcheck(chain, (feats, vox_feats))
    assert torch.autograd.gradcheck(lambda f: initial_voxelize(PointTensor(f, coords)).F, (feats,))


def reference_ti_weights(coords, idx, scale):
    out = torch.zeros(len(coords), 8, dtype=torch.float64)
    for i, p in enumerate(coords.tolist()):
        low = [math.floor(v / scale) * scale for v in p]
        for k in range(8):
            bits = ((k >> 2) & 1, (k >> 1) & 1, k & 1)
            w = np.prod([(v - lo) if b else (lo + scale - v) for v, lo, b in zip(p, low, bits)]) / scale ** 3
            out[i, k] = 0 if idx[i, k] == -1 else w
        out[i] /= out[i].sum() + 1e-8
    return out


@pytest.mark.parametrize("scale", [1, 4])
def test_calc_ti_weights_and_spdevoxelize(scale, seed):
    """2.1's point-voxel path as spvnas wrote it: hash the 8 corner voxels (offsets of
    get_kernel_offsets(2)), query them among the voxels, weights, devoxelize."""
    g = torch.Generator().manual_seed(seed)
    pts = torch.rand(60, 3, generator=g, dtype=torch.float64) * 12
    batch = torch.randint(0, 2, (60, 1), generator=g)
    voxels = torch.unique(torch.cat([batch, torch.floor(pts / scale).long() * scale], 1), dim=0)
    voxels = voxels[torch.rand(len(voxels), generator=g) < 0.7].int()
    base = torch.cat([batch, torch.floor(pts / scale).long() * scale], 1).int()
    # 2.1's sphash adds offsets to the first three columns: hash rows as (x, y, z, batch).
    corner_hash = tsF.sphash(base[:, [1, 2, 3, 0]].contiguous(), get_kernel_offsets(2, scale))  # [8, N]
    idx = tsF.sphashquery(corner_hash, tsF.sphash(voxels[:, [1, 2, 3, 0]].contiguous())).t().contiguous()
    w = tsF.calc_ti_weights(pts, idx, scale=scale)
    assert torch.allclose(w, reference_ti_weights(pts, idx, scale), rtol=1e-12, atol=1e-15)
    feats = torch.randn(len(voxels), 3, dtype=torch.float64, generator=g, requires_grad=True)
    out = tsF.spdevoxelize(feats, idx, w)
    want = torch.stack([sum((w[i, k] * feats[idx[i, k]] for k in range(8) if idx[i, k] >= 0),
                            torch.zeros(3, dtype=torch.float64)) for i in range(60)])
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda f: tsF.spdevoxelize(f, idx, w), (feats,))
    # Corner k of the query is (low + get_kernel_offsets(2)[k] * scale): the same order as the weights.
    table = {tuple(c): i for i, c in enumerate(voxels.tolist())}
    offsets = get_kernel_offsets(2, scale)
    for i in range(60):
        for k in range(8):
            key = (int(base[i, 0]),) + tuple(int(base[i, 1 + a] + offsets[k, a]) for a in range(3))
            assert idx[i, k] == table.get(key, -1)


def test_sphash_is_fnv1a_and_spvoxelize_spcount(seed):
    g = torch.Generator().manual_seed(seed)
    coords = torch.randint(-50, 50, (30, 4), generator=g).int()
    got = tsF.sphash(coords)
    for c, h in zip(coords.tolist(), got.tolist()):
        value = 14695981039346656037
        for v in c:
            value = ((value ^ (v & 0xFFFFFFFF)) * 1099511628211) % (1 << 64)
        assert h == (value >> 60) ^ (value & ((1 << 60) - 1))
    idx = torch.randint(-1, 6, (50,), generator=g)
    counts = tsF.spcount(idx.int(), 8)
    assert counts.tolist() == [int((idx == r).sum()) for r in range(8)]
    feats = torch.randn(50, 2, dtype=torch.float64, generator=g)
    out = tsF.spvoxelize(feats, idx.int(), counts)
    for r in range(8):
        rows = feats[idx == r]
        assert torch.allclose(out[r], rows.mean(0) if len(rows) else torch.zeros(2, dtype=torch.float64))
