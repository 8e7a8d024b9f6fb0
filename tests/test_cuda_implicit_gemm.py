"""CUDA implicit-GEMM ops against a float64 reference computed straight from the table.

Op level: every generated dtype / math path, splits 0-4, channel counts on and off the vector
widths, forward, dgrad (transposed table, W^T) and wgrad; plans from kmap_plan moved to the GPU;
outputs land in memory poisoned with NaN first, so an unwritten row fails. The ops check shapes
only; bad tables and plans are rejected by the validation (backends.validate_plans, or a map's
views when built). Skipped without a GPU.
"""
import pytest
import torch

import torchsparse_pp  # noqa: F401  (registers the ops)
from torchsparse_pp import backends, ops
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map, submanifold_map
from conftest import fresh_seed, lidar_coords, random_coords

pytestmark = [pytest.mark.cuda, pytest.mark.native_cuda]

TILE_ROWS = 64  # the CUDA dataflow's plan tile
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, "tf32": 3e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def poison():
    """Hands NaN-filled memory to the caching allocator, so outputs that a kernel never writes show up."""
    junk = torch.full((64 << 20,), float("nan"), device="cuda")
    del junk


def reference_forward(feats, weight, table, num_dst):
    out = torch.zeros(num_dst, weight.shape[2], dtype=torch.float64)
    for k in range(weight.shape[0]):
        nbr = table[:num_dst, k].long()
        hit = nbr >= 0
        out[hit] += feats[nbr[hit]].double() @ weight[k].double()
    return out


def reference_wgrad(feats, grad, table):
    K = table.shape[1]
    dw = torch.zeros(K, feats.shape[1], grad.shape[1], dtype=torch.float64)
    for k in range(K):
        nbr = table[:grad.shape[0], k].long()
        hit = nbr >= 0
        dw[k] = feats[nbr[hit]].double().T @ grad[hit].double()
    return dw


def relative_error(out, ref, scale):
    """Norm-wise, relative to the same sums over absolute values (``scale``): float32 sums of any
    order stay far under 1e-5 of it, fp16 / bf16 results of exact operands round once."""
    out = out.double().cpu()
    assert torch.isfinite(out).all(), "non-finite values: a row was not written"
    return float((out - ref).norm() / scale.norm().clamp_min(1e-30))


def cuda_plan(table, rows, splits):
    """The plan kmap_plan builds on the CPU (global sort, 64-row tiles), moved to the GPU."""
    bounds, order, masks = ops.kmap_plan(table, rows, splits, TILE_ROWS, 0)
    return bounds.cuda(), order.cuda(), masks.cuda()


def maps(gen):
    lidar = lidar_coords(fresh_seed(), batch=2, voxel=0.2, box=16)
    rnd = random_coords(gen, 600, batch=2, low=-5, high=6)
    out = {
        "subm3_lidar": submanifold_map(KernelMapCache(), lidar, ConvGeometry.make(3, 1, 1, 1), None),
        "subm3_random": submanifold_map(KernelMapCache(), rnd, ConvGeometry.make(3, 1, 1, 1), None),
        "subm5_random": submanifold_map(KernelMapCache(), rnd, ConvGeometry.make(5, 1, 1, 2), None),
        "k2s2_lidar": strided_map(KernelMapCache(), lidar, ConvGeometry.make(2, 2, 1, 0), "spconv", None),
        "k3s2_random": strided_map(KernelMapCache(), rnd, ConvGeometry.make(3, 2, 1, 1), "spconv", None),
    }
    return out


@pytest.fixture(scope="module")
def kmaps():
    return maps(torch.Generator().manual_seed(fresh_seed()))


def dtype_cases():
    return [(torch.float16, False), (torch.bfloat16, False), (torch.float32, False), (torch.float32, True),
            (torch.float64, False)]


@pytest.mark.parametrize("dtype, tf32", dtype_cases(), ids=["f16", "bf16", "f32", "tf32", "f64"])
@pytest.mark.parametrize("name", ["subm3_lidar", "subm3_random", "subm5_random", "k2s2_lidar", "k3s2_random"])
@pytest.mark.parametrize("splits", [0, 1, 2, 4])
@pytest.mark.parametrize("c_in, c_out", [(3, 5), (16, 32), (37, 13), (64, 64), (96, 128)])
def test_forward_dgrad_wgrad_match_float64(kmaps, dtype, tf32, name, splits, c_in, c_out):
    kmap = kmaps[name]
    K = kmap.out_in.shape[1]
    splits = min(splits, K)
    gen = torch.Generator().manual_seed(fresh_seed())
    feats = torch.randn(kmap.num_in, c_in, generator=gen).to(dtype)
    weight = (torch.randn(K, c_in, c_out, generator=gen) / (K * c_in) ** 0.5).to(dtype)
    grad = torch.randn(kmap.num_out, c_out, generator=gen).to(dtype)
    tol = TOLERANCE["tf32" if tf32 else dtype]
    out_in, in_out = kmap.out_in, kmap.in_out

    poison()
    out = ops.implicit_gemm_forward(feats.cuda(), weight.cuda(), out_in.cuda(), kmap.num_out, False,
                                    *cuda_plan(out_in, kmap.num_out, splits), TILE_ROWS, tf32)
    assert out.shape == (kmap.num_out, c_out) and out.dtype == dtype
    assert relative_error(out, reference_forward(feats, weight, out_in, kmap.num_out),
                          reference_forward(feats.abs(), weight.abs(), out_in, kmap.num_out)) < tol

    poison()
    dgrad = ops.implicit_gemm_forward(grad.cuda(), weight.cuda(), in_out.cuda(), kmap.num_in, True,
                                      *cuda_plan(in_out, kmap.num_in, splits), TILE_ROWS, tf32)
    ref = reference_forward(grad, weight.transpose(1, 2), in_out, kmap.num_in)
    scale = reference_forward(grad.abs(), weight.abs().transpose(1, 2), in_out, kmap.num_in)
    assert dgrad.shape == (kmap.num_in, c_in) and relative_error(dgrad, ref, scale) < tol

    poison()
    dw = ops.implicit_gemm_wgrad(feats.cuda(), grad.cuda(), out_in.cuda(), *cuda_plan(out_in, kmap.num_out, splits),
                                 TILE_ROWS, tf32)
    assert dw.shape == (K, c_in, c_out) and relative_error(dw, reference_wgrad(feats, grad, out_in),
                                                           reference_wgrad(feats.abs(), grad.abs(), out_in)) < tol


def test_split_results_agree_and_are_deterministic(kmaps):
    kmap = kmaps["subm3_lidar"]
    gen = torch.Generator().manual_seed(fresh_seed())
    feats = torch.randn(kmap.num_in, 32, generator=gen).cuda()
    weight = torch.randn(27, 32, 48, generator=gen).cuda()
    table = kmap.out_in
    runs = [ops.implicit_gemm_forward(feats, weight, table.cuda(), kmap.num_out, False,
                                      *cuda_plan(table, kmap.num_out, s), TILE_ROWS, False) for s in (0, 1, 2, 3)]
    for other in runs[1:]:
        torch.testing.assert_close(other, runs[0], rtol=1e-5, atol=1e-5)
    again = ops.implicit_gemm_forward(feats, weight, table.cuda(), kmap.num_out, False,
                                      *cuda_plan(table, kmap.num_out, 2), TILE_ROWS, False)
    assert torch.equal(again, runs[2])


@pytest.fixture
def validating():
    saved = backends.validate_plans
    backends.validate_plans = True
    try:
        yield
    finally:
        backends.validate_plans = saved


def test_plan_of_another_map_is_rejected(kmaps, validating):
    a, b = kmaps["subm3_lidar"], kmaps["subm3_random"]
    feats = torch.randn(a.num_in, 8, device="cuda")
    weight = torch.randn(27, 8, 8, device="cuda")
    with pytest.raises(RuntimeError, match="does not cover the map|tile_masks must be"):
        ops.implicit_gemm_forward(feats, weight, a.out_in.cuda(), a.num_out, False,
                                  *cuda_plan(b.out_in[:a.out_in.shape[0]], min(b.num_out, a.num_out), 1), TILE_ROWS)


def test_out_of_range_table_entry_is_rejected(kmaps, validating):
    kmap = kmaps["subm3_random"]
    table = kmap.out_in.clone()
    table[0, 0] = kmap.num_in + 5
    feats = torch.randn(kmap.num_in, 8, device="cuda")
    weight = torch.randn(27, 8, 8, device="cuda")
    bounds = torch.tensor([0, 27], device="cuda")
    tiles = (kmap.num_out + TILE_ROWS - 1) // TILE_ROWS
    masks = torch.full((1, tiles, 1), (1 << 27) - 1, dtype=torch.long, device="cuda")
    order = torch.empty(0, tiles * TILE_ROWS, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="entries outside"):
        ops.implicit_gemm_forward(feats, weight, table.cuda(), kmap.num_out, False, bounds, order, masks, TILE_ROWS)


def test_order_listing_a_row_twice_is_rejected(kmaps, validating):
    kmap = kmaps["subm3_random"]
    bounds, order, masks = cuda_plan(kmap.out_in, kmap.num_out, 1)
    order = order.clone()
    order[0, 1] = order[0, 0]
    feats = torch.randn(kmap.num_in, 8, device="cuda")
    weight = torch.randn(27, 8, 8, device="cuda")
    with pytest.raises(RuntimeError, match="every row once"):
        ops.implicit_gemm_forward(feats, weight, kmap.out_in.cuda(), kmap.num_out, False, bounds, order, masks,
                                  TILE_ROWS)


@pytest.mark.parametrize("splits", [0, 1, 3])
def test_343_offsets_walk_several_mask_words(splits):
    """A 7^3 kernel: one split holds up to 343 offsets, six 64-bit mask words per tile, which the
    forward kernel lists one word at a time."""
    gen = torch.Generator().manual_seed(fresh_seed())
    coords = random_coords(gen, 1500, batch=1, low=-6, high=7)
    kmap = submanifold_map(KernelMapCache(), coords, ConvGeometry.make(7, 1, 1, 3), None)
    K = kmap.out_in.shape[1]
    assert K == 343
    feats = torch.randn(kmap.num_in, 16, generator=gen)
    weight = torch.randn(K, 16, 24, generator=gen) / (K * 16) ** 0.5
    grad = torch.randn(kmap.num_out, 24, generator=gen)
    poison()
    out = ops.implicit_gemm_forward(feats.cuda(), weight.cuda(), kmap.out_in.cuda(), kmap.num_out, False,
                                    *cuda_plan(kmap.out_in, kmap.num_out, splits), TILE_ROWS)
    assert relative_error(out, reference_forward(feats, weight, kmap.out_in, kmap.num_out),
                          reference_forward(feats.abs(), weight.abs(), kmap.out_in, kmap.num_out)) < 1e-5
    dw = ops.implicit_gemm_wgrad(feats.cuda(), grad.cuda(), kmap.out_in.cuda(),
                                 *cuda_plan(kmap.out_in, kmap.num_out, splits), TILE_ROWS)
    assert relative_error(dw, reference_wgrad(feats, grad, kmap.out_in),
                          reference_wgrad(feats.abs(), grad.abs(), kmap.out_in)) < 1e-5


def test_more_than_2_31_feature_elements():
    """Row offsets are 64-bit: a [2^31 / 64 + 65536, 64] float16 input works (sampled rows checked)."""
    torch.cuda.empty_cache()
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2 ** 30:
        pytest.skip("needs a GPU with 24 GiB")
    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    rows, channels, K = 2 ** 31 // 64 + 65536, 64, 3
    feats = torch.randn(rows, channels, generator=gen, device="cuda", dtype=torch.float16)
    weight = (torch.randn(K, channels, channels, generator=gen, device="cuda") / 8).half()
    # Neighbours: row r reads r, r - 1 and a far row, each present with probability 3/4.
    r = torch.arange(rows, device="cuda")
    table = torch.stack([r, r - 1, (r * 7919 + 12345) % rows], 1)
    table[torch.rand(rows, K, generator=gen, device="cuda") < 0.25] = -1
    table[0, 1] = -1
    padded = (rows + 127) // 128 * 128
    table = torch.cat([table, table.new_full((padded - rows, K), -1)]).int()
    tiles = (rows + TILE_ROWS - 1) // TILE_ROWS
    masks = torch.full((1, tiles, 1), (1 << K) - 1, dtype=torch.long, device="cuda")
    bounds = torch.tensor([0, K], device="cuda")
    order = torch.empty(0, tiles * TILE_ROWS, dtype=torch.int32, device="cuda")
    out = ops.implicit_gemm_forward(feats, weight, table, rows, False, bounds, order, masks, TILE_ROWS)
    sample = torch.cat([torch.randint(0, rows, (2000,), generator=gen, device="cuda"),
                        torch.arange(rows - 200, rows, device="cuda")])
    ref = torch.zeros(len(sample), channels, dtype=torch.float64, device="cuda")
    scale = torch.zeros_like(ref)  # the same sums over absolute values (relative_error)
    for k in range(K):
        nbr = table[sample, k].long()
        hit = nbr >= 0
        ref[hit] += feats[nbr[hit]].double() @ weight[k].double()
        scale[hit] += feats[nbr[hit]].double().abs() @ weight[k].double().abs()
    err = float((out[sample].double() - ref).norm() / scale.norm())
    assert err < 1e-2
