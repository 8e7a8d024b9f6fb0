"""Property-based tests of every conv geometry, dataflow and pass against a float64 direct
reference written here.

The reference knows nothing of the library's kernel maps: it looks coordinates up in a Python
dict from (batch, x, y, z) to row and sums W[delta] products over explicit loops of kernel
offsets (``out[q] = sum_delta W[delta] in[q*s - pad + delta*d]``, and its transpose), and it
derives every output set from docs/semantics.md on its own. Hypothesis draws the geometry
(kernel 1-5, stride 1-3, dilation 1-3 per axis, default or explicit padding), the variant
(submanifold, spconv / minkowski strided, transposed, generative, with or without a spatial
range), 1-4 samples with empty ones, coordinates around the origin, negative, or next to the
packable limits (+-2^15), and 1-70 channels; the tensors come from a seed it draws (printed in
the falsifying example, so any failure replays). Where the reference says an output coordinate
leaves the packable range, the library must raise.

Checked per example: the output coordinates (set and canonical order); forward, dgrad and wgrad
of every dataflow configuration (gather_scatter with and without adaptive grouping,
fetch_on_demand, implicit_gemm unsorted and sorted with 1-4 splits, a mixed per-pass config) in
float64 against the reference, and in float32 against each other; deterministic mode bit for
bit across runs and thread counts 1 and 2; the torch-ops kernel-map backend; and, on tiny
inputs, the Triton kernels under the interpreter.
"""
import contextlib
import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import torchsparse_pp as tsp
from torchsparse_pp import backends
from torchsparse_pp.nn.functional import ConvConfig, PassConfigs, conv3d

SPATIAL_MIN, SPATIAL_MAX = -(1 << 15), (1 << 15) - 1

CONFIGS = {
    "gs": ConvConfig("gather_scatter", epsilon=0.0, mm_thresh=0),
    "gs_grouped": ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=40),
    "gs_one_group": ConvConfig("gather_scatter", epsilon=1.0, mm_thresh=10 ** 9),
    "fod": ConvConfig("fetch_on_demand"),
    "ig_unsorted": ConvConfig("implicit_gemm", sorted=False, split_mask_num=0),
    "ig_sorted1": ConvConfig("implicit_gemm", sorted=True, split_mask_num=1),
    "ig_sorted2": ConvConfig("implicit_gemm", sorted=True, split_mask_num=2),
    "ig_sorted4": ConvConfig("implicit_gemm", sorted=True, split_mask_num=4),
    "mixed": PassConfigs(ConvConfig("implicit_gemm", sorted=True, split_mask_num=3), ConvConfig("fetch_on_demand"),
                         ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=40)),
}
TRITON_CONFIGS = {
    "triton_gs": ConvConfig("gather_scatter", backend="triton"),
    "triton_fod": ConvConfig("fetch_on_demand", backend="triton"),
    "triton_ig_sorted2": ConvConfig("implicit_gemm", sorted=True, split_mask_num=2, backend="triton"),
}
PROPERTY_SETTINGS = dict(deadline=None, print_blob=True,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --------------------------------------------------------------------------------------------
# The reference: dict lookups and explicit offset loops in float64
# --------------------------------------------------------------------------------------------
def offsets_of(kernel, dilation):
    """Kernel offsets delta*d in the weight's row order (z fastest), from docs/semantics.md."""
    return [(i * dilation[0], j * dilation[1], l * dilation[2])
            for i in range(kernel[0]) for j in range(kernel[1]) for l in range(kernel[2])]


def index_of(coords):
    return {tuple(row): i for i, row in enumerate(coords.tolist())}


def reference_pairs(in_coords, out_coords, case, transposed):
    """(in_row, out_row, k) of every product. Forward: output q reads input p = q*s - pad +
    delta*d, found from each input p as q = (p + pad - delta*d) / s where that divides exactly.
    Transposed: coarse input q writes fine output p = q*s - pad + delta*d."""
    s, pad = case["stride"], case["padding"]
    outputs = index_of(out_coords)
    pairs = []
    rows = in_coords.tolist()
    for k, delta in enumerate(offsets_of(case["kernel"], case["dilation"])):
        for r, (b, *p) in enumerate(rows):
            if transposed:
                target = (b, *(p[a] * s[a] - pad[a] + delta[a] for a in range(3)))
            else:
                num = [p[a] + pad[a] - delta[a] for a in range(3)]
                if any(num[a] % s[a] for a in range(3)):
                    continue
                target = (b, *(num[a] // s[a] for a in range(3)))
            o = outputs.get(target)
            if o is not None:
                pairs.append((r, o, k))
    return pairs


def reference_conv(feats, weight, grad, pairs, num_out):
    """Forward, input gradient and weight gradient of the pairs, in float64 numpy."""
    out = np.zeros((num_out, weight.shape[2]))
    dfeats = np.zeros_like(feats)
    dweight = np.zeros_like(weight)
    for k in range(weight.shape[0]):
        sel = [(i, o) for i, o, kk in pairs if kk == k]
        if not sel:
            continue
        i, o = (np.array(v) for v in zip(*sel))
        np.add.at(out, o, feats[i] @ weight[k])
        np.add.at(dfeats, i, grad[o] @ weight[k].T)
        dweight[k] = feats[i].T @ grad[o]
    return out, dfeats, dweight


def sorted_unique(rows):
    """Distinct rows in lexicographic (batch, x, y, z) order: the library's canonical order."""
    return sorted(set(rows))


def reference_output_coords(coords, case):
    """The output set of docs/semantics.md, with 'unpackable' when a coordinate that must exist
    lies outside the packable range, or 'empty range' when the clipped dense size is < 1."""
    k, s, d, pad, rng = case["kernel"], case["stride"], case["dilation"], case["padding"], case["range"]
    variant = case["variant"]
    rows = [tuple(r) for r in coords.tolist()]
    if variant in ("submanifold", "transposed"):
        return rows
    if variant == "minkowski":
        return sorted_unique((b, x // s[0], y // s[1], z // s[2]) for b, x, y, z in rows)
    taps = offsets_of(k, d)
    if variant == "spconv":
        limit = None if rng is None else [(n + 2 * p - dd * (kk - 1) - 1) // ss + 1
                                          for n, p, dd, kk, ss in zip(rng, pad, d, k, s)]
        if limit is not None and min(limit) < 1:
            return "empty range"
        found = []
        for (b, *p), delta in itertools.product(rows, taps):
            num = [p[a] + pad[a] - delta[a] for a in range(3)]
            if any(num[a] % s[a] for a in range(3)):
                continue
            q = tuple(num[a] // s[a] for a in range(3))
            if limit is None or all(0 <= q[a] < limit[a] for a in range(3)):
                found.append((b, *q))
    else:  # generative
        limit = None if rng is None else [(n - 1) * ss - 2 * p + dd * (kk - 1) + 1
                                          for n, p, dd, kk, ss in zip(rng, pad, d, k, s)]
        if limit is not None and min(limit) < 1:
            return "empty range"
        found = []
        for (b, *q), delta in itertools.product(rows, taps):
            p = tuple(q[a] * s[a] - pad[a] + delta[a] for a in range(3))
            if limit is None or all(0 <= p[a] < limit[a] for a in range(3)):
                found.append((b, *p))
    if any(not SPATIAL_MIN <= v <= SPATIAL_MAX for row in found for v in row[1:]):
        return "unpackable"
    return sorted_unique(found)


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------
LOCATIONS = ("origin", "negative", "low_limit", "high_limit")


@st.composite
def conv_cases(draw, max_points=40, max_kernel=5, channels=st.one_of(st.integers(1, 9), st.integers(10, 70))):
    variant = draw(st.sampled_from(["submanifold", "spconv", "minkowski", "transposed", "generative"]))
    kernel = tuple(draw(st.integers(1, max_kernel)) for _ in range(3))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(3))
    if variant == "submanifold":
        stride = (1, 1, 1)
    elif variant in ("spconv", "minkowski", "generative") and stride == (1, 1, 1):
        stride = (2, stride[1], stride[2])
    dilation = tuple(draw(st.integers(1, 3)) for _ in range(3))
    padding = draw(st.one_of(st.none(), st.tuples(*[st.integers(0, 4)] * 3)))
    location = draw(st.sampled_from(LOCATIONS))
    ranged = variant in ("spconv", "generative") and location in ("origin", "high_limit") and draw(st.booleans())
    batch = draw(st.integers(1, 4))
    # Samples with no points (also the first and the last) are kept empty on purpose.
    per_sample = draw(st.lists(st.integers(0, max_points // batch), min_size=batch, max_size=batch))
    if sum(per_sample) == 0:  # a SparseTensor has at least one point
        per_sample[draw(st.integers(0, batch - 1))] = 1
    return dict(variant=variant, kernel=kernel, stride=stride, dilation=dilation, explicit_padding=padding,
                padding=padding if padding is not None else tuple(dd * (kk - 1) // 2 if kk % 2 else 0
                                                                  for kk, dd in zip(kernel, dilation)),
                location=location, ranged=ranged, per_sample=per_sample, extent=draw(st.integers(3, 9)),
                c_in=draw(channels), c_out=draw(channels), seed=draw(st.integers(0, 2 ** 32 - 1)))


def input_coords(case, gen):
    """Unique points per sample in an extent^3 box at the case's location; for ranged cases the
    box lies in [0, range)."""
    e = case["extent"]
    low = {"origin": 0, "negative": -7 - e, "low_limit": SPATIAL_MIN, "high_limit": SPATIAL_MAX - e + 1}
    base = low[case["location"]]
    rows = []
    for b, n in enumerate(case["per_sample"]):
        flat = torch.randperm(e ** 3, generator=gen)[:n]
        xyz = torch.stack([flat // (e * e), (flat // e) % e, flat % e], 1) + base
        rows.append(torch.cat([torch.full((len(flat), 1), b, dtype=torch.long), xyz], 1))
    coords = torch.cat(rows)
    coords = coords[torch.randperm(len(coords), generator=gen)].to(torch.int32)
    rng = None
    if case["ranged"]:
        rng = tuple(int(coords[:, 1 + a].max()) + 1 if len(coords) else base + e for a in range(3))
    return coords, rng


def conv_args(case):
    transposed = case["variant"] in ("transposed", "generative")
    return dict(kernel_size=case["kernel"], stride=case["stride"], dilation=case["dilation"],
                padding=case["explicit_padding"], transposed=transposed, generative=case["variant"] == "generative",
                downsample_mode="minkowski" if case["variant"] == "minkowski" else "spconv")


def build_input(case, gen, dtype):
    """The conv's input tensor (for 'transposed' the coarse output of the matching strided conv)
    and the reference's (input coordinates, output coordinates or an expected failure)."""
    coords, rng = input_coords(case, gen)
    case["range"] = rng
    variant = case["variant"]
    stride = case["stride"] if variant == "generative" else (1, 1, 1)
    if variant == "transposed":
        fine = tsp.SparseTensor(torch.zeros(len(coords), 1, dtype=dtype), coords)
        strided = dict(case, variant="spconv" if case["stride"] != (1, 1, 1) else "submanifold", range=None)
        expected_coarse = reference_output_coords(coords, strided)
        down = dict(conv_args(case), transposed=False, generative=False)
        if expected_coarse == "unpackable":  # the strided conv before it must refuse
            with pytest.raises(RuntimeError, match=r"outside the supported range"):
                conv3d(fine, torch.zeros(volume(case), 1, 1, dtype=dtype), **down)
            return None, coords, "refused"
        coarse = conv3d(fine, torch.zeros(volume(case), 1, 1, dtype=dtype), **down)
        assert coarse.C.tolist() == [list(r) for r in expected_coarse]
        x = coarse.replace_feats(torch.randn(coarse.C.shape[0], case["c_in"], generator=gen, dtype=dtype))
        return x, coarse.C, [tuple(r) for r in coords.tolist()]
    feats = torch.randn(len(coords), case["c_in"], generator=gen, dtype=dtype)
    x = tsp.SparseTensor(feats, coords, stride=stride, spatial_range=rng)
    return x, coords, reference_output_coords(coords, case)


def volume(case):
    kx, ky, kz = case["kernel"]
    return kx * ky * kz


def run(x, weight, grad_seed, case, config):
    """Forward + backward through conv3d; the output gradient is drawn from grad_seed."""
    feats = x.F.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    y = conv3d(x.replace_feats(feats), w, config=config, **conv_args(case))
    grad = torch.randn(y.F.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=y.F.dtype)
    y.F.backward(grad)
    return y, feats.grad, w.grad, grad


def assert_close(name, got, want, scale):
    """Norm-wise error relative to the same sum over absolute values (a float64 sum of random
    terms can cancel to almost nothing)."""
    err = float(np.linalg.norm(got - want)) / max(float(np.linalg.norm(scale)), 1e-300)
    assert err < 1e-10 or (not want.size), f"{name}: relative error {err:.3g}"


def checked_case(case, dtype=torch.float64):
    """The input, weight and reference outputs of a case, or None when the library must (and
    does) refuse it."""
    note(f"case: {case}")
    gen = torch.Generator().manual_seed(case["seed"])
    x, in_coords, expected = build_input(case, gen, dtype)
    weight = torch.randn(volume(case), case["c_in"], case["c_out"], generator=gen, dtype=dtype)
    event(f"{case['variant']}: {expected if isinstance(expected, str) else 'computed'}")
    if expected == "refused":
        return None
    if expected in ("unpackable", "empty range"):
        error, message = ((RuntimeError, r"outside the supported range") if expected == "unpackable"
                          else (ValueError, r"spatial_range .* (smaller|empty)"))
        with pytest.raises(error, match=message):
            conv3d(x, weight, **conv_args(case))
        return None
    return x, in_coords, expected, weight, int(torch.randint(0, 2 ** 31, (1,), generator=gen))


def reference_of(x, in_coords, out_coords, weight, grad, case):
    transposed = case["variant"] in ("transposed", "generative")
    pairs = reference_pairs(in_coords, out_coords, case, transposed)
    f, w, g = (t.detach().double().numpy() for t in (x.F, weight, grad))
    exact = reference_conv(f, w, g, pairs, len(out_coords))
    scale = reference_conv(np.abs(f), np.abs(w), np.abs(g), pairs, len(out_coords))
    return exact, scale


# --------------------------------------------------------------------------------------------
# 1. Every dataflow and pass against the reference (float64), and against each other (float32)
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def kmap_backend(name):
    saved = backends.kmap_backend
    backends.kmap_backend = name
    try:
        yield
    finally:
        backends.kmap_backend = saved


@settings(max_examples=70, **PROPERTY_SETTINGS)
@given(case=conv_cases(), map_builder=st.sampled_from(["native", "native", "torch"]))
def test_every_dataflow_matches_the_direct_reference(case, map_builder):
    with kmap_backend(map_builder):
        prepared = checked_case(case)
        if prepared is None:
            return
        x, in_coords, expected, weight, grad_seed = prepared
        reference = None
        for name, config in CONFIGS.items():
            y, dfeats, dweight, grad = run(x, weight, grad_seed, case, config)
            assert [tuple(r) for r in y.C.tolist()] == list(expected), f"{name}: output coordinates"
            assert y.F.shape == (len(expected), case["c_out"]) and y.F.dtype == torch.float64
            if reference is None:
                reference = reference_of(x, in_coords, y.C, weight, grad, case)
            (out, ref_df, ref_dw), (mag, mag_df, mag_dw) = reference
            assert_close(f"{name} forward", y.F.detach().numpy(), out, mag)
            assert_close(f"{name} dgrad", dfeats.numpy(), ref_df, mag_df)
            assert_close(f"{name} wgrad", dweight.numpy(), ref_dw, mag_dw)


@settings(max_examples=25, **PROPERTY_SETTINGS)
@given(case=conv_cases(max_points=60))
def test_dataflows_agree_with_each_other_in_float32(case):
    prepared = checked_case(case, torch.float32)
    if prepared is None:
        return
    x, in_coords, _, weight, grad_seed = prepared
    results = {name: run(x, weight, grad_seed, case, config) for name, config in CONFIGS.items()}
    base = results["gs"]
    # float32 sums in other orders: norm-wise relative to the same sums over absolute values.
    _, scales = reference_of(x, in_coords, base[0].C, weight, base[3], case)
    for name, (y, dfeats, dweight, _) in results.items():
        assert torch.equal(y.C, base[0].C)
        for what, got, want, scale in zip(("forward", "dgrad", "wgrad"), (y.F, dfeats, dweight),
                                          (base[0].F, base[1], base[2]), scales):
            err = float(np.linalg.norm(got.detach().double().numpy() - want.detach().double().numpy()))
            err /= max(float(np.linalg.norm(scale)), 1e-300)
            assert err < 1e-5 or not want.numel(), f"{name} {what} differs from gather_scatter: {err:.3g}"


# --------------------------------------------------------------------------------------------
# 2. Deterministic mode: bit for bit across runs and thread counts
# --------------------------------------------------------------------------------------------
@settings(max_examples=12, **PROPERTY_SETTINGS)
@given(case=conv_cases(max_points=80, channels=st.integers(1, 40)))
def test_deterministic_mode_is_bit_identical_across_runs_and_threads(case):
    prepared = checked_case(case, torch.float32)
    if prepared is None:
        return
    x, _, _, weight, grad_seed = prepared
    saved_flag, saved_threads = backends.deterministic, torch.get_num_threads()
    try:
        backends.deterministic = True
        for name, config in CONFIGS.items():
            runs = []
            for threads in (1, 2, 2, 1):
                torch.set_num_threads(threads)
                y, dfeats, dweight, _ = run(x, weight, grad_seed, case, config)
                runs.append((y.F, dfeats, dweight))
            for other in runs[1:]:
                assert all(torch.equal(a, b) for a, b in zip(runs[0], other)), f"{name}: not bit-identical"
    finally:
        backends.deterministic, _ = saved_flag, torch.set_num_threads(saved_threads)


# --------------------------------------------------------------------------------------------
# 3. The Triton kernels under the interpreter (few, tiny: the interpreter is slow)
# --------------------------------------------------------------------------------------------
@settings(max_examples=4, **PROPERTY_SETTINGS)
@given(case=conv_cases(max_points=12, max_kernel=3, channels=st.integers(1, 6)))
def test_triton_dataflows_match_the_direct_reference(case):
    pytest.importorskip("triton")
    from torchsparse_pp.ops.triton import runtime
    if not runtime.interpreter_requested():
        pytest.skip("the Triton interpreter is not enabled (TRITON_INTERPRET=1)")
    prepared = checked_case(case)
    if prepared is None:
        return
    x, in_coords, expected, weight, grad_seed = prepared
    reference = None
    for name, config in TRITON_CONFIGS.items():
        y, dfeats, dweight, grad = run(x, weight, grad_seed, case, config)
        assert [tuple(r) for r in y.C.tolist()] == list(expected)
        if reference is None:
            reference = reference_of(x, in_coords, y.C, weight, grad, case)
        (out, ref_df, ref_dw), (mag, mag_df, mag_dw) = reference
        assert_close(f"{name} forward", y.F.detach().numpy(), out, mag)
        assert_close(f"{name} dgrad", dfeats.numpy(), ref_df, mag_df)
        assert_close(f"{name} wgrad", dweight.numpy(), ref_dw, mag_dw)


# --------------------------------------------------------------------------------------------
# The reference itself, on a case small enough to write out by hand
# --------------------------------------------------------------------------------------------
def test_reference_on_a_hand_computed_case():
    """A 2x1x1 kernel, stride 2 on x: outputs (0,0,0,0) reads (0,0,0,0) through k=0 and
    (0,1,0,0) through k=1; (0,1,0,0) reads (0,2,0,0) through k=0."""
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]], dtype=torch.int32)
    case = dict(variant="spconv", kernel=(2, 1, 1), stride=(2, 1, 1), dilation=(1, 1, 1), padding=(0, 0, 0),
                range=None)
    out_coords = reference_output_coords(coords, case)
    assert out_coords == [(0, 0, 0, 0), (0, 1, 0, 0)]
    pairs = reference_pairs(coords, torch.tensor(out_coords), case, transposed=False)
    assert sorted(pairs) == [(0, 0, 0), (1, 0, 1), (2, 1, 0)]
    feats = np.array([[1.0], [2.0], [4.0]])
    weight = np.array([[[3.0]], [[5.0]]])
    out, dfeats, dweight = reference_conv(feats, weight, np.array([[1.0], [10.0]]), pairs, 2)
    assert out.tolist() == [[1 * 3 + 2 * 5], [4 * 3]]
    assert dfeats.tolist() == [[3.0], [5.0], [30.0]]
    assert dweight.tolist() == [[[1 + 40.0]], [[2.0]]]
    # Minkowski: floor(p / 2); generative from (0, 1, 0, 0) with stride 2: 2*1 - 0 + {0, 1}.
    assert reference_output_coords(coords, dict(case, variant="minkowski")) == [(0, 0, 0, 0), (0, 1, 0, 0)]
    assert reference_output_coords(coords[1:2], dict(case, variant="generative")) == [(0, 2, 0, 0), (0, 3, 0, 0)]
    far = torch.tensor([[0, SPATIAL_MAX, 0, 0]], dtype=torch.int32)
    assert reference_output_coords(far, dict(case, variant="generative")) == "unpackable"
