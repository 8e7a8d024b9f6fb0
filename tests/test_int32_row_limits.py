"""Row counts past 2^31 - 1 fail fast, before anything is allocated: in kmap_downsample /
kmap_generative (native and torch ops alike), in every op that indexes pairs or tables, and in
the pooling ops' output count (rows are indexed with int32)."""
import resource
import time

import pytest
import torch

from torchsparse_pp import ops
from op_twins import same_error, small_submanifold

BIG = 1 << 31  # one row too many for int32 indices
ROWS_MESSAGE = r"has 2147483648 rows; at most 2\^31 - 1 = 2147483647 are supported \(rows are indexed with int32\)"


@pytest.fixture
def subm(gen):
    return small_submanifold(gen)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_row_counts_past_int32_fail_before_allocating(subm, gen):
    """Expanded views stand for 2^31 rows without memory: a check after a copy would allocate
    32 GiB first. Every refusal comes quickly and leaves the peak memory where it was."""
    kmap, feats, weight = subm
    p = kmap.pairs_sorted_by("out")
    plan = kmap.plan("out", 0, 8)
    table = kmap.out_in
    huge_coords = torch.zeros(1, 4, dtype=torch.int32).expand(BIG, 4)
    huge_feats = torch.zeros(1, 4).expand(BIG, 4)
    grad = torch.randn(kmap.num_out, 5, generator=gen)
    before, started = peak_rss_mib(), time.perf_counter()

    same_error(rf"^coords {ROWS_MESSAGE}$", "kmap_downsample", huge_coords, [2, 2, 2], [2, 2, 2], [1, 1, 1],
               [0, 0, 0], "spconv", None, 128)
    same_error(rf"^coords {ROWS_MESSAGE}$", "kmap_generative", huge_coords, [2, 2, 2], [2, 2, 2], [1, 1, 1],
               [0, 0, 0], None, 128)
    same_error(rf"^num_in {ROWS_MESSAGE}$", "kmap_pairs", table, BIG, kmap.num_out)
    same_error(rf"^the map's source \(num_src\) {ROWS_MESSAGE}$", "kmap_transpose", table, kmap.num_out, BIG, 128)
    cases = {
        "gather_scatter_forward feats": (r"feats", lambda: ops.gather_scatter_forward(
            huge_feats, weight, p.in_idx, p.out_idx, p.offsets, p.identity, kmap.num_out)),
        "gather_scatter_forward num_dst": (r"the destination \(num_dst\)", lambda: ops.gather_scatter_forward(
            feats, weight, p.in_idx, p.out_idx, p.offsets, p.identity, BIG)),
        "gather_scatter_wgrad feats": (r"feats", lambda: ops.gather_scatter_wgrad(
            huge_feats, grad, p.in_idx, p.out_idx, p.offsets, p.identity)),
        "fetch_on_demand_forward num_dst": (r"the destination \(num_dst\)", lambda: ops.fetch_on_demand_forward(
            feats, weight, p.in_idx, p.out_idx, p.offsets, p.identity, BIG, False)),
        "fetch_on_demand_wgrad grad": (r"grad_out", lambda: ops.fetch_on_demand_wgrad(
            feats, torch.zeros(1, 5).expand(BIG, 5), p.in_idx, p.out_idx, p.offsets, p.identity)),
        "implicit_gemm_forward feats": (r"feats", lambda: ops.implicit_gemm_forward(
            huge_feats, weight, table, kmap.num_out, False, *plan, 8)),
        "implicit_gemm_wgrad grad": (r"grad_out", lambda: ops.implicit_gemm_wgrad(
            feats, torch.zeros(1, 5).expand(BIG, 5), table, *plan, 8)),
    }
    for name, (what, call) in cases.items():
        with pytest.raises(RuntimeError, match=rf"^{what} {ROWS_MESSAGE}$"):
            call()
    assert time.perf_counter() - started < 10, "a refusal should not touch 2^31 rows"
    assert peak_rss_mib() - before < 256, "a refusal allocated"


@pytest.mark.parametrize("op", ["pool_pairs_max", "pool_pairs_mean"])
def test_pooling_ops_refuse_more_outputs_than_int32_addresses(op):
    feats = torch.randn(5, 3)
    pairs = torch.randint(0, 5, (7,), dtype=torch.int32)
    with pytest.raises(ValueError, match=r"num_out must be in \[0, 2\^31 - 1\]"):
        getattr(torch.ops.torchsparse_pp, op)(feats, pairs, pairs, 1 << 31)
    with pytest.raises(ValueError, match=r"num_out must be in"):
        getattr(torch.ops.torchsparse_pp, op)(feats, pairs, pairs, -1)
