"""Host counts of the weight-stationary view and the validation of pair lists, tables and plans.

The GPU kernels check no index per call: a KernelMap validates each view once, on its device,
when it builds it (torchsparse_pp.ops.validate), and ``backends.validate_plans = True`` makes the
op wrappers validate every call. The validation is plain torch ops, so it runs here on CPU
tensors exactly as on a GPU: good maps from both map builders pass, every kind of bad input
raises its message, the switch adds per-call validation to the ops, and a map validates each view
once when built on a device that calls for it (simulated on the CPU by patching that decision).
"""
import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import backends, ops
from torchsparse_pp.kmap import (OUT_IN_ROW_PADDING, ConvGeometry, KernelMapCache, generative_map, kernel_map,
                                 strided_map, submanifold_map)
from torchsparse_pp.nn.functional import ConvConfig, conv3d
from torchsparse_pp.nn.functional import config as config_module
from torchsparse_pp.ops.validate import validate_pairs, validate_plan, validate_table
from conftest import lidar_coords, random_coords, shuffled_coords

PLANS = [(0, 8, 0), (1, 64, 0), (2, 64, 0), (3, 16, 0), (2, 128, 100), (4, 8, 7)]
KMAP_BACKENDS = ("native", "torch")


def sparse_input(gen, channels=4):
    """A random input whose features need a gradient (so backward runs dgrad too)."""
    coords = random_coords(gen, 300, batch=2, low=-4, high=5)
    return tsp.SparseTensor(torch.randn(len(coords), channels, generator=gen).requires_grad_(True), coords)


@pytest.fixture
def switches():
    saved = (backends.kmap_backend, backends.validate_plans)
    yield
    backends.kmap_backend, backends.validate_plans = saved


def maps(gen, kmap_backend):
    """Submanifold, strided (spconv, minkowski) and generative maps of random and LiDAR-like sets."""
    backends.kmap_backend = kmap_backend
    rnd = random_coords(gen, 500, batch=2, low=-5, high=6)
    lidar = lidar_coords(int(torch.randint(0, 10 ** 6, (1,), generator=gen)), batch=2, voxel=0.2, box=12)
    return {
        "subm3": submanifold_map(KernelMapCache(), rnd, ConvGeometry.make(3), None),
        "subm5_d2_lidar": submanifold_map(KernelMapCache(), lidar, ConvGeometry.make(5, dilation=2), None),
        "k2s2": strided_map(KernelMapCache(), lidar, ConvGeometry.make(2, stride=2), "spconv", None),
        "k3s2_minkowski": strided_map(KernelMapCache(), rnd, ConvGeometry.make(3, stride=2, padding=1), "minkowski",
                                      None),
        "generative_k3s2": generative_map(KernelMapCache(), rnd, ConvGeometry.make(3, stride=2, padding=1), None),
    }


# --------------------------------------------------------------------------------------------
# Good maps pass; the host copies equal the device view
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kmap_backend", KMAP_BACKENDS)
def test_views_of_real_maps_validate(kmap_backend, gen, switches):
    for name, kmap in maps(gen, kmap_backend).items():
        for side, sorted_by in (("out", "dst"), ("in", "src")):
            p = kmap.pairs_sorted_by(side)
            # CPU maps keep the view's own tensors as the host copies.
            assert p.host_offsets is p.offsets and p.host_identity is p.identity, name
            assert p.counts == p.offsets.diff().tolist()
            host_offsets, host_identity = validate_pairs(p.in_idx, p.out_idx, p.offsets, p.identity, kmap.num_in,
                                                         kmap.num_out, sorted_by=sorted_by, unique_src=True)
            assert host_offsets.device.type == host_identity.device.type == "cpu"
            assert torch.equal(host_offsets, p.offsets) and torch.equal(host_identity, p.identity), name
            # The transposed direction: sources and destinations swapped.
            validate_pairs(p.out_idx, p.in_idx, p.offsets, p.identity, kmap.num_out, kmap.num_in, unique_src=True)
        for side, rows, sources in (("out", kmap.num_out, kmap.num_in), ("in", kmap.num_in, kmap.num_out)):
            validate_table(kmap.table(side), rows, sources)
            for split, tile_rows, window in PLANS:
                split = min(split, kmap.geometry.volume)
                validate_plan(kmap.table(side), rows, sources, *kmap.plan(side, split, tile_rows, window), tile_rows)


@pytest.mark.parametrize("kmap_backend", KMAP_BACKENDS)
def test_symmetric_maps_mirror_their_input_sorted_pairs(kmap_backend, gen, switches):
    """A centred submanifold map's transposed table is its own with the offsets reversed, and its
    pairs sorted by input come from its output-sorted ones (offset k's = offset K-1-k's, roles
    swapped): the same tensors kmap_transpose and kmap_pairs make. Maps that are not symmetric
    (strided, or an off-centre or even kernel) still build them with those ops."""
    built = maps(gen, kmap_backend)
    coords = built["subm3"].in_coords
    built["subm3_offcentre"] = submanifold_map(KernelMapCache(), coords, ConvGeometry.make(3, padding=(1, 0, 1)), None)
    built["subm2"] = submanifold_map(KernelMapCache(), coords, ConvGeometry.make(2), None)
    for name, kmap in built.items():
        assert kmap.symmetric == (name in ("subm3", "subm5_d2_lidar")), name
        mirrored = kmap.pairs_sorted_by("in")
        transposed = kmap._ops.kmap_transpose(kmap.out_in, kmap.num_out, kmap.num_in, OUT_IN_ROW_PADDING)
        assert torch.equal(kmap.in_out, transposed), name
        outs, ins, offsets, identity = kmap._ops.kmap_pairs(transposed, kmap.num_out, kmap.num_in)
        for got, want in ((mirrored.in_idx, ins), (mirrored.out_idx, outs), (mirrored.offsets, offsets),
                          (mirrored.identity, identity)):
            assert torch.equal(got, want), name
        assert mirrored.offsets[-1] > 0, name


@pytest.mark.parametrize("kmap_backend", KMAP_BACKENDS)
def test_strided_maps_over_sorted_coords_reuse_their_output_sorted_pairs(kmap_backend, gen, switches):
    """A k2 s2 map over coordinates sorted by (batch, x, y, z): at a fixed offset the input
    2 o + d grows with the output o, so the output-sorted pairs are sorted by input too and the
    input-sorted view is the same tensors. Shuffled rows break that order: the view is then
    built by kmap_transpose + kmap_pairs. Both equal what those ops make."""
    backends.kmap_backend = kmap_backend
    lidar = lidar_coords(int(torch.randint(0, 10 ** 6, (1,), generator=gen)), batch=2, voxel=0.2, box=12)
    ordered = torch.unique(lidar, dim=0)
    shuffled = ordered[torch.randperm(len(ordered), generator=gen)]
    for name, coords, reused in (("sorted", ordered, True), ("shuffled", shuffled, False)):
        kmap = strided_map(KernelMapCache(), coords, ConvGeometry.make(2, stride=2), "spconv", None)
        by_out, by_in = kmap.pairs_sorted_by("out"), kmap.pairs_sorted_by("in")
        assert (by_in.in_idx.data_ptr() == by_out.in_idx.data_ptr()) == reused, name
        outs, ins, offsets, identity = kmap._ops.kmap_pairs(
            kmap._ops.kmap_transpose(kmap.out_in, kmap.num_out, kmap.num_in, OUT_IN_ROW_PADDING),
            kmap.num_out, kmap.num_in)
        for got, want in ((by_in.in_idx, ins), (by_in.out_idx, outs), (by_in.offsets, offsets),
                          (by_in.identity, identity)):
            assert torch.equal(got, want), name
        assert by_in.offsets[-1] == len(coords), name


def test_empty_maps_validate():
    table = torch.full((128, 27), -1, dtype=torch.int32)
    ins, outs, offsets, identity = ops.kmap_pairs(table, 0, 0)
    assert ins.numel() == 0 and outs.numel() == 0 and offsets.tolist() == [0] * 28
    validate_pairs(ins, outs, offsets, identity, 0, 0, sorted_by="dst", unique_src=True)
    validate_plan(table, 0, 0, *ops.kmap_plan(table, 0, 2, 64, 0), 64)


# --------------------------------------------------------------------------------------------
# Bad pairs
# --------------------------------------------------------------------------------------------
@pytest.fixture
def subm_pairs(gen):
    kmap = submanifold_map(KernelMapCache(), random_coords(gen, 300, batch=2, low=-4, high=5), ConvGeometry.make(3),
                           None)
    p = kmap.pairs_sorted_by("out")
    return kmap, [t.clone() for t in (p.in_idx, p.out_idx, p.offsets, p.identity)]


def ordinary_offset(offsets, identity):
    """An offset that is not the identity and has at least 3 pairs: (its first pair, k)."""
    counts = offsets.diff()
    k = next(k for k in range(len(counts)) if not identity[k] and counts[k] > 2)
    return int(offsets[k]), k


def centre_offset(identity):
    return int(identity.nonzero()[0])


def corrupt(case, kmap, pairs):
    """The pairs with one defect; (pairs, validate_pairs keyword arguments, message pattern)."""
    src, dst, offsets, identity = pairs
    pos, k = ordinary_offset(offsets, identity)
    centre = centre_offset(identity)
    kwargs = {}
    if case == "src_high":
        src[pos] = kmap.num_in
        pattern = r"a source index is out of range \[0, "
    elif case == "src_negative":
        src[pos] = -1
        pattern = r"a source index is out of range"
    elif case == "dst_high":
        dst[pos] = kmap.num_out + 3
        pattern = r"a destination index is out of range \[0, "
    elif case == "offsets_start":
        offsets[0] = 1
        pattern = r"offsets must start at 0 and end at the number of pairs"
    elif case == "offsets_end":
        offsets[-1] -= 1
        pattern = r"end at the number of pairs"
    elif case == "offsets_decrease":
        offsets[k + 1] = offsets[k] - 1
        pattern = rf"offsets must be non-decreasing, got offsets\[{k}\]"
    elif case == "identity_flag_on_ordinary_offset":
        identity[k] = True
        pattern = rf"identity\[{k}\] is set but offset {k} does not pair all"
    elif case == "identity_offset_permuted":
        start = int(offsets[centre])
        src[start], src[start + 1] = src[start + 1].clone(), src[start].clone()
        pattern = rf"identity\[{centre}\] is set but offset {centre} does not map every row j to row j"
    elif case == "repeated_destination":
        dst[pos + 1] = dst[pos]
        pattern = rf"offset {k} pairs some destination row more than once"
    elif case == "unsorted_destination":
        dst[pos], dst[pos + 1] = dst[pos + 1].clone(), dst[pos].clone()
        kwargs = dict(sorted_by="dst")
        pattern = rf"the pairs of offset {k} are not sorted by destination"
    elif case == "repeated_source":
        src[pos + 1] = src[pos]
        kwargs = dict(unique_src=True)
        pattern = rf"offset {k} pairs some source row more than once"
    elif case == "unsorted_source":
        src[pos], src[pos + 1] = src[pos + 1].clone(), src[pos].clone()
        kwargs = dict(sorted_by="src")
        pattern = rf"the pairs of offset {k} are not sorted by source"
    else:
        raise AssertionError(case)
    return (src, dst, offsets, identity), kwargs, pattern


PAIR_DEFECTS = ["src_high", "src_negative", "dst_high", "offsets_start", "offsets_end", "offsets_decrease",
                "identity_flag_on_ordinary_offset", "identity_offset_permuted", "repeated_destination",
                "unsorted_destination", "repeated_source", "unsorted_source"]


@pytest.mark.parametrize("case", PAIR_DEFECTS)
def test_bad_pairs_are_rejected(case, subm_pairs):
    kmap, pairs = subm_pairs
    bad, kwargs, pattern = corrupt(case, kmap, pairs)
    with pytest.raises(RuntimeError, match=pattern):
        validate_pairs(*bad, kmap.num_in, kmap.num_out, **kwargs)


def test_only_the_requested_side_must_ascend(gen):
    """Pairs sorted by destination are valid without sorted sources, and fail the source order
    where an offset's sources descend (rows in shuffled order make them descend)."""
    kmap = submanifold_map(KernelMapCache(), shuffled_coords(gen), ConvGeometry.make(3), None)
    p = kmap.pairs_sorted_by("out")
    src, dst, offsets, identity = p.in_idx, p.out_idx, p.offsets, p.identity
    validate_pairs(src, dst, offsets, identity, kmap.num_in, kmap.num_out, sorted_by="dst")
    descending = [k for k in range(len(identity)) if bool((src[offsets[k]:offsets[k + 1]].diff() < 0).any())]
    assert descending, "shuffled rows leave some offset's sources out of order"
    with pytest.raises(RuntimeError, match=f"the pairs of offset {descending[0]} are not sorted by source"):
        validate_pairs(src, dst, offsets, identity, kmap.num_in, kmap.num_out, sorted_by="src")


@pytest.mark.parametrize("case, pattern", [
    ("int64_indices", "two int32 vectors of equal length"),
    ("short_offsets", r"offsets must be an int64 vector of length K \+ 1"),
    ("float_identity", "identity must be a bool vector"),
    ("negative_num_dst", "num_dst must be >= 0"),
])
def test_malformed_pairs_are_rejected(case, pattern, subm_pairs):
    kmap, (src, dst, offsets, identity) = subm_pairs
    num_dst = kmap.num_out
    if case == "int64_indices":
        src = src.long()
    elif case == "short_offsets":
        offsets = offsets[:-1]
    elif case == "float_identity":
        identity = identity.float()
    else:
        num_dst = -1
    with pytest.raises(RuntimeError, match=pattern):
        validate_pairs(src, dst, offsets, identity, kmap.num_in, num_dst)


# --------------------------------------------------------------------------------------------
# Bad tables and plans
# --------------------------------------------------------------------------------------------
@pytest.fixture
def two_maps(gen):
    a = submanifold_map(KernelMapCache(), random_coords(gen, 400, batch=2, low=-4, high=5), ConvGeometry.make(3), None)
    b = submanifold_map(KernelMapCache(), random_coords(gen, 400, batch=2, low=-4, high=5), ConvGeometry.make(3), None)
    return a, b


def plan_of(kmap, split, tile_rows=64):
    return [t.clone() for t in kmap.plan("out", split, tile_rows, 0)]


def test_table_entries_out_of_range_are_rejected(two_maps):
    kmap, _ = two_maps
    table = kmap.out_in.clone()
    table[3, 5] = kmap.num_in
    table[7, 0] = -2
    with pytest.raises(RuntimeError, match=rf"the map has 2 entries outside \[-1, {kmap.num_in}\)"):
        validate_table(table, kmap.num_out, kmap.num_in)
    with pytest.raises(RuntimeError, match=r"the map has 2 entries outside"):
        validate_plan(table, kmap.num_out, kmap.num_in, *plan_of(kmap, 1), 64)
    # Padding rows past num_rows are not the map's: anything there is ignored.
    padded = kmap.out_in.clone()
    padded[kmap.num_out:] = 10 ** 6
    validate_table(padded, kmap.num_out, kmap.num_in)


def test_plan_of_another_map_is_rejected(two_maps):
    a, b = two_maps
    rows = min(a.num_out, b.num_out)
    bounds, order, masks = ops.kmap_plan(b.out_in, rows, 1, 64, 0)
    with pytest.raises(RuntimeError, match=r"the plan does not cover the map: \d+ neighbours"):
        validate_plan(a.out_in, rows, a.num_in, bounds, order, masks, 64)


def test_mask_missing_one_bit_is_rejected(two_maps):
    kmap, _ = two_maps
    bounds, order, masks = plan_of(kmap, 2)
    split, tile = 1, 0
    bit = int(bounds[1])  # the first offset of split 1 ...
    rows = order[split, :64].long()
    rows = rows[rows >= 0]
    k = next(k for k in range(int(bounds[1]), int(bounds[2])) if bool((kmap.out_in[rows, k] >= 0).any()))
    masks[split, tile, 0] &= ~(1 << (k - bit))  # ... drop one present offset from one tile's mask
    with pytest.raises(RuntimeError, match="does not cover the map"):
        validate_plan(kmap.out_in, kmap.num_out, kmap.num_in, bounds, order, masks, 64)


@pytest.mark.parametrize("case, pattern", [
    ("row_twice", r"must list every row once per split; 2 \(split, row\) do not"),
    ("row_out_of_range", r"the plan's order has 1 entries outside \[-1, "),
    ("bounds_short", r"bounds must increase from 0 to K = 27"),
    ("bounds_flat", r"bounds must increase from 0 to K = 27"),
    ("masks_shape", r"tile_masks must be int64 \[splits = 2, tiles = \d+, words\]"),
    ("order_shape", r"order must be int32 \[splits = 2, \d+\]"),
    ("tile_rows", r"tile_rows must be >= 1"),
])
def test_bad_plans_are_rejected(case, pattern, two_maps):
    kmap, _ = two_maps
    bounds, order, masks = plan_of(kmap, 2)
    tile_rows = 64
    if case == "row_twice":
        order[1, 1] = order[1, 0]  # one row listed twice, another not at all
    elif case == "row_out_of_range":
        order[0, 0] = kmap.num_out
    elif case == "bounds_short":
        bounds[-1] = 26
    elif case == "bounds_flat":
        bounds[1] = 0
    elif case == "masks_shape":
        masks = masks[:, :-1]
    elif case == "order_shape":
        order = order[:, :-1]
    else:
        tile_rows = 0
    with pytest.raises(RuntimeError, match=pattern):
        validate_plan(kmap.out_in, kmap.num_out, kmap.num_in, bounds, order, masks, tile_rows)


def test_too_few_mask_words_are_rejected():
    """A 7^3 kernel in one split needs 6 words per tile; 5 would leave offsets unchecked."""
    table = torch.full((128, 343), -1, dtype=torch.int32)
    table[:3, 300] = 0
    bounds, order, masks = ops.kmap_plan(table, 3, 1, 64, 0)
    validate_plan(table, 3, 1, bounds, order, masks, 64)
    with pytest.raises(RuntimeError, match="too few for the widest split"):
        validate_plan(table, 3, 1, bounds, order, masks[:, :, :5].contiguous(), 64)


# --------------------------------------------------------------------------------------------
# backends.validate_plans: per-call validation in the op wrappers
# --------------------------------------------------------------------------------------------
def test_validate_plans_is_a_bool(switches):
    assert backends.validate_plans is False
    with pytest.raises(TypeError, match="validate_plans must be a bool"):
        backends.validate_plans = 1
    backends.validate_plans = True
    assert backends.validate_plans is True


def test_validate_plans_checks_every_op_call(subm_pairs, gen, switches, monkeypatch):
    """A destination repeated within an offset fails the CPU ops' own check_pairs (a parallel
    scatter would race on it) and the validation, which the switch adds to every
    wrapper call before the op runs."""
    kmap, pairs = subm_pairs
    (src, dst, offsets, identity), _, pattern = corrupt("repeated_destination", kmap, pairs)
    feats = torch.randn(kmap.num_in, 4, generator=gen)
    weight = torch.randn(27, 4, 3, generator=gen)
    grad = torch.randn(kmap.num_out, 3, generator=gen)
    calls = {
        "gather_scatter_forward": lambda: ops.gather_scatter_forward(feats, weight, src, dst, offsets, identity,
                                                                     kmap.num_out),
        "gather_scatter_wgrad": lambda: ops.gather_scatter_wgrad(feats, grad, src, dst, offsets, identity),
        "fetch_on_demand_wgrad": lambda: ops.fetch_on_demand_wgrad(feats, grad, src, dst, offsets, identity),
    }
    validated = []
    for module in (ops.gather_scatter, ops.fetch_on_demand):
        real = module.validate_pairs
        monkeypatch.setattr(module, "validate_pairs",
                            lambda *a, real=real, **k: validated.append(1) or real(*a, **k))
    for switch in (False, True):
        backends.validate_plans = switch
        for name, call in calls.items():
            with pytest.raises(RuntimeError, match=pattern):
                call()
        assert len(validated) == (len(calls) if switch else 0)


def test_validate_plans_checks_implicit_gemm_calls(two_maps, gen, switches):
    kmap, _ = two_maps
    table = kmap.out_in.clone()
    table[0, 0] = kmap.num_in + 1
    plan = plan_of(kmap, 1)
    feats = torch.randn(kmap.num_in, 4, generator=gen)
    weight = torch.randn(27, 4, 3, generator=gen)
    grad = torch.randn(kmap.num_out, 3, generator=gen)
    backends.validate_plans = False  # the CPU op finds it with its own message
    with pytest.raises(RuntimeError, match="the map holds a row index outside"):
        ops.implicit_gemm_forward(feats, weight, table, kmap.num_out, False, *plan, 64)
    backends.validate_plans = True  # the validation runs first
    with pytest.raises(RuntimeError, match=r"the map has 1 entries outside"):
        ops.implicit_gemm_forward(feats, weight, table, kmap.num_out, False, *plan, 64)
    with pytest.raises(RuntimeError, match=r"the map has 1 entries outside"):
        ops.implicit_gemm_wgrad(feats, grad, table, *plan, 64)


def test_validate_plans_checks_fetch_on_demand_order(subm_pairs, gen, switches):
    kmap, pairs = subm_pairs
    (src, dst, offsets, identity), _, _ = corrupt("unsorted_destination", kmap, pairs)
    feats = torch.randn(kmap.num_in, 4, generator=gen)
    weight = torch.randn(27, 4, 3, generator=gen)
    backends.validate_plans = True
    with pytest.raises(RuntimeError, match="not sorted by destination"):
        ops.fetch_on_demand_forward(feats, weight, src, dst, offsets, identity, kmap.num_out)


def test_validate_plans_leaves_valid_convs_unchanged(gen, switches):
    """On a valid map the checks raise nothing and change no result: forward, dgrad and wgrad are
    bit-identical with and without validate_plans, for every dataflow."""
    x = sparse_input(gen)
    weight = torch.randn(27, 4, 5, generator=gen)
    grad = torch.randn(len(x.C), 5, generator=gen)
    for dataflow in ("gather_scatter", "fetch_on_demand", "implicit_gemm"):
        results = []
        for validate in (False, True):
            backends.validate_plans = validate
            feats = x.F.detach().clone().requires_grad_(True)
            w = weight.clone().requires_grad_(True)
            y = conv3d(tsp.SparseTensor(feats, x.C.clone()), w, 3, config=ConvConfig(dataflow))
            y.F.backward(grad)
            results.append((y.F.detach(), feats.grad, w.grad))
        for what, plain, checked in zip(("forward", "dgrad", "wgrad"), *results):
            assert torch.equal(plain, checked), f"{dataflow} {what} changed under validate_plans"


def test_fetch_on_demand_cpu_flags_change_nothing(subm_pairs, gen):
    """deterministic / allow_tf32 choose among CUDA kernels; the CPU kernels are already both."""
    kmap, (src, dst, offsets, identity) = subm_pairs
    feats = torch.randn(kmap.num_in, 6, generator=gen)
    weight = torch.randn(27, 6, 5, generator=gen)
    grad = torch.randn(kmap.num_out, 5, generator=gen)
    base = ops.fetch_on_demand_forward(feats, weight, src, dst, offsets, identity, kmap.num_out)
    flagged = ops.fetch_on_demand_forward(feats, weight, src, dst, offsets, identity, kmap.num_out, False, True, True)
    assert torch.equal(base, flagged)
    assert torch.equal(ops.fetch_on_demand_wgrad(feats, grad, src, dst, offsets, identity),
                       ops.fetch_on_demand_wgrad(feats, grad, src, dst, offsets, identity, True))


# --------------------------------------------------------------------------------------------
# A map validates each view once, when built (on GPUs; simulated here)
# --------------------------------------------------------------------------------------------
@pytest.fixture
def counting_validation(monkeypatch):
    """Views of CPU maps validated as on a GPU, counting every validation by kind."""
    counts = {"pairs": 0, "table": 0, "plan": 0}

    def counted(kind, function):
        def run(*args, **kwargs):
            counts[kind] += 1
            return function(*args, **kwargs)
        return run

    monkeypatch.setattr(kernel_map, "validates_views", lambda device, backend: True)
    monkeypatch.setattr(kernel_map, "validate_pairs", counted("pairs", validate_pairs))
    monkeypatch.setattr(kernel_map, "validate_table", counted("table", validate_table))
    monkeypatch.setattr(kernel_map, "validate_plan", counted("plan", validate_plan))
    return counts


def test_views_are_validated_once_when_built(counting_validation, gen):
    counts = counting_validation
    kmap = submanifold_map(KernelMapCache(), random_coords(gen, 300, batch=2, low=-4, high=5), ConvGeometry.make(3),
                           None)
    assert counts == {"pairs": 0, "table": 0, "plan": 0}
    for _ in range(3):
        p = kmap.pairs_sorted_by("out")
        kmap.pairs_sorted_by("in")
        kmap.plan("out", 2, 64)
        kmap.plan("in", 2, 64)
        kmap.table("out")
    assert counts == {"pairs": 2, "table": 2, "plan": 2}
    # The host copies come from the validation's single read, not the view's own tensors.
    assert p.host_offsets is not p.offsets and torch.equal(p.host_offsets, p.offsets)
    assert torch.equal(p.host_identity, p.identity)


def test_conv_calls_reuse_validated_views(counting_validation, gen):
    counts = counting_validation
    x = sparse_input(gen)
    weight = torch.randn(27, 4, 5, generator=gen, requires_grad=True)
    for dataflow in ("gather_scatter", "fetch_on_demand", "implicit_gemm"):
        for _ in range(3):
            conv3d(x, weight, 3, config=ConvConfig(dataflow)).F.sum().backward()
    # pairs by output and by input, the two tables, the plans of the two tables (forward / dgrad).
    assert counts == {"pairs": 2, "table": 2, "plan": 2}


def test_a_bad_view_fails_when_built(counting_validation, gen, monkeypatch):
    kmap = submanifold_map(KernelMapCache(), random_coords(gen, 300, batch=2, low=-4, high=5), ConvGeometry.make(3),
                           None)
    real = ops.kmap_pairs

    def corrupted(out_in, num_in, num_out):
        ins, outs, offsets, identity = real(out_in, num_in, num_out)
        ins = ins.clone()
        ins[0] = num_in
        return ins, outs, offsets, identity

    monkeypatch.setattr(ops, "kmap_pairs", corrupted)
    with pytest.raises(RuntimeError, match="a source index is out of range"):
        kmap.pairs_sorted_by("out")


# --------------------------------------------------------------------------------------------
# Native CUDA dataflows of this build
# --------------------------------------------------------------------------------------------
def test_cuda_dataflows_follow_the_build():
    has_fod = torch._C._dispatch_has_kernel_for_dispatch_key("torchsparse_pp::fetch_on_demand_forward", "CUDA")
    assert ("fetch_on_demand" in config_module.CUDA_DATAFLOWS) == has_fod
    assert {"gather_scatter", "implicit_gemm"} <= set(config_module.CUDA_DATAFLOWS)
    assert ("cuda" in config_module.IMPLEMENTED) == torch.ops.torchsparse_pp.cuda_built()
