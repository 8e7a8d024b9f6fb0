"""bfloat16 on the CPU: the tile kernels multiply bfloat16 with the CPU's dot-product
instructions (AVX512-BF16) where it has them, and convert to float32 tiles elsewhere. Both
paths against the float64 dense oracle on the rounded values, odd channel counts (the K
dimension is padded to whole pairs), 125 offsets, every dataflow and pass; the dot path agrees
with the float path; autocast runs the convs in bfloat16."""
import os
import re
import subprocess
import sys

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import ops
from torchsparse_pp.nn.functional import ConvConfig
from dataflow_cases import GEOMETRIES, make_input, reduced_precision_errors, rel_to, run_oracle, run_ours, volume
from precision import assert_as_accurate_as_rounded

CONFIGS = {
    "fetch_on_demand": ConvConfig("fetch_on_demand"),
    # One split: the register kernels round their sums straight into the bfloat16 output rows.
    "implicit_gemm_sorted1": ConvConfig("implicit_gemm", sorted=True, split_mask_num=1),
    "implicit_gemm_sorted2": ConvConfig("implicit_gemm", sorted=True, split_mask_num=2),
    "implicit_gemm_unsorted": ConvConfig("implicit_gemm", sorted=False, split_mask_num=0),
    "gather_scatter": ConvConfig("gather_scatter"),
    # Grouped offsets padded to one size: padding rows of the gathered buffer, batched GEMMs.
    "gather_scatter_grouped": ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=50),
}
CASES = [("subm_k3", 3, 5), ("subm_k3", 33, 17), ("subm_k5", 7, 9), ("k3s2p1_spconv", 16, 24),
         ("transposed_k3s2p1", 5, 3), ("generative_k2s2", 2, 1)]


def cpu_has_bf16_dot() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = re.search(r"^flags\s*:(.*)$", f.read(), re.M)
    except OSError:
        return False
    return flags is not None and "avx512_bf16" in flags.group(1).split()


def test_bf16_dot_kernels_run_where_the_cpu_has_them():
    expected = cpu_has_bf16_dot() and os.environ.get("TSPP_DISABLE_BF16_DOT") != "1"
    assert ops.cpu_bf16_dot() == expected


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("geometry, c_in, c_out", CASES, ids=[f"{g}-{a}x{b}" for g, a, b in CASES])
def test_bf16_matches_oracle(geometry, c_in, c_out, config, gen):
    geom = GEOMETRIES[geometry]
    x = make_input(gen, geom, "lidar", c_in, dtype=torch.bfloat16)
    weight = torch.randn(volume(geom["kernel_size"]), c_in, c_out, generator=gen).bfloat16()
    y, dfeats, dweight, grad = run_ours(x, weight, geom, CONFIGS[config], 3)
    assert y.F.dtype == dfeats.dtype == dweight.dtype == torch.bfloat16
    reduced_precision_errors(x, weight, geom, CONFIGS[config], y, dfeats, dweight, grad, f"bf16 {config}")


@pytest.mark.parametrize("config", ["implicit_gemm_sorted1", "implicit_gemm_unsorted"])
def test_bf16_implicit_gemm_with_many_offsets_per_row_group(config, gen):
    """125 offsets on dense random points (~19 neighbours per row): a group of 6 rows has more
    offsets than one register-kernel call takes (64), so its float sums go through the staging
    rows and are rounded there, not in the kernel."""
    geom = GEOMETRIES["subm_k5"]
    x = make_input(gen, geom, "random", 7, dtype=torch.bfloat16)
    weight = torch.randn(volume(geom["kernel_size"]), 7, 19, generator=gen).bfloat16()
    y, _, _, grad = run_ours(x, weight, geom, CONFIGS[config], 3)
    (ref, _, _), _ = run_oracle(x, weight, y.C, geom, grad)
    assert_as_accurate_as_rounded(y.F, ref, what=f"bf16 {config}, 125 offsets")  # implicit GEMM: one rounding


RUN_BOTH = r"""
import sys, torch
sys.path.insert(0, {tests!r})
import torchsparse_pp as tsp
from torchsparse_pp.nn.functional import ConvConfig, conv3d
from conftest import lidar_coords
g = torch.Generator().manual_seed({seed})
coords = lidar_coords({seed} % 1000, batch=2)
out = {{}}
for name, cfg in [("fod", ConvConfig("fetch_on_demand")), ("ig", ConvConfig("implicit_gemm", sorted=True))]:
    f = torch.randn(len(coords), 19, generator=g).bfloat16().requires_grad_(True)
    w = torch.randn(27, 19, 21, generator=g).bfloat16().requires_grad_(True)
    y = conv3d(tsp.SparseTensor(f, coords), w, 3, config=cfg)
    grad = torch.randn(y.F.shape, generator=g).bfloat16()
    y.F.backward(grad)
    # The same sums over absolute values, in float64: the scale of both paths' rounding.
    fa, wa = f.detach().double().abs().requires_grad_(True), w.detach().double().abs().requires_grad_(True)
    ya = conv3d(tsp.SparseTensor(fa, coords), wa, 3)
    ya.F.backward(grad.double().abs())
    out[name] = (y.F.detach(), f.grad, w.grad), (ya.F.detach(), fa.grad, wa.grad)
torch.save((torch.ops.torchsparse_pp.cpu_bf16_dot(), out), {path!r})
"""


@pytest.mark.skipif(not cpu_has_bf16_dot(), reason="the CPU has no AVX512-BF16: only the float path exists")
def test_dot_path_agrees_with_float_path(tmp_path, seed):
    """The same convs with the dot kernels and with them switched off (in fresh processes: the
    switch is read once) agree within bfloat16 output rounding: each path rounds each output once
    (at most 2^-8 of the same sums over absolute values), so they differ by at most 2 x 2^-8 of it."""
    results = {}
    for flag in ("0", "1"):
        path = str(tmp_path / f"out{flag}.pt")
        code = RUN_BOTH.format(tests=os.path.dirname(__file__), seed=seed, path=path)
        env = dict(os.environ, TSPP_DISABLE_BF16_DOT=flag)
        subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)
        results[flag] = torch.load(path)
    assert results["0"][0] is True and results["1"][0] is False
    for name in ("fod", "ig"):
        (dot, _), (plain, magnitude) = results["0"][1][name], results["1"][1][name]
        for a, b, m in zip(dot, plain, magnitude):
            assert rel_to(a, b, m) < 1e-2


def test_autocast_runs_convs_in_bf16(gen):
    coords = tsp.SparseTensor(torch.randn(10, 1), torch.randint(0, 4, (10, 4), dtype=torch.int32)).C
    coords = torch.unique(coords, dim=0)
    x = tsp.SparseTensor(torch.randn(len(coords), 6, generator=gen), coords)
    conv = tsp.nn.Conv3d(6, 8, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(x)
    assert y.F.dtype == torch.bfloat16


@pytest.mark.parametrize("sorted_rows", [True, False])
def test_bf16_implicit_gemm_rows_without_neighbours_are_zero(sorted_rows, gen):
    """A table whose rows have random neighbours, a third of them none at all: the one-split
    bf16 forward (bf16 output rows written by the kernel) gives those rows exact zeros, and the
    others the float64 sums within bf16 rounding."""
    num_src, rows, K, c_in, c_out = 300, 257, 27, 13, 21
    table = torch.randint(-1, num_src, (rows, K), generator=gen, dtype=torch.int32)
    table[torch.rand(rows, generator=gen) < 1 / 3] = -1
    table[torch.rand(rows, K, generator=gen) < 0.6] = -1
    feats = torch.randn(num_src, c_in, generator=gen).bfloat16()
    weight = torch.randn(K, c_in, c_out, generator=gen).bfloat16()
    bounds, order, masks = ops.kmap_plan(table, rows, 1 if sorted_rows else 0, 8, 64)
    out = ops.implicit_gemm_forward(feats, weight, table, rows, False, bounds, order, masks, 8)
    ref = torch.zeros(rows, c_out, dtype=torch.float64)
    for k in range(K):
        present = table[:, k] >= 0
        ref[present] += feats.double()[table[present, k].long()] @ weight.double()[k]
    empty = (table < 0).all(1)
    assert out.dtype == torch.bfloat16 and empty.sum() > 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert_as_accurate_as_rounded(out[~empty], ref[~empty], what="bf16 implicit_gemm rows")


@pytest.mark.parametrize("c_in, c_out", [(40, 48), (64, 128)])
def test_bf16_fetch_on_demand_same_bits_on_any_thread_count(c_in, c_out, seed):
    """The bf16 forward and dgrad on 1-4 threads: the blocks of destination rows (and so where
    each offset's pairs split into register groups) change with the thread count, the bits may
    not."""
    from torchsparse_pp.data import generate_scan
    from torchsparse_pp.nn.functional import conv3d
    from torchsparse_pp.utils import sparse_quantize
    gen = torch.Generator().manual_seed(seed)
    # A whole 32-beam scan at 0.4 m (~7k voxels): several blocks of rows on any thread count.
    voxels = torch.from_numpy(sparse_quantize(generate_scan(32, seed=seed % 1000)["points"][:, :3], 0.4))
    coords = torch.cat([torch.zeros(len(voxels), 1, dtype=torch.int32), voxels.int()], 1)
    feats = torch.randn(len(coords), c_in, generator=gen).bfloat16()
    weight = torch.randn(27, c_in, c_out, generator=gen).bfloat16()
    grad = None
    results = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3, 4):
            torch.set_num_threads(t)
            f = feats.clone().requires_grad_(True)
            y = conv3d(tsp.SparseTensor(f, coords), weight, 3, config=ConvConfig("fetch_on_demand"))
            grad = torch.randn(y.F.shape, generator=gen).bfloat16() if grad is None else grad
            y.F.backward(grad)
            results.append((y.F.detach(), f.grad))
    finally:
        torch.set_num_threads(threads)
    for t, (out, dfeats) in zip((2, 3, 4), results[1:]):
        assert torch.equal(out, results[0][0]), f"forward on {t} threads"
        assert torch.equal(dfeats, results[0][1]), f"dgrad on {t} threads"
