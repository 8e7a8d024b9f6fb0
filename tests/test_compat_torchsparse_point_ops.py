"""torchsparse 2.1's point-voxel ops (compat torchsparse.nn.functional) where 2.1's kernels
decide the edge cases (test_point_ops.py checks their definitions): spvoxelize skips indices
outside the counts and voxels of count 0 (its GPU kernel), spcount rejects indices it would
count out of bounds, sphashquery returns the first of repeated references (its CPU table),
spdevoxelize gives the weights no gradient and takes 8 corners, calc_ti_weights keeps the cell
corners in float32."""
import pytest
import torch

from torchsparse_pp.compat.torchsparse.nn import functional as F


def test_spvoxelize_skips_what_2_1_skips(gen):
    feats = torch.randn(40, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(-1, 8, (40,), generator=gen).int()  # rows 6 and 7 lie outside the counts
    counts = F.spcount(idx.clamp(max=5), 6)
    counts[2] = 0  # a voxel whose count says empty stays 0
    out = F.spvoxelize(feats, idx, counts)
    for r in range(6):
        rows = feats[idx == r].detach()
        want = rows.sum(0) / counts[r] if counts[r] else torch.zeros(3, dtype=torch.float64)
        assert torch.allclose(out[r], want, rtol=1e-13, atol=1e-15)
    (grad,) = torch.autograd.grad(out.sum(), feats)
    live = (idx >= 0) & (idx < 6) & (idx != 2)
    assert torch.equal(grad[~live], torch.zeros_like(grad[~live]))
    assert torch.allclose(grad[live], (1 / counts[idx[live].long()].double())[:, None].expand(-1, 3))


def test_spcount_rejects_what_2_1_would_count_out_of_bounds():
    with pytest.raises(IndexError, match="num=3"):
        F.spcount(torch.tensor([0, 3], dtype=torch.int32), 3)
    with pytest.raises(TypeError, match="int32"):
        F.spcount(torch.tensor([0, 1]), 3)


def test_sphashquery_takes_the_first_repeated_reference(gen):
    refs = torch.randint(-(1 << 40), 1 << 40, (30,), generator=gen)
    refs = torch.cat([refs, refs[:10]])  # rows 30..39 repeat rows 0..9
    queries = torch.cat([refs[torch.randperm(40, generator=gen)], refs[:5] + 1])
    first = {}
    for i, h in enumerate(refs.tolist()):
        first.setdefault(h, i)
    assert F.sphashquery(queries, refs).tolist() == [first.get(h, -1) for h in queries.tolist()]
    with pytest.raises(TypeError, match="int64"):
        F.sphashquery(refs.int(), refs)


def test_spdevoxelize_weights_get_no_gradient(gen):
    feats = torch.randn(5, 2, generator=gen, requires_grad=True)
    idx = torch.randint(-1, 5, (7, 8), generator=gen).int()
    weights = torch.rand(7, 8, generator=gen, requires_grad=True)
    out = F.spdevoxelize(feats, idx, weights)
    out.sum().backward()
    assert weights.grad is None and feats.grad is not None
    with pytest.raises(ValueError, match=r"\[N, 8\]"):
        F.spdevoxelize(feats, idx[:, :4], weights[:, :4])
    with pytest.raises(IndexError, match="corner index"):
        F.spdevoxelize(feats, idx + 1, weights)


@pytest.mark.parametrize("dtype,want", [(torch.float16, torch.float32), (torch.float32, torch.float32),
                                        (torch.float64, torch.float64)])
def test_calc_ti_weights_corners_in_float32(dtype, want, gen):
    pts = (torch.rand(20, 3, generator=gen, dtype=torch.float64) * 8).to(dtype)
    idx = torch.randint(-1, 4, (20, 8), generator=gen).int()
    w = F.calc_ti_weights(pts, idx)
    assert w.dtype == want
    low = torch.floor(pts.double())
    for k in range(8):
        bits = torch.tensor([(k >> 2) & 1, (k >> 1) & 1, k & 1], dtype=torch.bool)
        frac = pts.double() - low
        corner = torch.where(bits, frac, 1 - frac).prod(1) * (idx[:, k] != -1)
        total = sum(torch.where(torch.tensor([(j >> 2) & 1, (j >> 1) & 1, j & 1], dtype=torch.bool), frac, 1 - frac)
                    .prod(1) * (idx[:, j] != -1) for j in range(8))
        assert torch.allclose(w[:, k].double(), corner / (total + 1e-8), rtol=1e-6, atol=1e-7)
