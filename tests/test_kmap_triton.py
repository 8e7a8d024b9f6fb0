"""Kernel maps on Triton kernels (torchsparse_pp.kmap.triton_ops), run by the Triton interpreter.

1. Every build and view equals the compiled ops' (torch.equal: dtype, shape, row order) on fresh
   random sets: uniform boxes (sorted and permuted), shuffled samples with empty ones, LiDAR-like
   crops, one point, none, points at the limits of the packable range; submanifold odd / even
   kernels, dilation, padding; spconv downsampling with and without clip, minkowski, generative;
   the views (pairs, transposed table, its pairs, plans), a KernelMap's transposed reuse and a
   MinkUNet forward over the maps.
2. Bad inputs raise the compiled ops' errors where the builders check data (downsample and
   generative: duplicates, out of range; pairs: rows past num_in) and argument errors everywhere.
3. The GPU cost: host reads and device ops (non-view aten ops plus Triton launches) per build,
   counted with a TorchDispatchMode, against the budget: none for submanifold maps, transposed
   tables and plans; one for a new coordinate set (its size) and for the pair lists (their count).
4. The switch ``backends.kmap_backend = "triton"`` and its dispatch (torch.compile included).
"""
import os
from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import torchsparse_pp as tsp
from torchsparse_pp import backends, ops
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, kmap_backend_for, kmap_ops, strided_map
from torchsparse_pp.kmap import generative_map, submanifold_map
from torchsparse_pp.kmap.kernel_map import PairsView
from torchsparse_pp.utils.gpu_cost import count_gpu_cost
from torchsparse_pp.models import MinkUNet
from torchsparse_pp.ops import kmap_torch
from torchsparse_pp.ops.triton import runtime
from conftest import lidar_coords, random_coords, shuffled_coords
from test_kmap_torch import Raised, assert_same, limit_coords, random_geometry, random_table

if os.environ.get("CI"):
    import triton  # noqa: F401 (CI installs it: a missing triton must fail, not skip)
else:
    pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not runtime.interpreter_requested(),
                                reason="interpreter tests (TRITON_INTERPRET=1, set by conftest without a GPU)")

from torchsparse_pp.kmap import triton_ops  # noqa: E402

PLANS = [(0, 8, 0), (1, 16, 0), (2, 64, 0), (3, 8, 5), (1, 64, 100)]
SUBMANIFOLD = [ConvGeometry.make(3), ConvGeometry.make(2), ConvGeometry.make(5, dilation=2),
               ConvGeometry.make(3, padding=0), ConvGeometry.make(4, dilation=2, padding=3),
               ConvGeometry.make((3, 1, 5), dilation=(1, 2, 1), padding=(1, 0, 4))]
STRIDED = [ConvGeometry.make(2, stride=2), ConvGeometry.make(3, stride=2, padding=1),
           ConvGeometry.make((3, 1, 2), stride=(2, 1, 3), dilation=(1, 1, 2)),
           ConvGeometry.make(3, stride=3, padding=2, dilation=2)]
UNIQUE = "the coordinates of a SparseTensor must be unique"


def outcome(op, module, *args):
    try:
        return getattr(module, op)(*args)
    except (RuntimeError, ValueError) as error:
        return Raised(type(error), str(error).splitlines()[0])


def check(op, *args, what=""):
    """The compiled op and the Triton one: equal results or equal errors; returns the compiled one."""
    native, mine = outcome(op, ops, *args), outcome(op, triton_ops, *args)
    if isinstance(native, Raised) or isinstance(mine, Raised):
        assert mine == native, f"{op} {what}: native gave {native!r:.300}, triton gave {mine!r:.300}"
    else:
        assert_same(native, mine, f"{op} {what}")
    return native


def check_views(out_in, num_in, num_out, what):
    """Pairs, transposed table, its pairs and plans of both tables; returns the pair count."""
    pairs = check("kmap_pairs", out_in, num_in, num_out, what=what)
    in_out = check("kmap_transpose", out_in, num_out, num_in, 128, what=what)
    check("kmap_pairs", in_out, num_out, num_in, what=f"transposed {what}")
    for split, tile, window in PLANS:
        if split <= out_in.shape[1]:
            check("kmap_plan", out_in, num_out, split, tile, window, what=f"{what} {split}/{tile}/{window}")
            check("kmap_plan", in_out, num_in, split, tile, window, what=f"{what} in {split}/{tile}/{window}")
    return int(pairs[2][-1])


def coordinate_sets(generator, seed):
    uniform = random_coords(generator, 500, batch=2, low=-7, high=7)
    return {
        "uniform": uniform,
        "uniform-permuted": uniform[torch.randperm(uniform.shape[0], generator=generator)].contiguous(),
        "shuffled-empty-samples": shuffled_coords(generator, per_batch=(90, 0, 0, 60), low=-5, high=5),
        "lidar": lidar_coords(seed, batch=2, box=10),
        "one-point": random_coords(generator, 1, batch=1, low=-30000, high=30000),
    }


# --- maps and views equal the compiled ops' ----------------------------------------------------------
def test_submanifold_maps_and_views(generator, seed):
    sets = coordinate_sets(generator, seed)
    for geometry in SUBMANIFOLD:
        total = 0
        for name, coords in sets.items():
            out_in = check("kmap_submanifold", coords, geometry.kernel_size, geometry.dilation, geometry.padding,
                           128, what=f"{name} {geometry}")
            n = coords.shape[0]
            if name in ("uniform-permuted", "lidar", "one-point"):
                total += check_views(out_in, n, n, what=f"{name} {geometry}")
        assert total > 0, f"{geometry}: no pairs, so the views went untested"


def test_strided_maps_and_views(generator, seed):
    sets = coordinate_sets(generator, seed)
    for geometry in STRIDED:
        for name, coords in sets.items():
            for mode, clip in (("spconv", None), ("spconv", [4, 7, 3]), ("minkowski", None)):
                out_coords, out_in = check("kmap_downsample", coords, *geometry.args(), mode, clip, 128,
                                           what=f"{name} {geometry} {mode} {clip}")
                if name in ("uniform-permuted", "lidar") and clip is None:
                    check_views(out_in, coords.shape[0], out_coords.shape[0], what=f"{name} {geometry} {mode}")


def test_generative_maps_and_views(generator, seed):
    sets = coordinate_sets(generator, seed)
    for geometry in STRIDED[:3]:
        for name, coords in sets.items():
            for clip in (None, [9, 20, 11]):
                fine, out_in = check("kmap_generative", coords, *geometry.args(), clip, 128,
                                     what=f"{name} {geometry} {clip}")
                if name == "lidar" and clip is None:
                    check_views(out_in, fine.shape[0], coords.shape[0], what=f"generative {geometry}")


def test_random_geometries(generator, seed):
    """Fresh per-axis kernels 1-5, strides 1-3, dilations 1-3 and paddings each run."""
    coords = random_coords(generator, 300, batch=2, low=-6, high=6)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    for i in range(4):
        sub, strided = random_geometry(generator, strided=False), random_geometry(generator, strided=True)
        check("kmap_submanifold", coords, sub.kernel_size, sub.dilation, sub.padding, 64, what=f"draw {i} {sub}")
        for mode in ("spconv", "minkowski"):
            out_coords, out_in = check("kmap_downsample", coords, *strided.args(), mode, None, 32,
                                       what=f"draw {i} {strided} {mode}")
            check("kmap_pairs", out_in, coords.shape[0], out_coords.shape[0], what=f"draw {i} {mode}")
        check("kmap_generative", coords, *strided.args(), None, 16, what=f"draw {i} {strided}")


def test_coordinates_at_the_range_limits(generator):
    """Fields at -32768 / 32767, batch 32767 (whose key is the largest int64): no neighbour across
    packed fields, the same new sets or the same out-of-range errors."""
    coords = limit_coords(generator)
    n = coords.shape[0]
    for ks, dil in (([3, 3, 3], [1, 1, 1]), ([2, 3, 4], [1, 3, 1])):
        pad = [(k - 1) * d // 2 for k, d in zip(ks, dil)]
        out_in = check("kmap_submanifold", coords, ks, dil, pad, 128, what=f"limits {ks}")
        check_views(out_in, n, n, what=f"limits {ks}")
    far = check("kmap_submanifold", coords, [3, 3, 3], [1, 1, 1], [1 << 20, 0, 1], 128, what="far padding")
    assert int(far[:n].max()) == -1
    outcomes = set()
    inner = coords[(coords[:, 1:].abs() < 30000).all(1)].contiguous()
    for geometry in (ConvGeometry.make(2, stride=2), ConvGeometry.make(3, stride=2, padding=1),
                     ConvGeometry.make(1, stride=3)):
        for mode in ("spconv", "minkowski"):
            result = check("kmap_downsample", coords, *geometry.args(), mode, None, 128, what=f"{geometry} {mode}")
            outcomes.add(type(result))
        result = check("kmap_generative", coords, *geometry.args(), None, 128, what=f"{geometry}")
        outcomes.add(type(result))
        check("kmap_generative", inner, *geometry.args(), None, 128, what=f"inner {geometry}")
    assert Raised in outcomes and tuple in outcomes, "the limit cases should both succeed and raise"


def test_empty_inputs_and_tables():
    empty = torch.zeros(0, 4, dtype=torch.int32)
    assert check("kmap_submanifold", empty, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128).shape == (0, 27)
    for mode in ("spconv", "minkowski"):
        check("kmap_downsample", empty, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], mode, None, 128)
    check("kmap_downsample", empty, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], "spconv", [4, 4, 4], 128)
    check("kmap_generative", empty, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128)
    table = torch.full((256, 8), -1, dtype=torch.int32)
    for num_in, num_out in ((0, 0), (5, 7), (7, 7)):
        check("kmap_pairs", table, num_in, num_out)
        check("kmap_transpose", table, num_out, num_in, 128)
        for split, tile, window in PLANS:
            check("kmap_plan", table, num_out, split, tile, window)


@pytest.mark.parametrize("K", [1, 27, 65])
def test_views_of_random_tables(K, generator):
    """Tables that are not kernel maps: random injective offsets, an identity offset, rows that
    are not a tile multiple, more offsets than one program covers."""
    num_out, num_in = 300 + int(torch.randint(0, 100, (1,), generator=generator)), 350
    table = random_table(generator, num_out + 19, K, num_in, 0.5)
    table[num_out:] = -1
    check_views(table, num_in, num_out, what=f"K={K}")
    square = random_table(generator, 200, K, 200, 0.4)
    square[:, K // 2] = torch.arange(200, dtype=torch.int32)
    assert bool(check("kmap_pairs", square, 200, 200, what="square")[3][K // 2])


@pytest.mark.parametrize("K", [1, 27])
def test_bounded_pairs_hold_the_exact_pairs_first(K, generator):
    """The GPU path's pair lists (room for every cell, no host read): their first offsets[K]
    entries are the compiled op's pairs, offsets and identity equal; PairsView.exact() trims."""
    num_out, num_in = 200 + int(torch.randint(0, 50, (1,), generator=generator)), 260
    table = random_table(generator, num_out, K, num_in, 0.5)
    native = ops.kmap_pairs(table, num_in, num_out)
    with count_gpu_cost() as cost:
        bounded = triton_ops.kmap_pairs_bounded(table, num_in, num_out)
    assert cost.host_syncs == 0, cost
    total = int(native[2][-1])
    assert bounded[0].numel() == K * num_out >= total
    assert torch.equal(bounded[0][:total], native[0]) and torch.equal(bounded[1][:total], native[1])
    assert torch.equal(bounded[2], native[2]) and torch.equal(bounded[3], native[3])
    view = PairsView(*bounded, bounded=True)
    assert all(torch.equal(a, b) for a, b in zip(view.exact(), native[:2]))


def test_kernel_maps_reuse_their_views_transposed(generator, seed, monkeypatch):
    """Maps built with kmap_backend = 'triton' remember it; their transposed views (in_out, pairs
    by input, plans of in_out) equal the native ones."""
    coords = lidar_coords(seed, batch=2, box=10)
    built = {}
    for name in ("native", "triton"):
        monkeypatch.setattr(backends, "kmap_backend", name)
        cache = KernelMapCache()
        geometry = ConvGeometry.make(3, stride=2, padding=1)
        built[name] = (submanifold_map(cache, coords, ConvGeometry.make(3), None),
                       strided_map(cache, coords, geometry, "spconv", None),
                       strided_map(cache, coords, ConvGeometry.make(2, stride=2), "minkowski", None),
                       generative_map(cache, coords, geometry, None))
        assert all(m.backend == name for m in built[name])
    for native, mine in zip(*built.values()):
        assert_same(native.out_coords, mine.out_coords, "out_coords")
        assert_same(native.out_in, mine.out_in, "out_in")
        assert_same(native.in_out, mine.in_out, "in_out")
        for side in ("out", "in"):
            a, b = native.pairs_sorted_by(side), mine.pairs_sorted_by(side)
            assert_same((a.in_idx, a.out_idx, a.offsets, a.identity), (b.in_idx, b.out_idx, b.offsets, b.identity),
                        f"{native} pairs by {side}")
            assert_same(native.plan(side, 2, 16, 0), mine.plan(side, 2, 16, 0), f"{native} plan {side}")


def test_minkunet_over_triton_maps_equals_native(generator):
    """A whole forward (submanifold, strided, transposed maps and their views) with maps from
    either backend: the same maps give bit-identical outputs."""
    model = MinkUNet(in_channels=4, num_classes=5, cr=0.125).eval()
    coords = random_coords(generator, 300, batch=2, low=-8, high=8)
    feats = torch.randn(coords.shape[0], 4, generator=generator)
    outputs = {}
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        for name in ("native", "triton"):
            patch.setattr(backends, "kmap_backend", name)
            outputs[name] = model(tsp.SparseTensor(feats, coords))
    assert torch.equal(outputs["native"], outputs["triton"])


# --- errors ----------------------------------------------------------------------------------------
def same_error(pattern, op, *args):
    with pytest.raises(RuntimeError, match=pattern) as native:
        getattr(ops, op)(*args)
    with pytest.raises(RuntimeError) as mine:
        getattr(triton_ops, op)(*args)
    assert str(mine.value) == str(native.value)


def test_duplicates_and_out_of_range_raise_the_same_errors(generator):
    coords = random_coords(generator, 300, batch=2, low=-6, high=6)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    rows = torch.randperm(coords.shape[0], generator=generator)[:4].tolist()
    dup = coords.clone()
    dup[rows[0]], dup[rows[1]] = dup[rows[2]], dup[rows[3]]
    for mode in ("spconv", "minkowski"):
        same_error(rf"duplicate coordinate \(.*\) at rows \d+ and \d+: {UNIQUE}", "kmap_downsample", dup,
                   [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], mode, None, 128)
    same_error(r"duplicate coordinate \(.*\) at rows", "kmap_generative", dup, [2, 2, 2], [2, 2, 2], [1, 1, 1],
               [0, 0, 0], None, 128)
    far = coords.clone()
    far[77, 3], far[33, 1] = 32767, -32768
    outside = r"input row 33 produces an output coordinate outside the supported range"
    same_error(outside, "kmap_generative", far, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], None, 128)
    same_error(outside, "kmap_downsample", far, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], "spconv", None, 128)
    check("kmap_downsample", far, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], "minkowski", None, 128)
    bad = coords.clone()
    bad[12, 0], bad[40, 2] = -2, 40000
    for mode in ("spconv", "minkowski"):
        same_error(r"coords row 12 = \(-2, .*\) is outside", "kmap_downsample", bad, [2, 2, 2], [2, 2, 2],
                   [1, 1, 1], [0, 0, 0], mode, None, 128)
    same_error(r"coords row 12 = \(-2, .*\) is outside", "kmap_generative", bad, [2, 2, 2], [2, 2, 2], [1, 1, 1],
               [0, 0, 0], None, 128)


def test_argument_and_view_errors_are_the_same(generator):
    coords = random_coords(generator, 200, batch=1, low=-5, high=5)
    n = coords.shape[0]
    sub = ([3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    down = ([2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0])
    same_error(r"coords must have shape \[N, 4\]", "kmap_submanifold", coords[:, :3].contiguous(), *sub)
    same_error(r"coords must be int32 .*got Long", "kmap_downsample", coords.long(), *down, "spconv", None, 128)
    same_error(r"kernel_size must be in \[1, 32\]", "kmap_submanifold", coords, [33, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    same_error(r"padding must be at most 2\^20", "kmap_submanifold", coords, [3, 3, 3], [1, 1, 1],
               [(1 << 20) + 1, 0, 1], 128)
    same_error(r"unknown downsample mode 'dense'", "kmap_downsample", coords, *down, "dense", None, 128)
    same_error(r"out_range does not apply to the minkowski", "kmap_downsample", coords, *down, "minkowski",
               [4, 4, 4], 128)
    same_error(r"out_range must be positive", "kmap_generative", coords, *down, [4, 0, 4], 128)
    same_error(r"pad_rows_to must be >= 1", "kmap_generative", coords, *down, None, -3)
    out_in = ops.kmap_submanifold(coords, *sub)
    same_error(r"out_in holds input rows >= num_in", "kmap_pairs", out_in, n - 5, n)
    same_error(r"exceeds the rows of out_in", "kmap_pairs", out_in, n, out_in.shape[0] + 1)
    same_error(r"out_in must be an int32 \[rows, K\] map, got Long", "kmap_pairs", out_in.long(), n, n)
    same_error(r"split_mask_num must be in \[0, K = 27\]", "kmap_plan", out_in, n, 28, 8)
    same_error(r"num rows \(\d+\) must be in", "kmap_plan", out_in, out_in.shape[0] + 1, 1, 8)
    same_error(r"pad_rows_to must be >= 1", "kmap_transpose", out_in, n, n, 0)
    # The native message names the CPU; torch_ops' and this one name no device.
    for module in (ops, triton_ops):
        with pytest.raises(RuntimeError, match=r"the map must be a contiguous int32 \[rows, K = \d+\]"):
            module.kmap_transpose(out_in.t(), 27, n, 128)


def test_transpose_skips_entries_it_does_not_check(generator):
    """kmap_transpose reads nothing back, so it cannot raise for a corrupt table: it writes only
    what lies in range (no write outside in_out), as the transpose of the table without them."""
    coords = random_coords(generator, 200, batch=1, low=-5, high=5)
    n = coords.shape[0]
    out_in = ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    corrupt = out_in.clone()
    corrupt[3, 4], corrupt[5, 6] = -7, n + 1000
    cleaned = corrupt.clone()
    cleaned[3, 4] = cleaned[5, 6] = -1
    assert_same(ops.kmap_transpose(cleaned, n, n, 128), triton_ops.kmap_transpose(corrupt, n, n, 128), "transpose")


# --- what a build costs the GPU ------------------------------------------------------------------------
HOST_READ_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::_unique2", "aten::unique_dim",
                 "aten::unique_consecutive", "aten::masked_select"}


class CostCounter(TorchDispatchMode):
    """Non-view aten ops and host reads (ops that return data to the host, indexing by bool masks)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()
        self.reads = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in HOST_READ_OPS:
            self.reads[name] += 1
        if name.startswith("aten::index") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for a in args if isinstance(a, (list, tuple)) for i in a):
            self.reads[f"{name} (bool mask)"] += 1
        if not func.is_view:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def counted():
    """Counts within the block: aten ops and host reads (CostCounter), host copies through
    tolist / cpu / item / numpy (which on CPU tensors do not dispatch), and Triton launches
    (whose interpreted bodies run with the counter off)."""
    counter = CostCounter()
    counter.launches = Counter()
    with pytest.MonkeyPatch.context() as patch, counter:
        _patch_reads_and_launches(patch, counter)
        yield counter


def _patch_reads_and_launches(monkeypatch, counter):
    for method in ("tolist", "cpu", "item", "numpy"):
        original = getattr(torch.Tensor, method)

        def read(self, *args, _original=original, _method=method, **kwargs):
            counter.reads[f"Tensor.{_method}"] += 1
            with _disable_current_modes():
                return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, method, read)
    kernels = triton_ops.load("kmap")
    for name in dir(kernels):
        kernel = getattr(kernels, name)
        if name.endswith("_kernel") and hasattr(kernel, "run"):
            def launch(*args, _run=kernel.run, _name=name, **kwargs):
                counter.launches[_name] += 1
                with _disable_current_modes():
                    return _run(*args, **kwargs)
            monkeypatch.setattr(kernel, "run", launch)


def test_host_reads_and_device_ops_per_build(seed):
    coords = lidar_coords(seed, batch=2, box=10)
    n = coords.shape[0]
    g = ConvGeometry.make(3, stride=2, padding=1)
    builds = {
        "submanifold": (lambda: triton_ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128), 0, 15),
        "spconv": (lambda: triton_ops.kmap_downsample(coords, *g.args(), "spconv", None, 128), 1, 30),
        "spconv-clipped": (lambda: triton_ops.kmap_downsample(coords, *g.args(), "spconv", [8, 8, 8], 128), 1, 30),
        "minkowski": (lambda: triton_ops.kmap_downsample(coords, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0],
                                                         "minkowski", None, 128), 1, 30),
        "generative": (lambda: triton_ops.kmap_generative(coords, *g.args(), None, 128), 1, 30),
    }
    out_in = ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    views = {
        "pairs": (lambda: triton_ops.kmap_pairs(out_in, n, n), 1, 15),
        "transpose": (lambda: triton_ops.kmap_transpose(out_in, n, n, 128), 0, 5),
        "plan": (lambda: triton_ops.kmap_plan(out_in, n, 2, 64, 0), 0, 60),
    }
    for name, (build, reads_allowed, ops_allowed) in {**builds, **views}.items():
        with counted() as cost:
            build()
        reads = sum(cost.reads.values())
        device_ops = sum(cost.ops.values()) + sum(cost.launches.values())
        assert reads == reads_allowed, f"{name}: {reads} host reads ({dict(cost.reads)}), budget {reads_allowed}"
        assert device_ops <= ops_allowed, \
            f"{name}: {device_ops} device ops ({dict(cost.ops)}, launches {dict(cost.launches)}), budget {ops_allowed}"
        assert sum(cost.launches.values()) > 0 or name == "plan", f"{name}: no Triton launch was counted"


def test_the_counter_sees_host_reads():
    """The budget test can fail: torch_ops' builders read the host many times."""
    from torchsparse_pp.kmap import torch_ops
    coords = random_coords(torch.Generator().manual_seed(0), 100, batch=1)
    with counted() as cost:
        torch_ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    assert sum(cost.reads.values()) >= 2 and sum(cost.ops.values()) > 15


# --- the switch --------------------------------------------------------------------------------------
def test_kmap_backend_triton(monkeypatch):
    monkeypatch.setattr(backends, "kmap_backend", "triton")
    assert kmap_backend_for(torch.device("cpu")) == "triton"
    assert kmap_ops("triton") is triton_ops
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert kmap_ops("triton") is kmap_torch  # compiled graphs: one custom op per build
    monkeypatch.undo()
    monkeypatch.setattr(backends, "kmap_backend", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"kmap_backend = 'triton' cannot build maps of cpu tensors here: .*"
                                           r"only under the Triton interpreter"):
        kmap_backend_for(torch.device("cpu"))
    monkeypatch.setattr(backends, "kmap_backend", None)
    assert kmap_backend_for(torch.device("cpu")) == "native"  # the default is unchanged
