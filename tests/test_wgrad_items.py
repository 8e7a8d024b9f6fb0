"""The CPU weight gradient on a map big enough that each offset's pairs are split into several
work items, and those items run interleaved across offsets in order of their destination rows:
every dW[k] against a float64 sum over the offset's pairs, and the same bits on 1 and 2 threads
(each item sums into its own partial, and partials are added in a fixed order). Implicit GEMM's
CPU weight gradient sums the same pairs, taken from its table: the same bits as fetch_on_demand's."""
import pytest
import torch

from conftest import lidar_coords
from dataflow_cases import rel_to

OPS = torch.ops.torchsparse_pp


@pytest.fixture(scope="module")
def scan_pairs():
    coords = lidar_coords(5, batch=2, voxel=0.1, box=200, beams=64)
    out_in = OPS.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 8)
    return len(coords), OPS.kmap_pairs(out_in, len(coords), len(coords))


# (48, 40): the register kernel on AVX2 / AVX-512; (128, 128): float tiles on AVX2.
@pytest.mark.parametrize("c_in,c_out", [(48, 40), (128, 128)])
def test_weight_gradient_of_many_items_matches_float64(scan_pairs, generator, c_in, c_out):
    n, (src, dst, offsets, identity) = scan_pairs
    counts = offsets.diff()
    assert int(counts.max()) > 8 * 1024, "the map is too small to split an offset into several items"
    feats = torch.randn(n, c_in, generator=generator)
    grad = torch.randn(n, c_out, generator=generator)
    previous = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(OPS.fetch_on_demand_wgrad(feats, grad, src, dst, offsets, identity, False))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(results[0], results[1]), "the weight gradient depends on the thread count"
    f64, g64 = feats.double(), grad.double()
    for k in range(len(counts)):
        lo, hi = int(offsets[k]), int(offsets[k + 1])
        a, b = f64[src[lo:hi].long()], g64[dst[lo:hi].long()]
        # float32 sums of thousands of pairs: relative to the same sums over absolute values.
        err = rel_to(results[0][k], a.T @ b, a.abs().T @ b.abs())
        assert err < 1e-5, f"offset {k} ({hi - lo} pairs): rel. error {err:.2e}"


@pytest.mark.parametrize("splits", [0, 2])
def test_implicit_gemm_weight_gradient_sums_the_tables_pairs(splits, generator):
    """The table's per-offset rows (in row order) are the submanifold map's pairs, so implicit
    GEMM's weight gradient equals fetch_on_demand's bit for bit, on 1 and 2 threads, whatever
    plan (unsorted, or sorted and split) came with the table."""
    coords = lidar_coords(11, batch=2, voxel=0.1, box=120, beams=32)
    n = len(coords)
    out_in = OPS.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 8)
    src, dst, offsets, identity = OPS.kmap_pairs(out_in, n, n)
    plan = OPS.kmap_plan(out_in, n, splits, 8, 0)
    feats = torch.randn(n, 24, generator=generator)
    grad = torch.randn(n, 40, generator=generator)
    expected = OPS.fetch_on_demand_wgrad(feats, grad, src, dst, offsets, identity, False)
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = OPS.implicit_gemm_wgrad(feats, grad, out_in, *plan, 8, False)
            assert torch.equal(got, expected), f"{threads} threads: {float((got - expected).abs().max()):.3e}"
    finally:
        torch.set_num_threads(previous)
