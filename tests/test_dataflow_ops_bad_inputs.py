"""The fetch_on_demand and implicit_gemm ops are public: inputs that do not belong together
raise a clear error instead of crashing or silently skipping terms."""
import pytest
import torch

from torchsparse_pp import ops
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, submanifold_map
from conftest import random_coords


@pytest.fixture
def subm(gen):
    coords = random_coords(gen, 150, batch=2, low=-3, high=4)
    kmap = submanifold_map(KernelMapCache(), coords, ConvGeometry.make(3, 1, 1, 1), None)
    feats = torch.randn(kmap.num_in, 4, generator=gen)
    weight = torch.randn(27, 4, 5, generator=gen)
    return kmap, feats, weight


def fod(feats, weight, p, num_dst):
    return ops.fetch_on_demand_forward(feats, weight, p.in_idx, p.out_idx, p.offsets, p.identity, num_dst, False)


def first_gathered_pair(p):
    """Position of the first pair of an offset that is not the identity, and its offset."""
    counts = p.offsets.diff()
    k = next(k for k in range(len(counts)) if not bool(p.identity[k]) and int(counts[k]) > 1)
    return int(p.offsets[k]), k


def test_fetch_on_demand_rejects_pairs_not_sorted_by_destination(subm):
    kmap, feats, weight = subm
    p = kmap.pairs_sorted_by("out")
    pos, _ = first_gathered_pair(p)
    swapped = p.out_idx.clone()
    swapped[pos], swapped[pos + 1] = p.out_idx[pos + 1], p.out_idx[pos]
    with pytest.raises(RuntimeError, match="sorted by destination"):
        ops.fetch_on_demand_forward(feats, weight, p.in_idx, swapped, p.offsets, p.identity, kmap.num_out, False)
    fod(feats, weight, p, kmap.num_out)  # the sorted pairs still work


@pytest.mark.parametrize("which, value, message", [
    ("in_idx", 10 ** 6, r"source index is out of range"),
    ("in_idx", -1, r"source index is out of range"),
    ("out_idx", 10 ** 6, r"destination index is out of range"),
])
def test_fetch_on_demand_rejects_out_of_range_indices(subm, which, value, message):
    kmap, feats, weight = subm
    p = kmap.pairs_sorted_by("out")
    pos, _ = first_gathered_pair(p)
    src, dst = p.in_idx.clone(), p.out_idx.clone()
    (src if which == "in_idx" else dst)[pos] = value
    with pytest.raises(RuntimeError, match=message):
        ops.fetch_on_demand_forward(feats, weight, src, dst, p.offsets, p.identity, kmap.num_out, False)
    with pytest.raises(RuntimeError, match=message):
        ops.fetch_on_demand_wgrad(feats, torch.randn(kmap.num_out, 5), src, dst, p.offsets, p.identity)


def test_out_of_range_destinations_that_still_ascend_are_rejected(subm):
    """Ascending destinations are range-checked by each offset's first and last pair: an offset's
    last destination raised to num_dst, or its first lowered to -1, keeps the order and must
    still fail, for every offset (offsets that end where empty ones start included)."""
    kmap, feats, weight = subm
    p = kmap.pairs_sorted_by("out")
    counts = p.offsets.diff()
    for k in (k for k in range(len(counts)) if int(counts[k]) > 0):
        for pos, value in ((int(p.offsets[k + 1]) - 1, kmap.num_out), (int(p.offsets[k]), -1)):
            dst = p.out_idx.clone()
            dst[pos] = value
            for call in (lambda: ops.fetch_on_demand_forward(feats, weight, p.in_idx, dst, p.offsets, p.identity,
                                                             kmap.num_out, False),
                         lambda: ops.fetch_on_demand_wgrad(feats, torch.randn(kmap.num_out, 5), p.in_idx, dst,
                                                           p.offsets, p.identity)):
                with pytest.raises(RuntimeError, match=r"destination index is out of range|identity\[\d+\] is set"):
                    call()


def test_identity_flag_on_an_ordinary_offset_is_rejected(subm):
    kmap, feats, weight = subm
    p = kmap.pairs_sorted_by("out")
    _, k = first_gathered_pair(p)
    identity = p.identity.clone()
    identity[k] = True
    with pytest.raises(RuntimeError, match=rf"identity\[{k}\] is set"):
        ops.fetch_on_demand_forward(feats, weight, p.in_idx, p.out_idx, p.offsets, identity, kmap.num_out, False)


def test_implicit_gemm_rejects_a_table_entry_out_of_range(subm):
    kmap, feats, weight = subm
    plan = kmap.plan("out", 0, 8)
    table = kmap.out_in.clone()
    table[0, 0] = kmap.num_in + 3
    with pytest.raises(RuntimeError, match=r"outside \[-1, "):
        ops.implicit_gemm_forward(feats, weight, table, kmap.num_out, False, *plan, 8)


@pytest.mark.parametrize("split", [0, 2])
def test_implicit_gemm_rejects_a_plan_of_another_map(subm, gen, split):
    """A plan whose tile masks miss offsets its rows have would drop those terms silently."""
    kmap, feats, weight = subm
    bounds, order, masks = kmap.plan("out", split, 8)
    emptied = masks.clone()
    emptied[0, 0] = 0  # the first tile of the first split claims no offsets
    for fn in (lambda m: ops.implicit_gemm_forward(feats, weight, kmap.out_in, kmap.num_out, False,
                                                   bounds, order, m, 8),
               lambda m: ops.implicit_gemm_wgrad(feats, torch.randn(kmap.num_out, 5, generator=gen),
                                                 kmap.out_in, bounds, order, m, 8)):
        with pytest.raises(RuntimeError, match="plan tile masks miss offsets"):
            fn(emptied)
        fn(masks)  # the plan of this map still works


def test_implicit_gemm_rejects_an_order_that_is_not_a_permutation(subm):
    kmap, feats, weight = subm
    bounds, order, masks = kmap.plan("out", 1, 8)
    repeated = order.clone()
    repeated[0, 1] = repeated[0, 0]
    with pytest.raises(RuntimeError, match="permutation of the rows"):
        ops.implicit_gemm_forward(feats, weight, kmap.out_in, kmap.num_out, False, bounds, repeated, masks, 8)


def test_kmap_plan_rejects_more_splits_than_offsets(subm):
    kmap, _, _ = subm
    with pytest.raises(RuntimeError, match=r"split_mask_num must be in \[0, K = 27\]"):
        ops.kmap_plan(kmap.out_in, kmap.num_out, 28, 8)
