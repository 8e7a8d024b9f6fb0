"""The CPU dataflows (gather_scatter, fetch_on_demand, implicit_gemm) and their parameters.

1. every dataflow configuration against the dense float64 oracle (forward, dgrad, wgrad) on
   submanifold, strided, transposed and generative geometries;
2. all configurations agree with each other on a whole 64-beam scan;
3. deterministic mode: bit-identical results across runs and OpenMP thread counts;
4. bfloat16 inputs against the float64 oracle;
5. edge cases: offsets without pairs, one point, 1 and 33 channels, more splits than offsets.

Geometries, inputs and the oracle comparison live in dataflow_cases.py (shared with the Triton
tests).
"""
import itertools

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import backends
from torchsparse_pp.data import generate_scan
from torchsparse_pp.nn.functional import ConvConfig, PassConfigs, conv3d
from torchsparse_pp.utils import sparse_quantize
from conftest import fresh_seed, random_coords
from dataflow_cases import (CHANNEL_PAIRS, EDGE_CASES, GEOMETRIES, TOLERANCE, assert_small, check_output_coords,
                            library_abs_sums, make_input, oracle_errors, planar_coords, reduced_precision_errors, rel_to,
                            run_oracle, run_ours, volume)

CONFIGS = {
    "gs_eps0_thr0": ConvConfig("gather_scatter", epsilon=0.0, mm_thresh=0),
    "gs_eps0.2_thrinf": ConvConfig("gather_scatter", epsilon=0.2, mm_thresh=10 ** 9),
    "gs_eps0.5_thr50": ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=50),
    "gs_eps1_thrinf": ConvConfig("gather_scatter", epsilon=1.0, mm_thresh=10 ** 9),
    "fetch_on_demand": ConvConfig("fetch_on_demand"),
    "ig_unsorted": ConvConfig("implicit_gemm", sorted=False, split_mask_num=0),
    "ig_sorted_split1": ConvConfig("implicit_gemm", sorted=True, split_mask_num=1),
    "ig_sorted_split2": ConvConfig("implicit_gemm", sorted=True, split_mask_num=2),
    "ig_sorted_split3": ConvConfig("implicit_gemm", sorted=True, split_mask_num=3),
    "ig_sorted_split4": ConvConfig("implicit_gemm", sorted=True, split_mask_num=4),
    # forward implicit GEMM (sorted, 2 splits), dgrad fetch-on-demand, wgrad grouped gather-scatter
    "mixed": PassConfigs(ConvConfig("implicit_gemm", sorted=True, split_mask_num=2),
                         ConvConfig("fetch_on_demand"),
                         ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=50)),
}
# The dataflows built deterministic by construction (no deterministic flag needed).
STABLE_BY_CONSTRUCTION = [name for name, cfg in CONFIGS.items()
                          if all(c.dataflow in ("fetch_on_demand", "implicit_gemm") for c in PassConfigs.of(cfg))]
GATHER_SCATTER = [name for name in CONFIGS if name.startswith("gs_")]


@pytest.fixture
def restore_backends():
    """Restores backends.deterministic and the thread count, whatever the test did."""
    flag, threads = backends.deterministic, torch.get_num_threads()
    try:
        yield
    finally:
        backends.deterministic = flag
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------
# 1. Every configuration x geometry against the dense oracle
# --------------------------------------------------------------------------------------------
ORACLE_CASES = [(g, c, ("random", "lidar")[(i + j) % 2], CHANNEL_PAIRS[(i + 3 * j) % len(CHANNEL_PAIRS)])
                for (i, g), (j, c) in itertools.product(enumerate(GEOMETRIES), enumerate(CONFIGS))]


@pytest.mark.parametrize("geometry, config, source, channels", ORACLE_CASES,
                         ids=[f"{g}-{c}-{s}" for g, c, s, _ in ORACLE_CASES])
def test_dataflow_matches_oracle(geometry, config, source, channels, gen):
    geom = GEOMETRIES[geometry]
    c_in, c_out = channels
    x = make_input(gen, geom, source, c_in)
    weight = torch.randn(volume(geom["kernel_size"]), c_in, c_out, generator=gen)
    y, errors = oracle_errors(x, weight, geom, CONFIGS[config], gen)
    assert y.F.shape == (y.C.shape[0], c_out) and y.F.dtype == torch.float32
    check_output_coords(x, y, geom)
    assert_small(errors)


DETERMINISTIC_GS_CASES = list(itertools.product(["subm_k3", "subm_k5", "k2s2_spconv", "transposed_k3s2p1"],
                                                GATHER_SCATTER))


@pytest.mark.parametrize("geometry, config", DETERMINISTIC_GS_CASES, ids=[f"{g}-{c}" for g, c in DETERMINISTIC_GS_CASES])
def test_deterministic_gather_scatter_matches_oracle(geometry, config, gen, restore_backends):
    """Deterministic mode swaps gather_scatter's GEMMs and wgrad sums: that path is right too."""
    backends.deterministic = True
    geom = GEOMETRIES[geometry]
    x = make_input(gen, geom, "lidar", 6)
    weight = torch.randn(volume(geom["kernel_size"]), 6, 7, generator=gen)
    _, errors = oracle_errors(x, weight, geom, CONFIGS[config], gen)
    assert_small(errors)


# --------------------------------------------------------------------------------------------
# 2. All configurations agree on a whole 64-beam scan
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scan64():
    seed = fresh_seed() % 100_000
    voxels = torch.from_numpy(sparse_quantize(generate_scan(64, seed=seed)["points"][:, :3], 0.1))
    coords = torch.cat([torch.zeros(len(voxels), 1, dtype=torch.int32), voxels], 1)
    return coords, seed


SCAN_LAYERS = {"subm_k3": dict(kernel_size=3), "k2s2": dict(kernel_size=2, stride=2)}


@pytest.mark.parametrize("layer", list(SCAN_LAYERS))
def test_dataflows_agree_on_64_beam_scan(layer, scan64):
    coords, seed = scan64
    assert 25_000 < len(coords) < 100_000, f"scan {seed} has {len(coords)} voxels"
    gen = torch.Generator().manual_seed(seed)
    geom = SCAN_LAYERS[layer]
    x = tsp.SparseTensor(torch.randn(len(coords), 16, generator=gen), coords)
    weight = torch.randn(volume(geom["kernel_size"]), 16, 16, generator=gen) / 8
    grad_seed = seed + 1
    base_y, base_df, base_dw, grad = run_ours(x, weight, geom, ConvConfig(), grad_seed)
    mag_y, mag_df, mag_dw = library_abs_sums(x, weight, geom, grad)
    failures = {}
    for name, config in CONFIGS.items():
        y, df, dw, _ = run_ours(x, weight, geom, config, grad_seed)
        assert torch.equal(y.C, base_y.C)
        errors = {"forward": rel_to(y.F, base_y.F, mag_y), "dgrad": rel_to(df, base_df, mag_df),
                  "wgrad": rel_to(dw, base_dw, mag_dw)}
        bad = {k: v for k, v in errors.items() if not v < TOLERANCE}
        if bad:
            failures[name] = bad
    assert not failures, f"scan seed {seed}, {len(coords)} voxels: {failures}"


# --------------------------------------------------------------------------------------------
# 3. Deterministic mode
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_scan():
    """Two 32-beam scans within 10 m at 0.25 m: about 3k voxels each, as two batch entries."""
    rows = []
    for b in range(2):
        voxels = sparse_quantize(generate_scan(32, seed=77 + b, max_range=10.0)["points"][:, :3], 0.25)
        voxels = torch.from_numpy(voxels)
        rows.append(torch.cat([torch.full((len(voxels), 1), b, dtype=torch.int32), voxels], 1))
    return torch.cat(rows)


def run_network(coords: torch.Tensor, config, threads: int, seed: int) -> dict:
    """SubM k3 -> strided k2 s2 -> transposed k2 s2 on fresh tensors (maps built under
    ``threads`` threads too); returns every output and gradient."""
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(len(coords), 16, generator=gen).requires_grad_(True)
    weights = [(torch.randn(k, 16, 16, generator=gen) / 4).requires_grad_(True) for k in (27, 8, 8)]
    x = tsp.SparseTensor(feats, coords.clone())
    y1 = conv3d(x, weights[0], 3, config=config)
    y2 = conv3d(y1, weights[1], 2, stride=2, config=config)
    y3 = conv3d(y2, weights[2], 2, stride=2, transposed=True, config=config)
    assert y3.C is y1.C
    grad = torch.randn(y3.F.shape, generator=gen)
    (y1.F.square().sum() * 1e-3 + (y2.F * y2.F.detach()).sum() * 1e-3 + (y3.F * grad).sum()).backward()
    return {"subm.out": y1.F.detach(), "strided.coords": y2.C, "strided.out": y2.F.detach(),
            "transposed.out": y3.F.detach(), "feats.grad": feats.grad,
            "subm.wgrad": weights[0].grad, "strided.wgrad": weights[1].grad, "transposed.wgrad": weights[2].grad}


def assert_bit_identical(runs: dict):
    (base_name, base), *others = runs.items()
    for name, other in others:
        differ = [k for k in base if not torch.equal(base[k], other[k])]
        assert not differ, f"{name} differs from {base_name} in {differ}"


@pytest.mark.parametrize("config", list(CONFIGS))
def test_deterministic_mode_is_bit_identical(config, small_scan, restore_backends):
    backends.deterministic = True
    seed = fresh_seed()
    runs = {"1 thread": run_network(small_scan, CONFIGS[config], 1, seed),
            "2 threads": run_network(small_scan, CONFIGS[config], 2, seed),
            "2 threads again": run_network(small_scan, CONFIGS[config], 2, seed)}
    assert_bit_identical(runs)


@pytest.mark.parametrize("config", STABLE_BY_CONSTRUCTION)
def test_fetch_on_demand_and_implicit_gemm_stable_without_flag(config, small_scan, restore_backends):
    """fetch_on_demand and implicit_gemm are deterministic by construction: bit-stable across
    runs and thread counts with the flag off, and the flag changes nothing for them."""
    seed = fresh_seed()
    backends.deterministic = False
    runs = {"flag off, 1 thread": run_network(small_scan, CONFIGS[config], 1, seed),
            "flag off, 2 threads": run_network(small_scan, CONFIGS[config], 2, seed),
            "flag off, 2 threads again": run_network(small_scan, CONFIGS[config], 2, seed)}
    backends.deterministic = True
    runs["flag on, 2 threads"] = run_network(small_scan, CONFIGS[config], 2, seed)
    assert_bit_identical(runs)


# --------------------------------------------------------------------------------------------
# 4. bfloat16
# --------------------------------------------------------------------------------------------
BF16_CASES = list(itertools.product(["subm_k3", "k2s2_spconv", "transposed_k3s2p1"], CONFIGS))


DETERMINISTIC_BF16_CASES = list(itertools.product(["subm_k3", "transposed_k3s2p1"], GATHER_SCATTER))


@pytest.mark.parametrize("geometry, config", BF16_CASES, ids=[f"{g}-{c}" for g, c in BF16_CASES])
def test_bfloat16_matches_oracle(geometry, config, gen):
    check_bfloat16_against_oracle(geometry, config, gen)


@pytest.mark.parametrize("geometry, config", DETERMINISTIC_BF16_CASES,
                         ids=[f"{g}-{c}" for g, c in DETERMINISTIC_BF16_CASES])
def test_deterministic_bfloat16_matches_oracle(geometry, config, gen, restore_backends):
    """Deterministic gather_scatter widens bfloat16 rows into float tiles as it gathers."""
    backends.deterministic = True
    check_bfloat16_against_oracle(geometry, config, gen)


def check_bfloat16_against_oracle(geometry, config, gen):
    geom = GEOMETRIES[geometry]
    x = make_input(gen, geom, "lidar", 16, dtype=torch.bfloat16)
    weight = torch.randn(volume(geom["kernel_size"]), 16, 8, generator=gen).bfloat16()
    y, dfeats, dweight, grad = run_ours(x, weight, geom, CONFIGS[config], int(torch.randint(0, 2 ** 31, (1,), generator=gen)))
    assert y.F.dtype == dfeats.dtype == dweight.dtype == torch.bfloat16
    reduced_precision_errors(x, weight, geom, CONFIGS[config], y, dfeats, dweight, grad, f"bf16 {config}")


# --------------------------------------------------------------------------------------------
# 5. Edge cases
# --------------------------------------------------------------------------------------------
EDGE_GRID = list(itertools.product(EDGE_CASES, CONFIGS))


@pytest.mark.parametrize("case, config", EDGE_GRID, ids=[f"{e}-{c}" for e, c in EDGE_GRID])
def test_edge_cases_match_oracle(case, config, gen):
    geom, make_coords, c_in, c_out = EDGE_CASES[case]
    coords = make_coords(gen)
    x = tsp.SparseTensor(torch.randn(len(coords), c_in, generator=gen), coords, stride=geom.get("input_stride", 1))
    weight = torch.randn(volume(geom["kernel_size"]), c_in, c_out, generator=gen)
    y, errors = oracle_errors(x, weight, geom, CONFIGS[config], gen)
    assert y.F.shape == (len(y.C), c_out)
    check_output_coords(x, y, geom)
    assert_small(errors)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_offsets_without_pairs_get_zero_weight_gradient(config, gen):
    """On a plane z = 0 the 18 offsets of a k3 conv with dz != 0 read nothing: their weight
    gradient is exactly zero and the others' is not."""
    coords = planar_coords(gen)
    x = tsp.SparseTensor(torch.randn(len(coords), 3, generator=gen), coords)
    weight = torch.randn(27, 3, 4, generator=gen)
    _, _, dweight, _ = run_ours(x, weight, dict(kernel_size=3), CONFIGS[config], 7)
    dz = torch.arange(27) % 3 - 1  # offset index (i*3 + j)*3 + l, z fastest
    assert torch.count_nonzero(dweight[dz != 0]) == 0
    assert bool((dweight[dz == 0].abs().sum((1, 2)) > 0).all())


@pytest.mark.parametrize("split", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("kernel", [(2, 1, 1), (1, 1, 3), 1])
def test_more_splits_than_offsets(kernel, split, gen):
    """A kernel with fewer offsets than splits runs one split per offset, same result."""
    stride = 2 if kernel == 1 else 1  # a 1x1x1 stride-1 conv needs no map
    geom = dict(kernel_size=kernel, stride=stride)
    coords = random_coords(gen, 200, batch=2, low=-4, high=6)
    x = tsp.SparseTensor(torch.randn(len(coords), 5, generator=gen), coords)
    weight = torch.randn(volume(kernel), 5, 3, generator=gen)
    config = ConvConfig("implicit_gemm", sorted=True, split_mask_num=split)
    _, errors = oracle_errors(x, weight, geom, config, gen)
    assert_small(errors)
