"""The CPU implicit-GEMM row groups (ops.implicit_gemm_row_groups): the register kernels'
operands of a plan, built once per map, and the forward that reads them instead of the table.

Oracles: a Python re-derivation of the groups from the table and the plan; the table-reading
forward (ops.implicit_gemm_forward), which must give the same bits; fetch_on_demand over the
map's pairs in float64. Groups that do not belong to the plan raise instead of reading out of range.
"""
import pytest
import torch

from torchsparse_pp import ops
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map, submanifold_map
from torchsparse_pp.nn.functional.dataflows.implicit_gemm import CPU_SORT_WINDOW, CPU_TILE_ROWS
from torchsparse_pp.ops.implicit_gemm import ROW_GROUP_ROWS
from conftest import lidar_coords, random_coords
from dataflow_cases import rel_to
from precision import assert_as_accurate_as_rounded

TILE = CPU_TILE_ROWS


def make_map(gen, kind):
    if kind == "lidar":
        coords = lidar_coords(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen)), batch=2)
        return submanifold_map(KernelMapCache(), coords, ConvGeometry.make(3), None)
    coords = random_coords(gen, 300, batch=2, low=-4, high=5)
    if kind == "strided":
        return strided_map(KernelMapCache(), coords, ConvGeometry.make(2, 2), "spconv", None)
    return submanifold_map(KernelMapCache(), coords, ConvGeometry.make(3), None)


def reference_groups(table, num_rows, bounds, order, tile_rows):
    """(term_begin, term_offsets, term_sources) from the definition: per group of ROW_GROUP_ROWS
    positions of a split, the offsets of the split that one of its rows has, ascending."""
    splits = bounds.numel() - 1
    tiles = -(-num_rows // tile_rows)
    padded = tiles * tile_rows
    per_split = -(-padded // ROW_GROUP_ROWS)
    begin, offsets, sources = [0], [], []
    for s in range(splits):
        b0, b1 = int(bounds[s]), int(bounds[s + 1])
        for g in range(per_split):
            positions = range(g * ROW_GROUP_ROWS, min(padded, (g + 1) * ROW_GROUP_ROWS))
            if order.numel():
                rows = [int(order[s, p]) for p in positions]
            else:
                rows = [p if p < num_rows else -1 for p in positions]
            for k in range(b0, b1):
                srcs = [int(table[r, k]) if r >= 0 else -1 for r in rows]
                if any(v >= 0 for v in srcs):
                    offsets.append(k)
                    sources.append(srcs + [-1] * (ROW_GROUP_ROWS - len(srcs)))
            begin.append(len(offsets))
    return (torch.tensor(begin, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int32),
            torch.tensor(sources, dtype=torch.int32).reshape(-1, ROW_GROUP_ROWS))


@pytest.mark.parametrize("kind", ["subm", "strided", "lidar"])
@pytest.mark.parametrize("splits, window", [(0, 0), (1, 0), (2, 0), (1, CPU_SORT_WINDOW), (3, 64)])
def test_row_groups_follow_the_definition(gen, kind, splits, window):
    kmap = make_map(gen, kind)
    table = kmap.table("out")
    plan = ops.kmap_plan(table, kmap.num_out, splits, TILE, window)
    got = ops.implicit_gemm_row_groups(table, kmap.num_out, *plan, TILE)
    want = reference_groups(table, kmap.num_out, plan[0], plan[1], TILE)
    for g, w, name in zip(got, want, ("term_begin", "term_offsets", "term_sources")):
        assert torch.equal(g, w), name
    # Every pair of the map is one (term, row) slot.
    assert int((got[2] >= 0).sum()) == int((table[:kmap.num_out] >= 0).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("splits", [0, 1, 2])
def test_grouped_forward_equals_the_table_forward_bit_for_bit(gen, dtype, transpose, splits):
    """Same terms in the same order: the same bits as the forward that reads the table; and the
    float64 sums of fetch_on_demand over the map's pairs (an independent kernel)."""
    kmap = make_map(gen, "lidar")
    side = "in" if transpose else "out"
    rows, num_src = (kmap.num_in, kmap.num_out) if transpose else (kmap.num_out, kmap.num_in)
    table = kmap.table(side)
    plan = kmap.plan(side, splits, TILE, CPU_SORT_WINDOW)
    groups = kmap.row_groups(side, splits, TILE, CPU_SORT_WINDOW)
    c_in, c_out = 24, 40
    feats = torch.randn(num_src, c_out if transpose else c_in, generator=gen).to(dtype)
    weight = torch.randn(27, c_in, c_out, generator=gen).to(dtype)
    got = ops.implicit_gemm_forward_grouped(feats, weight, table, rows, transpose, *plan, TILE, *groups)
    want = ops.implicit_gemm_forward(feats, weight, table, rows, transpose, *plan, TILE)
    assert got.dtype == dtype
    assert torch.equal(got, want)
    p = kmap.pairs_sorted_by(side)
    src, dst = (p.out_idx, p.in_idx) if transpose else (p.in_idx, p.out_idx)
    exact, magnitude = (ops.fetch_on_demand_forward(f, w, src, dst, p.offsets, p.identity, rows, transpose)
                        for f, w in ((feats.double(), weight.double()), (feats.double().abs(), weight.double().abs())))
    if dtype == torch.bfloat16:
        assert_as_accurate_as_rounded(got, exact, what="grouped bf16 forward")
    else:  # float32 sums: relative to the same sums over absolute values (float64 is exact here)
        assert rel_to(got, exact, magnitude) < {torch.float32: 1e-5, torch.float64: 1e-12}[dtype]


def test_grouped_forward_with_an_inf_weight_takes_the_table_path(gen):
    """Weights with Inf / NaN run the tile kernels, which read the table (absent neighbours add
    nothing, rather than 0 * Inf)."""
    kmap = make_map(gen, "subm")
    plan = kmap.plan("out", 1, TILE)
    groups = kmap.row_groups("out", 1, TILE)
    feats = torch.randn(kmap.num_in, 4, generator=gen)
    weight = torch.randn(27, 4, 5, generator=gen)
    weight[3, 1, 2] = float("inf")
    got = ops.implicit_gemm_forward_grouped(feats, weight, kmap.out_in, kmap.num_out, False, *plan, TILE, *groups)
    assert torch.equal(got, ops.implicit_gemm_forward(feats, weight, kmap.out_in, kmap.num_out, False, *plan, TILE))
    table = kmap.out_in.clone()
    table[0, 0] = kmap.num_in + 5  # the table path checks the table it reads
    with pytest.raises(RuntimeError, match=r"outside \[-1, "):
        ops.implicit_gemm_forward_grouped(feats, weight, table, kmap.num_out, False, *plan, TILE, *groups)


@pytest.fixture
def grouped(gen):
    kmap = make_map(gen, "subm")
    plan = kmap.plan("out", 2, TILE)
    groups = kmap.row_groups("out", 2, TILE)
    feats = torch.randn(kmap.num_in, 4, generator=gen)
    weight = torch.randn(27, 4, 5, generator=gen)

    def run(begin=None, offsets=None, sources=None, plan_=plan):
        g = (groups[0] if begin is None else begin, groups[1] if offsets is None else offsets,
             groups[2] if sources is None else sources)
        return ops.implicit_gemm_forward_grouped(feats, weight, kmap.out_in, kmap.num_out, False, *plan_, TILE, *g)
    return kmap, groups, run


def first_group_with_terms(begin, least=1):
    return next(g for g in range(begin.numel() - 1) if int(begin[g + 1] - begin[g]) >= least)


@pytest.mark.parametrize("value", [-2, 10 ** 6])
def test_a_source_out_of_range_raises(grouped, value):
    kmap, (begin, offsets, sources), run = grouped
    run()  # the groups of this plan work
    bad = sources.clone()
    bad[int(begin[first_group_with_terms(begin)]), 0] = value if value < 0 else kmap.num_in + value
    with pytest.raises(RuntimeError, match="row groups do not belong"):
        run(sources=bad)


@pytest.mark.parametrize("value", [-1, 27, "other split"])
def test_an_offset_outside_its_split_raises(grouped, value):
    kmap, (begin, offsets, sources), run = grouped
    bounds = kmap.plan("out", 2, TILE)[0]
    bad = offsets.clone()
    t = int(begin[first_group_with_terms(begin)])  # a group of split 0
    bad[t] = int(bounds[1]) if value == "other split" else value
    with pytest.raises(RuntimeError, match="row groups do not belong"):
        run(offsets=bad)


def test_term_counts_that_overrun_raise(grouped):
    kmap, (begin, offsets, sources), run = grouped
    too_many = begin.clone()
    g = first_group_with_terms(begin)
    too_many[g + 1:] += 27  # more terms than split 0 has offsets
    too_many[-1] = begin[-1]
    with pytest.raises(RuntimeError, match="row groups do not belong"):
        run(begin=too_many)
    falling = begin.clone()
    falling[g + 1] = falling[g] - 1
    with pytest.raises(RuntimeError, match="row groups do not belong"):
        run(begin=falling)


def test_groups_of_another_plan_or_of_the_wrong_layout_raise(grouped):
    kmap, (begin, offsets, sources), run = grouped
    with pytest.raises(RuntimeError, match="term_begin must be a contiguous int64 CPU vector of groups"):
        run(plan_=kmap.plan("out", 1, TILE))  # one split: half the groups
    with pytest.raises(RuntimeError, match="term_begin must be"):
        run(begin=begin.int())
    with pytest.raises(RuntimeError, match="term_offsets must be"):
        run(offsets=offsets.long())
    with pytest.raises(RuntimeError, match="term_sources must be"):
        run(sources=sources[:, :4].contiguous())
    with pytest.raises(RuntimeError, match="term_sources must be"):
        run(sources=sources[:-1])


def test_row_groups_reject_a_plan_that_misses_offsets(gen):
    kmap = make_map(gen, "subm")
    bounds, order, masks = kmap.plan("out", 1, TILE)
    emptied = masks.clone()
    emptied[0, 0] = 0
    with pytest.raises(RuntimeError, match="plan tile masks miss offsets"):
        ops.implicit_gemm_row_groups(kmap.out_in, kmap.num_out, bounds, order, emptied, TILE)
    with pytest.raises(RuntimeError, match="the map must be a contiguous int32"):
        ops.implicit_gemm_row_groups(kmap.out_in.long(), kmap.num_out, bounds, order, masks, TILE)


def test_the_map_caches_its_row_groups(gen):
    kmap = make_map(gen, "subm")
    first = kmap.row_groups("out", 1, TILE, CPU_SORT_WINDOW)
    assert kmap.row_groups("out", 1, TILE, CPU_SORT_WINDOW) is first
    assert kmap.row_groups("in", 1, TILE, CPU_SORT_WINDOW) is not first
