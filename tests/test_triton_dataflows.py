"""The Triton kernels of every dataflow, run by the Triton interpreter on CPU tensors (no GPU
needed), against the float64 dense oracle and against each other:

1. every dataflow x geometry (submanifold, strided spconv / minkowski, transposed, generative,
   per-axis kernels, dilation, 125 offsets) in float32: forward, dgrad and wgrad;
2. float16, bfloat16 and float64 on a subset of geometries;
3. every tile of each compute mode;
4. all Triton configs agree with the native CPU dataflows on LiDAR-like crops;
5. edge cases: one point, 1 and 33 channels, offsets without pairs, more splits than offsets;
6. float64 gradcheck through the autograd Function.

Deterministic mode's kernels meet the oracle in 1. (the flag alternates over the cases). Whether
repeated runs are bit-identical is not tested here: the interpreter runs a grid's programs one at
a time, in order, so its atomics never race and equal runs would prove nothing.
tests/test_cuda_dataflows.py repeats the runs compiled, on a GPU.

On a machine with a GPU (TRITON_INTERPRET unset) these are skipped; tests/test_cuda_dataflows.py
runs the same kernels compiled. CI installs triton; elsewhere the file is skipped without it.
"""
import os

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import backends
from torchsparse_pp.nn.functional import ConvConfig, PassConfigs, conv3d
from torchsparse_pp.ops.triton import runtime
from torchsparse_pp.ops.triton.tiles import tiles_for
from conftest import random_coords
from dataflow_cases import (EDGE_CASES, GEOMETRIES, TOLERANCE, assert_small, check_against_oracle,
                            check_output_coords, conv_kwargs, library_abs_sums, lidar_scene, make_input, oracle_errors,
                            planar_coords, rel_to, run_ours, volume)

if os.environ.get("CI"):
    import triton  # noqa: F401 (CI installs it: a missing triton must fail, not skip)
else:
    pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not runtime.interpreter_requested(),
                                reason="interpreter tests (TRITON_INTERPRET=1, set by conftest without a GPU)")

TRITON_CONFIGS = {
    "fod": ConvConfig("fetch_on_demand", backend="triton"),
    "fod_m64": ConvConfig("fetch_on_demand", backend="triton", tile="m64n32k16w4s2"),
    "ig_unsorted": ConvConfig("implicit_gemm", backend="triton", sorted=False, split_mask_num=0),
    "ig_sorted_split1": ConvConfig("implicit_gemm", backend="triton", sorted=True, split_mask_num=1),
    "ig_sorted_split2_m64": ConvConfig("implicit_gemm", backend="triton", sorted=True, split_mask_num=2,
                                        tile="m64n32k16w4s2"),
    "ig_sorted_split4": ConvConfig("implicit_gemm", backend="triton", sorted=True, split_mask_num=4),
    "gs": ConvConfig("gather_scatter", backend="triton"),
    "gs_grouped": ConvConfig("gather_scatter", backend="triton", epsilon=0.5, mm_thresh=10 ** 9),
}
BY_DATAFLOW = {d: [n for n, c in TRITON_CONFIGS.items() if c.dataflow == d]
               for d in ("fetch_on_demand", "implicit_gemm", "gather_scatter")}


@pytest.fixture
def deterministic_flag():
    """Sets backends.deterministic for one test and restores it."""
    saved = backends.deterministic

    def set_flag(value: bool):
        backends.deterministic = value
    yield set_flag
    backends.deterministic = saved


# --------------------------------------------------------------------------------------------
# 1. Every dataflow x geometry, float32, against the dense oracle
# --------------------------------------------------------------------------------------------
# Each (geometry, dataflow) pair runs one of the dataflow's configs and alternates the
# deterministic flag, so every config and both modes meet several geometries.
FP32_CASES = [(g, BY_DATAFLOW[d][i % len(BY_DATAFLOW[d])], (i + j) % 2 == 1, ("random", "lidar")[i % 2])
              for i, g in enumerate(GEOMETRIES) for j, d in enumerate(BY_DATAFLOW)]


@pytest.mark.parametrize("geometry, config, deterministic, source", FP32_CASES,
                         ids=[f"{g}-{c}-{'det' if d else 'fast'}-{s}" for g, c, d, s in FP32_CASES])
def test_triton_float32_matches_oracle(geometry, config, deterministic, source, gen, deterministic_flag):
    deterministic_flag(deterministic)
    geom = GEOMETRIES[geometry]
    x = make_input(gen, geom, source, 5)
    weight = torch.randn(volume(geom["kernel_size"]), 5, 7, generator=gen)
    y, errors = oracle_errors(x, weight, geom, TRITON_CONFIGS[config], gen)
    assert y.F.shape == (y.C.shape[0], 7) and y.F.dtype == torch.float32
    check_output_coords(x, y, geom)
    assert_small(errors)


# --------------------------------------------------------------------------------------------
# 2. float16, bfloat16, float64
# --------------------------------------------------------------------------------------------
DTYPE_GEOMETRIES = ["subm_k3", "k3s2p1_spconv", "transposed_k3s2p1", "generative_k2s2"]
# Configs that pick their tile per dtype (a named tile serves only some compute modes).
UNTILED = {d: [n for n in names if TRITON_CONFIGS[n].tile is None] for d, names in BY_DATAFLOW.items()}
DTYPE_CASES = [(dt, g, UNTILED[d][(i + j) % len(UNTILED[d])])
               for dt in (torch.float16, torch.bfloat16, torch.float64)
               for i, g in enumerate(DTYPE_GEOMETRIES) for j, d in enumerate(BY_DATAFLOW)]


@pytest.mark.parametrize("dtype, geometry, config", DTYPE_CASES,
                         ids=[f"{str(dt)[6:]}-{g}-{c}" for dt, g, c in DTYPE_CASES])
def test_triton_dtypes_match_oracle(dtype, geometry, config, gen):
    geom = GEOMETRIES[geometry]
    x = make_input(gen, geom, "lidar", 16, dtype=dtype)
    weight = torch.randn(volume(geom["kernel_size"]), 16, 12, generator=gen).to(dtype)
    y, dfeats, dweight, grad = run_ours(x, weight, geom, TRITON_CONFIGS[config],
                                        int(torch.randint(0, 2 ** 31, (1,), generator=gen)))
    assert y.F.dtype == dfeats.dtype == dweight.dtype == dtype
    check_against_oracle(x, weight, geom, TRITON_CONFIGS[config], y, dfeats, dweight, grad, f"{dtype} {config}")


# --------------------------------------------------------------------------------------------
# 3. Every tile of each compute mode
# --------------------------------------------------------------------------------------------
MODE_DTYPES = (("fp32", torch.float32), ("tf32", torch.float32), ("half", torch.float16), ("fp64", torch.float64))
TILE_CASES = [(mode, dtype, t.name, dataflow) for mode, dtype in MODE_DTYPES
              for t in tiles_for(mode) for dataflow in ("fetch_on_demand", "implicit_gemm")]


@pytest.fixture
def tf32_flag():
    saved = backends.allow_tf32
    yield
    backends.allow_tf32 = saved


@pytest.mark.parametrize("mode, dtype, tile, dataflow", TILE_CASES,
                         ids=[f"{m}-{t}-{d}" for m, _, t, d in TILE_CASES])
def test_every_tile_matches_oracle(mode, dtype, tile, dataflow, gen, tf32_flag):
    backends.allow_tf32 = mode == "tf32"  # the interpreter computes tf32 dots in float32
    geom = GEOMETRIES["subm_k3"]
    x = make_input(gen, geom, "lidar", 20, dtype=dtype)   # 20 and 36: channel tails in every tile
    weight = torch.randn(27, 20, 36, generator=gen).to(dtype)
    extra = {"sorted": True, "split_mask_num": 2} if dataflow == "implicit_gemm" else {}
    config = ConvConfig(dataflow, backend="triton", tile=tile, **extra)
    y, dfeats, dweight, grad = run_ours(x, weight, geom, config, 5)
    check_against_oracle(x, weight, geom, config, y, dfeats, dweight, grad, f"{mode} {tile} {dataflow}")


def test_tile_outside_its_mode_raises(gen):
    half_only = next(t.name for t in tiles_for("half") if "fp32" not in t.modes)
    x = make_input(gen, GEOMETRIES["subm_k3"], "random", 4)
    with pytest.raises(ValueError, match=rf"tile {half_only} does not serve fp32 convolutions"):
        conv3d(x, torch.randn(27, 4, 4, generator=gen), 3,
               config=ConvConfig("fetch_on_demand", backend="triton", tile=half_only))


# --------------------------------------------------------------------------------------------
# 4. Triton configs agree with the native CPU dataflows
# --------------------------------------------------------------------------------------------
AGREE_LAYERS = {"subm_k3": dict(kernel_size=3), "k2s2": dict(kernel_size=2, stride=2),
                "subm_k311": dict(kernel_size=(3, 1, 1))}


@pytest.mark.parametrize("layer", list(AGREE_LAYERS))
def test_triton_agrees_with_native(layer, gen):
    geom = AGREE_LAYERS[layer]
    coords = lidar_scene(int(torch.randint(0, 4, (1,), generator=gen)))
    x = tsp.SparseTensor(torch.randn(len(coords), 8, generator=gen), coords)
    weight = torch.randn(volume(geom["kernel_size"]), 8, 8, generator=gen) / 4
    base_y, base_df, base_dw, grad = run_ours(x, weight, geom, ConvConfig("gather_scatter", backend="native"), 11)
    # float32 sums in other orders: relative to the same sums over absolute values.
    mag_y, mag_df, mag_dw = library_abs_sums(x, weight, geom, grad)
    failures = {}
    for name, config in TRITON_CONFIGS.items():
        y, df, dw, _ = run_ours(x, weight, geom, config, 11)
        assert torch.equal(y.C, base_y.C)
        errors = {"forward": rel_to(y.F, base_y.F, mag_y), "dgrad": rel_to(df, base_df, mag_df),
                  "wgrad": rel_to(dw, base_dw, mag_dw)}
        bad = {k: v for k, v in errors.items() if not v < TOLERANCE}
        if bad:
            failures[name] = bad
    assert not failures, failures


def test_mixed_backends_per_pass(gen):
    """Forward on Triton, dgrad native, wgrad Triton gather_scatter: each pass runs its own."""
    geom = GEOMETRIES["k3s2p1_spconv"]
    x = make_input(gen, geom, "lidar", 6)
    weight = torch.randn(27, 6, 5, generator=gen)
    config = PassConfigs(TRITON_CONFIGS["ig_sorted_split1"], ConvConfig("fetch_on_demand", backend="native"),
                         TRITON_CONFIGS["gs"])
    _, errors = oracle_errors(x, weight, geom, config, gen)
    assert_small(errors)


# --------------------------------------------------------------------------------------------
# 5. Edge cases
# --------------------------------------------------------------------------------------------
EDGE_TRITON = ["single_point_subm_k3", "single_point_k2s2", "single_point_generative_k3s2", "channels_1_to_33_subm_k3",
               "channels_33_to_1_k2s2", "empty_offsets_k3s2p1", "kernel_1_stride_2"]
EDGE_GRID = [(case, BY_DATAFLOW[d][i % len(BY_DATAFLOW[d])]) for i, case in enumerate(EDGE_TRITON) for d in BY_DATAFLOW]


@pytest.mark.parametrize("case, config", EDGE_GRID, ids=[f"{e}-{c}" for e, c in EDGE_GRID])
def test_triton_edge_cases_match_oracle(case, config, gen):
    geom, make_coords, c_in, c_out = EDGE_CASES[case]
    coords = make_coords(gen)
    x = tsp.SparseTensor(torch.randn(len(coords), c_in, generator=gen), coords, stride=geom.get("input_stride", 1))
    weight = torch.randn(volume(geom["kernel_size"]), c_in, c_out, generator=gen)
    y, errors = oracle_errors(x, weight, geom, TRITON_CONFIGS[config], gen)
    assert y.F.shape == (len(y.C), c_out)
    assert_small(errors)


@pytest.mark.parametrize("config", ["fod", "ig_unsorted", "gs_grouped"])
def test_offsets_without_pairs_get_zero_weight_gradient(config, gen):
    coords = planar_coords(gen)
    x = tsp.SparseTensor(torch.randn(len(coords), 3, generator=gen), coords)
    _, _, dweight, _ = run_ours(x, torch.randn(27, 3, 4, generator=gen), dict(kernel_size=3), TRITON_CONFIGS[config], 7)
    dz = torch.arange(27) % 3 - 1
    assert torch.count_nonzero(dweight[dz != 0]) == 0
    assert bool((dweight[dz == 0].abs().sum((1, 2)) > 0).all())


@pytest.mark.parametrize("config", list(TRITON_CONFIGS))
def test_zero_output_channels_give_empty_outputs(config, gen):
    """C_out = 0: an [N, 0] output, a zero input gradient and an empty weight gradient (the
    native CPU kernels once crashed here; tests/test_cpu_isa.py covers them)."""
    coords = lidar_scene(int(torch.randint(0, 4, (1,), generator=gen)))
    feats = torch.randn(len(coords), 5, generator=gen, requires_grad=True)
    weight = torch.randn(27, 5, 0, generator=gen, requires_grad=True)
    y = conv3d(tsp.SparseTensor(feats, coords), weight, 3, config=TRITON_CONFIGS[config])
    assert y.F.shape == (len(coords), 0)
    y.F.sum().backward()
    assert torch.equal(feats.grad, torch.zeros_like(feats))
    assert weight.grad.shape == weight.shape


@pytest.mark.parametrize("split", [2, 4])
def test_more_splits_than_offsets(split, gen):
    coords = random_coords(gen, 150, batch=2, low=-4, high=6)
    x = tsp.SparseTensor(torch.randn(len(coords), 5, generator=gen), coords)
    config = ConvConfig("implicit_gemm", backend="triton", sorted=True, split_mask_num=split)
    _, errors = oracle_errors(x, torch.randn(2, 5, 3, generator=gen), dict(kernel_size=(2, 1, 1)), config, gen)
    assert_small(errors)


# --------------------------------------------------------------------------------------------
# 6. gradcheck (float64)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", ["fod", "ig_sorted_split2_m64", "gs_grouped"])
def test_gradcheck(config, gen):
    coords = random_coords(gen, 40, batch=2, low=-2, high=3)
    feats = torch.randn(len(coords), 3, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(27, 3, 2, generator=gen, dtype=torch.float64, requires_grad=True)

    def conv(f, w):
        return conv3d(tsp.SparseTensor(f, coords), w, 3, config=TRITON_CONFIGS[config]).F
    assert torch.autograd.gradcheck(conv, (feats, weight), fast_mode=True)


def test_geometries_cover_every_mode():
    """The oracle cases above include every map mode (a guard against a shrinking case list)."""
    kinds = {("generative" if g.get("generative") else "transposed" if g.get("transposed") else
              g.get("downsample_mode", "submanifold")) for g in GEOMETRIES.values()}
    assert kinds == {"submanifold", "spconv", "minkowski", "transposed", "generative"}
    assert {g for g, *_ in FP32_CASES} == set(GEOMETRIES)
    assert {c for _, c, *_ in FP32_CASES} == set(TRITON_CONFIGS)
    assert any(volume(g["kernel_size"]) > 64 for g in GEOMETRIES.values())
    assert [conv_kwargs(GEOMETRIES[g]) for g in DTYPE_GEOMETRIES]
