"""Kernel maps in plain torch ops (torchsparse_pp.kmap.torch_ops) against the compiled ops.

Every build and view must be identical (torch.equal, same dtype and shape) and every bad input
must raise the same error, on fresh random inputs each run (the seed is printed; replay with
TSPP_TEST_SEED): uniform boxes with negative coordinates, shuffled multi-sample sets with empty
samples, LiDAR-like crops, coordinates at the limits of the packable range. Then the switch
``backends.kmap_backend`` and end-to-end convolutions with either backend.
"""
import re
from typing import NamedTuple

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import backends, ops
from torchsparse_pp.kmap import (ConvGeometry, KernelMapCache, generative_map, kmap_backend_for, kmap_ops,
                                 strided_map, submanifold_map, torch_ops)
from torchsparse_pp.nn.functional import ConvConfig, conv3d
from conftest import lidar_coords, random_coords, shuffled_coords

OPS = ("kmap_submanifold", "kmap_downsample", "kmap_generative", "kmap_pairs", "kmap_transpose", "kmap_plan")
# Every split count and tile size, sorted over all rows or in windows. (The native plan pays a
# 2^16-bucket histogram per window, so very small windows run on small tables only.)
PLAN_CONFIGS = [(split, tile, window) for split in range(5) for tile in (8, 16, 64, 128) for window in (0, 64)]
SMALL_WINDOWS = [(1, 8, 1), (2, 16, 3), (3, 64, 7), (4, 8, 5)]
SOME_PLANS = [(0, 8, 0), (1, 16, 0), (2, 64, 0), (3, 128, 0), (4, 8, 0), (1, 64, 512), (2, 16, 300)]
LIMITS = (-32768, -32767, -1, 0, 1, 32766, 32767)


# --- helpers ---------------------------------------------------------------------------------------
def assert_same(native, torch_result, what: str) -> None:
    if isinstance(native, tuple):
        assert isinstance(torch_result, tuple) and len(torch_result) == len(native), what
        for i, (a, b) in enumerate(zip(native, torch_result)):
            assert_same(a, b, f"{what}[{i}]")
        return
    assert torch_result.dtype == native.dtype and torch_result.shape == native.shape, \
        f"{what}: torch {torch_result.dtype} {tuple(torch_result.shape)} vs native {native.dtype} {tuple(native.shape)}"
    assert torch.equal(torch_result, native), f"{what}: torch and native results differ"


class Raised(NamedTuple):
    kind: type
    message: str  # first line


def outcome(op: str, module, *args):
    """The op's result, or the error it raised."""
    try:
        return getattr(module, op)(*args)
    except (RuntimeError, ValueError) as error:
        return Raised(type(error), str(error).splitlines()[0])


def check(op: str, *args, what: str = ""):
    """Runs op natively and in torch ops: equal results or equal errors. Returns the native one."""
    native, mine = outcome(op, ops, *args), outcome(op, torch_ops, *args)
    label = f"{op} {what}"
    if isinstance(native, Raised) or isinstance(mine, Raised):
        assert mine == native, f"{label}: native gave {native!r:.300}, torch gave {mine!r:.300}"
    else:
        assert_same(native, mine, label)
    return native


def same_error(pattern: str, op: str, *args) -> None:
    """Both implementations raise RuntimeError with the same message, which matches pattern."""
    with pytest.raises(RuntimeError) as native:
        getattr(ops, op)(*args)
    with pytest.raises(RuntimeError) as mine:
        getattr(torch_ops, op)(*args)
    assert re.search(pattern, str(native.value)), str(native.value)
    assert str(mine.value) == str(native.value)


def check_views(out_in: torch.Tensor, num_in: int, num_out: int, plans=PLAN_CONFIGS, what: str = "",
                require_pairs: bool = True) -> int:
    """pairs, transposed table, its pairs and plans of both tables agree; returns the pair count.
    A sparse set (a LiDAR crop) may have no pairs for a wide dilated kernel: then the caller
    asserts on the total over its sets instead."""
    pairs = check("kmap_pairs", out_in, num_in, num_out, what=what)
    count = int(pairs[2][-1])
    assert count > 0 or not require_pairs, f"{what}: a map without pairs tests nothing"
    in_out = check("kmap_transpose", out_in, num_out, num_in, 128, what=what)
    check("kmap_pairs", in_out, num_out, num_in, what=f"transposed {what}")
    for split, tile, window in plans:
        if split > out_in.shape[1]:
            continue
        check("kmap_plan", out_in, num_out, split, tile, window, what=f"{what} out {split}/{tile}/{window}")
        check("kmap_plan", in_out, num_in, split, tile, window, what=f"{what} in {split}/{tile}/{window}")
    return count


def coordinate_sets(generator, seed):
    """Uniform with negatives (sorted and permuted), shuffled samples with empty ones, LiDAR-like."""
    uniform = random_coords(generator, 2000, batch=2, low=-20, high=20)
    gaps = shuffled_coords(generator, per_batch=(170, 0, 0, 130, 0), low=-6, high=6)
    return {
        "uniform": uniform,
        "uniform-permuted": uniform[torch.randperm(uniform.shape[0], generator=generator)].contiguous(),
        "shuffled-empty-samples": gaps,
        "lidar": lidar_coords(seed, batch=2),
    }


def limit_coords(generator) -> torch.Tensor:
    """Points at the edges of the packable range (batch 0 and 32767 too), shuffled."""
    coords = torch.tensor([[b, x, y, z] for b in (0, 1, 32767) for x in LIMITS for y in LIMITS[:4]
                           for z in LIMITS[3:]], dtype=torch.int32)
    return coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()


def random_geometry(generator, strided: bool) -> ConvGeometry:
    """Per-axis kernel 1-5, stride 1-3 (2-3 on some axis when strided), dilation 1-3, padding up
    to the kernel extent."""
    def draw(low, high):
        return [int(v) for v in torch.randint(low, high + 1, (3,), generator=generator)]
    ks, dil = draw(1, 5), draw(1, 3)
    stride = draw(1, 3)
    if strided and max(stride) == 1:
        stride[int(torch.randint(0, 3, (1,), generator=generator))] = 2
    if not strided:
        stride = [1, 1, 1]
    pad = [int(torch.randint(0, d * (k - 1) + 1, (1,), generator=generator)) for k, d in zip(ks, dil)]
    return ConvGeometry.make(ks, stride, dil, pad)


# --- builds ----------------------------------------------------------------------------------------
SUBMANIFOLD_GEOMETRIES = [
    ConvGeometry.make(3), ConvGeometry.make(5, dilation=2), ConvGeometry.make(2), ConvGeometry.make(3, padding=0),
    ConvGeometry.make((3, 1, 5), dilation=(1, 2, 1), padding=(1, 0, 4)), ConvGeometry.make(4, dilation=2, padding=3),
    ConvGeometry.make((1, 3, 2), dilation=(3, 1, 2), padding=(0, 2, 1)),
]


@pytest.mark.parametrize("geometry", SUBMANIFOLD_GEOMETRIES, ids=repr)
def test_submanifold_maps_and_views(geometry, generator, seed):
    total = 0
    for name, coords in coordinate_sets(generator, seed).items():
        out_in = check("kmap_submanifold", coords, geometry.kernel_size, geometry.dilation, geometry.padding, 128,
                       what=name)
        n = coords.shape[0]
        plans = PLAN_CONFIGS + SMALL_WINDOWS if name == "lidar" else SOME_PLANS
        total += check_views(out_in, n, n, plans, what=f"{name} {geometry}", require_pairs=False)
    assert total > 0, f"{geometry}: no coordinate set had pairs, so the views went untested"


DOWNSAMPLE_CASES = [
    (ConvGeometry.make(2, stride=2), "spconv"),
    (ConvGeometry.make(3, stride=2, padding=1), "spconv"),
    (ConvGeometry.make((3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0)), "spconv"),
    (ConvGeometry.make(3, stride=3, padding=2, dilation=2), "spconv"),
    (ConvGeometry.make((2, 3, 1), stride=(2, 1, 3), dilation=(2, 1, 1), padding=(0, 1, 0)), "spconv"),
    (ConvGeometry.make(1, stride=2), "spconv"),
    (ConvGeometry.make(5, stride=(3, 2, 1), dilation=(1, 3, 2), padding=(4, 1, 0)), "spconv"),
    (ConvGeometry.make(2, stride=2), "minkowski"),
    (ConvGeometry.make(3, stride=2, padding=1), "minkowski"),
    (ConvGeometry.make((3, 1, 2), stride=(2, 1, 3), dilation=(1, 1, 2)), "minkowski"),
    (ConvGeometry.make((4, 2, 5), stride=3, dilation=(2, 3, 1), padding=(1, 0, 2)), "minkowski"),
]


@pytest.mark.parametrize("geometry,mode", DOWNSAMPLE_CASES, ids=repr)
def test_downsample_maps_and_views(geometry, mode, generator, seed):
    for name, coords in coordinate_sets(generator, seed).items():
        out_coords, out_in = check("kmap_downsample", coords, *geometry.args(), mode, None, 128, what=name)
        if name in ("uniform-permuted", "lidar"):
            check_views(out_in, coords.shape[0], out_coords.shape[0], SOME_PLANS, what=f"{name} {mode}")


@pytest.mark.parametrize("geometry", [ConvGeometry.make(2, stride=2), ConvGeometry.make(3, stride=2, padding=1),
                                      ConvGeometry.make((3, 1, 2), stride=(2, 1, 3), dilation=(1, 1, 2)),
                                      ConvGeometry.make((5, 2, 3), stride=(1, 3, 2), dilation=(2, 1, 3),
                                                        padding=(3, 1, 0))], ids=repr)
def test_generative_maps_and_views(geometry, generator, seed):
    for name, coords in coordinate_sets(generator, seed).items():
        for out_range in (None, [9, 30, 17]):
            fine, out_in = check("kmap_generative", coords, *geometry.args(), out_range, 128,
                                 what=f"{name} {out_range}")
            if out_range is None and name != "uniform":
                check_views(out_in, fine.shape[0], coords.shape[0], SOME_PLANS, what=f"generative {name}")


def test_every_small_strided_geometry(generator):
    """Every kernel 1-4 x stride 1-3 x dilation 1-3 x padding 0-2 (one axis each, so one- and
    multi-tap residues mix: the native builder has a one-candidate fast path for geometries
    where every residue of every axis has one tap, e.g. k2 s2, and not for k2 s2 d2)."""
    coords = random_coords(generator, 400, batch=2, low=-9, high=9)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    for k in range(1, 5):
        for s in range(1, 4):
            for d in range(1, 4):
                for pad in range(3):
                    for geometry in (ConvGeometry.make(k, stride=s, dilation=d, padding=pad),
                                     ConvGeometry.make((k, 2, 2), stride=(s, 2, 2), dilation=(d, 1, 3),
                                                       padding=(pad, 0, 1))):
                        for mode in ("spconv", "minkowski"):
                            check("kmap_downsample", coords, *geometry.args(), mode, None, 16, what=f"{geometry} {mode}")
                        check("kmap_downsample", coords, *geometry.args(), "spconv", [7, 9, 11], 16, what=f"{geometry}")


def test_out_range_clips_like_native(generator):
    coords = random_coords(generator, 1500, batch=3, low=0, high=12)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    for geometry in (ConvGeometry.make(3, stride=2, padding=0), ConvGeometry.make(2, stride=2),
                     ConvGeometry.make((3, 2, 5), stride=(2, 3, 1), padding=(1, 0, 3))):
        for out_range in ([4, 3, 5], [1, 7, 2], list(geometry.dense_output_size((12, 12, 12))), [40, 1, 40]):
            out_coords, _ = check("kmap_downsample", coords, *geometry.args(), "spconv", out_range, 128,
                                  what=f"{geometry} {out_range}")
            assert bool((out_coords[:, 1:] < torch.tensor(out_range)).all())
            check("kmap_generative", coords, *geometry.args(), out_range, 128, what=f"{geometry} {out_range}")


def test_random_geometries(generator, seed):
    """Fresh per-axis geometries each run, on a uniform set and a LiDAR-like crop."""
    sets = {"uniform": random_coords(generator, 1200, batch=2, low=-12, high=12), "lidar": lidar_coords(seed)}
    for i in range(12):
        sub, strided = random_geometry(generator, strided=False), random_geometry(generator, strided=True)
        for name, coords in sets.items():
            what = f"{name} draw {i}"
            out_in = check("kmap_submanifold", coords, sub.kernel_size, sub.dilation, sub.padding, 64,
                           what=f"{what} {sub}")
            check("kmap_pairs", out_in, coords.shape[0], coords.shape[0], what=f"{what} {sub}")
            for mode in ("spconv", "minkowski"):
                out_coords, out_in = check("kmap_downsample", coords, *strided.args(), mode, None, 32,
                                           what=f"{what} {strided} {mode}")
                check("kmap_transpose", out_in, out_coords.shape[0], coords.shape[0], 32, what=f"{what} {mode}")
            check("kmap_generative", coords, *strided.args(), None, 16, what=f"{what} {strided}")


def test_coordinates_at_the_range_limits(generator):
    """Negative and extreme fields, batch 32767: no neighbour across packed fields, the same
    outputs or the same out-of-range errors."""
    coords = limit_coords(generator)
    n = coords.shape[0]
    for ks, dil in (([3, 3, 3], [1, 1, 1]), ([5, 5, 5], [2, 2, 2]), ([2, 3, 4], [1, 3, 1])):
        pad = [(k - 1) * d // 2 for k, d in zip(ks, dil)]
        out_in = check("kmap_submanifold", coords, ks, dil, pad, 128, what=f"{ks} {dil}")
        check_views(out_in, n, n, SOME_PLANS, what=f"limits {ks}")
    far_padding = check("kmap_submanifold", coords, [3, 3, 3], [1, 1, 1], [1 << 20, 0, 1], 128, what="far padding")
    assert int(far_padding[:n].max()) == -1  # every offset moves x by about 2^20, past the whole range
    same_error(r"padding must be at most 2\^20", "kmap_submanifold", coords, [3, 3, 3], [1, 1, 1],
               [(1 << 20) + 1, 0, 1], 128)
    outcomes = set()
    for geometry in (ConvGeometry.make(2, stride=2), ConvGeometry.make(3, stride=2, padding=1),
                     ConvGeometry.make(3, stride=1, padding=1), ConvGeometry.make(1, stride=3),
                     ConvGeometry.make((5, 1, 3), stride=(3, 2, 1), dilation=(2, 1, 1), padding=(4, 0, 0))):
        for mode in ("spconv", "minkowski"):
            result = check("kmap_downsample", coords, *geometry.args(), mode, None, 128, what=f"{geometry} {mode}")
            outcomes.add("error" if isinstance(result, Raised) else "ok")
        for out_range in (None, [60000, 5, 70000]):
            result = check("kmap_generative", coords, *geometry.args(), out_range, 128, what=f"{geometry}")
            outcomes.add("error" if isinstance(result, Raised) else "ok")
        # The same points moved away from the limits: every map exists.
        inner = coords[(coords[:, 1:].abs() < 30000).all(1)]
        check("kmap_generative", inner, *geometry.args(), None, 128, what=f"inner {geometry}")
    assert outcomes == {"ok", "error"}, "the limit cases should both succeed and raise"


def test_empty_inputs():
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
        for split, tile, window in SOME_PLANS:
            check("kmap_plan", table, num_out, split, tile, window)


# --- views of arbitrary tables ---------------------------------------------------------------------
def random_table(generator, rows, K, num_in, fill):
    """A valid map: per offset a random injective assignment of inputs to some outputs."""
    table = torch.full((rows, K), -1, dtype=torch.int32)
    for k in range(K):
        take = torch.rand(rows, generator=generator) < fill
        n = min(int(take.sum()), num_in)
        chosen = torch.nonzero(take)[:n, 0]
        table[chosen, k] = torch.randperm(num_in, generator=generator)[:n].int()
    return table


@pytest.mark.parametrize("K", [1, 8, 27, 63, 64, 65, 125])
def test_views_of_random_tables(K, generator):
    """Wide maps (two mask words at K = 65 and 125, the sign bit at K = 64), rows that are not
    a tile multiple, identity offsets, every plan combination."""
    num_out, num_in = 700 + int(torch.randint(0, 300, (1,), generator=generator)), 800
    fill = float(torch.rand(1, generator=generator)) * 0.6 + 0.2
    table = random_table(generator, num_out + 57, K, num_in, fill)
    table[num_out:] = -1
    check_views(table, num_in, num_out, PLAN_CONFIGS, what=f"K={K}")
    for split, tile, window in SMALL_WINDOWS:  # on the first rows only (see SMALL_WINDOWS)
        if split <= K:
            check("kmap_plan", table, 150, split, tile, window, what=f"K={K} {split}/{tile}/{window}")
    square = random_table(generator, 600, K, 600, fill)
    square[:, K // 2] = torch.arange(600, dtype=torch.int32)  # an identity offset
    identity = check("kmap_pairs", square, 600, 600, what="square")[3]
    assert bool(identity[K // 2])
    if K == 64:
        masks = check("kmap_plan", table, num_out, 1, 8, 0)[2]
        assert bool((masks < 0).any()), "offset 63 sets the sign bit of the mask word"
    # Few distinct masks: long runs of equal keys, where only a stable sort keeps the row order.
    sparse = table.clone()
    sparse[:, 2:] = -1
    check_views(sparse, num_in, num_out, [(1, 8, 0), (1, 16, 5), (2, 64, 0)], what=f"two offsets of K={K}")


def test_plan_of_a_125_offset_map(generator, seed):
    """5x5x5 kernels: 125 offsets, two mask words per row with one split."""
    coords = lidar_coords(seed, batch=2)
    n = coords.shape[0]
    out_in = check("kmap_submanifold", coords, [5, 5, 5], [1, 1, 1], [2, 2, 2], 128)
    masks = check("kmap_plan", out_in, n, 1, 16, 0)[2]
    assert masks.shape[-1] == 2
    check_views(out_in, n, n, PLAN_CONFIGS + SMALL_WINDOWS, what="k5")


# --- errors ----------------------------------------------------------------------------------------
UNIQUE = "the coordinates of a SparseTensor must be unique"


def test_duplicates_raise_the_same_errors(generator):
    coords = random_coords(generator, 600, batch=3, low=-8, high=8)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    rows = torch.randperm(coords.shape[0], generator=generator)[:4].tolist()
    dup = coords.clone()
    dup[rows[0]], dup[rows[1]] = dup[rows[2]], dup[rows[3]]
    sub = ([3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    same_error(rf"duplicate coordinate \(.*\) at rows \d+ and \d+: {UNIQUE}", "kmap_submanifold", dup, *sub)
    for mode in ("spconv", "minkowski"):
        for geometry in (ConvGeometry.make(3, stride=2, padding=1), ConvGeometry.make(2, stride=2)):
            same_error(rf"duplicate coordinate \(.*\) at rows \d+ and \d+: {UNIQUE}", "kmap_downsample", dup,
                       *geometry.args(), mode, None, 128)
    same_error(rf"duplicate coordinate \(.*\) at rows \d+ and \d+", "kmap_generative", dup, [2, 2, 2], [2, 2, 2],
               [1, 1, 1], [0, 0, 0], None, 128)
    # A triple and a second pair: the reported rows are the smallest such.
    many = coords.clone()
    many[rows[0]] = many[rows[1]] = many[rows[2]]
    many[5] = many[rows[3]]
    same_error(r"duplicate coordinate", "kmap_submanifold", many, *sub)
    same_error(r"duplicate coordinate \(.*\) at rows", "kmap_downsample", many, [3, 3, 3], [2, 2, 2], [1, 1, 1],
               [1, 1, 1], "spconv", None, 128)


def test_out_of_range_raises_the_same_errors(generator):
    coords = random_coords(generator, 500, batch=2, low=-8, high=8)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    far = coords.clone()
    far[77, 3], far[33, 1] = 32767, -32768
    outside = r"input row 33 produces an output coordinate outside the supported range"
    same_error(outside, "kmap_generative", far, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], None, 128)
    same_error(outside, "kmap_downsample", far, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], "spconv", None, 128)
    # Minkowski keeps floor(p / s) in range, and drops reached coordinates outside it.
    check("kmap_downsample", far, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], "minkowski", None, 128)
    bad = coords.clone()
    bad[12, 0], bad[40, 2] = -2, 40000
    same_error(r"coords row 12 = \(-2, .*\) is outside the supported coordinate range", "kmap_submanifold", bad,
               [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    same_error(r"coords row 12 = \(-2, .*\) is outside", "kmap_generative", bad, [2, 2, 2], [2, 2, 2], [1, 1, 1],
               [0, 0, 0], None, 128)
    for mode in ("spconv", "minkowski"):
        same_error(r"coords row 12 = \(-2, .*\) is outside", "kmap_downsample", bad, [2, 2, 2],
                   [2, 2, 2], [1, 1, 1], [0, 0, 0], mode, None, 128)
    # A large stride would bring x = 40000 back into range: the input itself is checked.
    fine = coords.clone()
    fine[40, 1] = 40000
    same_error(r"coords row 40 = \(\d+, 40000, .*\) is outside", "kmap_downsample", fine, [2, 2, 2], [4, 4, 4],
               [1, 1, 1], [0, 0, 0], "spconv", None, 128)


def test_bad_arguments_raise_the_same_errors(generator):
    coords = random_coords(generator, 300, batch=1, low=-6, high=6)
    sub = ([3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    down = ([2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0])
    same_error(r"coords must have shape \[N, 4\]", "kmap_submanifold", coords[:, :3].contiguous(), *sub)
    same_error(r"coords must be int32 .*got Long", "kmap_submanifold", coords.long(), *sub)
    same_error(r"kernel_size must be in \[1, 32\]", "kmap_submanifold", coords, [33, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    same_error(r"must have 3 entries", "kmap_submanifold", coords, [3, 3], [1, 1, 1], [1, 1, 1], 128)
    same_error(r"dilation must be >= 1", "kmap_submanifold", coords, [3, 3, 3], [0, 1, 1], [1, 1, 1], 128)
    same_error(r"padding must be >= 0", "kmap_submanifold", coords, [3, 3, 3], [1, 1, 1], [1, -1, 1], 128)
    same_error(r"pad_rows_to must be >= 1", "kmap_submanifold", coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 0)
    same_error(r"stride must be >= 1", "kmap_downsample", coords, [2, 2, 2], [2, 0, 2], [1, 1, 1], [0, 0, 0],
               "spconv", None, 128)
    same_error(r"unknown downsample mode 'dense'", "kmap_downsample", coords, *down, "dense", None, 128)
    same_error(r"out_range does not apply to the minkowski", "kmap_downsample", coords, *down, "minkowski",
               [4, 4, 4], 128)
    same_error(r"out_range must be positive", "kmap_generative", coords, *down, [4, 0, 4], 128)
    same_error(r"out_range must have 3 entries", "kmap_downsample", coords, *down, "spconv", [4, 4], 128)
    same_error(r"pad_rows_to must be >= 1", "kmap_generative", coords, *down, None, -3)


def test_view_errors_are_the_same(generator):
    coords = random_coords(generator, 300, batch=1, low=-6, high=6)
    n = coords.shape[0]
    out_in = ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    same_error(r"out_in holds input rows >= num_in", "kmap_pairs", out_in, n - 5, n)
    same_error(r"exceeds the rows of out_in", "kmap_pairs", out_in, n, out_in.shape[0] + 1)
    same_error(r"num_in and num_out must be >= 0", "kmap_pairs", out_in, -1, n)
    same_error(r"out_in must be an int32 \[rows, K\] map, got Long", "kmap_pairs", out_in.long(), n, n)
    same_error(r"split_mask_num must be in \[0, K = 27\]", "kmap_plan", out_in, n, 28, 8)
    same_error(r"tile_rows must be >= 1", "kmap_plan", out_in, n, 1, 0)
    same_error(r"sort_window must be >= 0", "kmap_plan", out_in, n, 1, 8, -1)
    same_error(r"num rows \(\d+\) must be in", "kmap_plan", out_in, out_in.shape[0] + 1, 1, 8)
    same_error(r"the map holds a row index outside \[-1, ", "kmap_transpose", out_in, n, n - 5, 128)
    corrupt = out_in.clone()
    corrupt[3, 4] = -7
    same_error(r"the map holds a row index outside \[-1, 2147483647\)", "kmap_plan", corrupt, n, 1, 8)
    same_error(r"pad_rows_to must be >= 1", "kmap_transpose", out_in, n, n, 0)
    clash = out_in.clone()
    row = int(torch.nonzero(clash[:n, 0] >= 0)[0, 0])
    other = next(r for r in range(n) if r != row and int(clash[r, 0]) < 0)
    clash[other, 0] = clash[row, 0]  # two outputs read one input through offset 0
    same_error(r"kmap_transpose: an input is read twice through one offset", "kmap_transpose", clash, n, n, 128)
    # The native message names the CPU; the torch one names no device.
    for op, args in (("kmap_plan", (out_in.long(), n, 1, 8)), ("kmap_transpose", (out_in.t(), 27, n, 128))):
        for module in (ops, torch_ops):
            with pytest.raises(RuntimeError, match=r"the map must be a contiguous int32 \[rows, K = \d+\]"):
                getattr(module, op)(*args)


def test_geometry_that_would_overflow_is_rejected():
    """stride * coordinate beyond int64: both implementations refuse values past 2^20."""
    coords = torch.tensor([[0, 4, 0, 0], [0, -3, 2, 1]], dtype=torch.int32)
    same_error(r"^stride must be at most 2\^20 = 1048576 per axis .*got \[4611686018427387904, 1, 1\]$",
               "kmap_generative", coords, [2, 1, 1], [1 << 62, 1, 1], [1, 1, 1], [0, 0, 0], None, 16)
    same_error(r"^dilation must be at most 2\^20", "kmap_downsample", coords, [5, 1, 1], [1, 1, 1], [1 << 62, 1, 1],
               [0, 0, 0], "spconv", None, 16)
    same_error(r"^padding must be at most 2\^20", "kmap_downsample", coords, [5, 1, 1], [1, 1, 1], [1, 1, 1],
               [0, 0, 1 << 21], "spconv", None, 16)
    # At the bound the arithmetic is exact: the fine sites of a huge stride are out of range.
    big = 1 << 20
    same_error(r"input row 0 produces an output coordinate outside", "kmap_generative", coords, [2, 1, 1],
               [big, 1, 1], [1, 1, 1], [0, 0, 0], None, 16)


# --- the switch and the dispatch -------------------------------------------------------------------
@pytest.fixture
def kmap_backend(monkeypatch):
    """Sets backends.kmap_backend for one test; monkeypatch restores it."""
    def choose(name):
        monkeypatch.setattr(backends, "kmap_backend", name)
    monkeypatch.setattr(backends, "kmap_backend", None)
    return choose


def test_kmap_backend_switch(kmap_backend):
    assert backends.kmap_backend is None
    assert kmap_backend_for(torch.device("cpu")) == "native"
    assert kmap_backend_for(torch.device("cuda")) == "torch"
    assert kmap_backend_for(torch.device("meta")) == "torch"
    assert kmap_ops("native") is ops and kmap_ops("torch") is torch_ops
    for name in ("native", "torch"):
        kmap_backend(name)
        assert backends.kmap_backend == name and kmap_backend_for(torch.device("cpu")) == name
    for bad in ("cuda", "Torch", "", 1, True):
        with pytest.raises(ValueError, match=r"backends.kmap_backend must be None, 'native', 'torch' or 'triton'"):
            backends.kmap_backend = bad
    assert backends.kmap_backend == "torch"  # a refused value changes nothing
    kmap_backend("native")
    with pytest.raises(RuntimeError, match=r"kmap_backend = 'native' has no kernels for meta"):
        kmap_backend_for(torch.device("meta"))
    if not torch.ops.torchsparse_pp.cuda_built():
        with pytest.raises(RuntimeError, match=r"backends.kmap_backend = 'native' needs the CUDA kernels"):
            kmap_backend_for(torch.device("cuda"))
    with pytest.raises(ValueError, match=r"unknown kernel-map backend"):
        kmap_ops("cuda")


def test_kernel_maps_remember_their_backend(kmap_backend, monkeypatch, generator, seed):
    coords = lidar_coords(seed, batch=2)
    calls = []
    for op in OPS:
        original = getattr(torch_ops, op)
        monkeypatch.setattr(torch_ops, op, lambda *a, _op=op, _f=original: calls.append(_op) or _f(*a))
    geometry = ConvGeometry.make(3, stride=2, padding=1)
    maps = {}
    for name in ("native", "torch"):
        kmap_backend(name)
        cache = KernelMapCache()
        maps[name] = (submanifold_map(cache, coords, ConvGeometry.make(3), None),
                      strided_map(cache, coords, geometry, "spconv", None),
                      generative_map(cache, coords, geometry, None))
        assert all(m.backend == name for m in maps[name])
    assert calls == ["kmap_submanifold", "kmap_downsample", "kmap_generative"]
    kmap_backend("native")  # the torch-built maps keep building their views in torch ops
    for native, mine in zip(maps["native"], maps["torch"]):
        assert_same(native.in_coords, mine.in_coords, "in_coords")
        assert_same(native.out_coords, mine.out_coords, "out_coords")
        assert_same(native.out_in, mine.out_in, "out_in")
        assert_same(native.in_out, mine.in_out, "in_out")
        for side in ("out", "in"):
            a, b = native.pairs_sorted_by(side), mine.pairs_sorted_by(side)
            assert_same((a.in_idx, a.out_idx, a.offsets, a.identity), (b.in_idx, b.out_idx, b.offsets, b.identity),
                        f"pairs by {side}")
            assert_same(native.plan(side, 2, 16, 0), mine.plan(side, 2, 16, 0), f"plan {side}")
    # The submanifold map is symmetric: its transposed table and input-sorted pairs are mirrored
    # from its own, with no op (KernelMap.symmetric); the other two maps build their transposed
    # tables in torch, and over these sorted coordinates their output-sorted pairs are sorted by
    # input too, so those serve as the input-sorted view (one kmap_pairs per map).
    assert calls.count("kmap_transpose") == 2 and calls.count("kmap_plan") == 6 and calls.count("kmap_pairs") == 3
    assert "backend=torch" in repr(maps["torch"][0])


# --- end to end ------------------------------------------------------------------------------------
CONFIGS = {
    "gather_scatter": ConvConfig("gather_scatter"),
    "fetch_on_demand": ConvConfig("fetch_on_demand"),
    "implicit_gemm_sorted2": ConvConfig("implicit_gemm", sorted=True, split_mask_num=2),
}


def run_network(coords, backend, config, seed, spatial_range=None):
    """subm k3 -> strided k3 s2 (spconv) -> subm k3 -> transposed k3 s2 -> strided k2 s2
    (minkowski) -> generative k2 s2, forward and backward, maps built by ``backend``."""
    backends.kmap_backend = backend
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(len(coords), 4, generator=gen, dtype=torch.float64).requires_grad_(True)
    weights = [torch.randn(k, 4, 4, generator=gen, dtype=torch.float64).requires_grad_(True)
               for k in (27, 27, 27, 27, 8, 8)]
    x = tsp.SparseTensor(feats, coords.clone(), spatial_range=spatial_range)
    y1 = conv3d(x, weights[0], 3, config=config)
    y2 = conv3d(y1, weights[1], 3, stride=2, config=config)
    y3 = conv3d(y2, weights[2], 3, config=config)
    y4 = conv3d(y3, weights[3], 3, stride=2, transposed=True, config=config)
    y5 = conv3d(y4, weights[4], 2, stride=2, downsample_mode="minkowski", config=config)
    y6 = conv3d(y5, weights[5], 2, stride=2, transposed=True, generative=True, config=config)
    assert y4.C is y1.C
    assert {m.backend for _, m in x.cache.maps()} == {backend} and len(x.cache) == 5
    outputs = [y1, y2, y3, y4, y5, y6]
    loss = sum((y.F * torch.randn(y.F.shape, generator=gen, dtype=torch.float64)).sum() for y in outputs)
    loss.backward()
    result = {f"y{i + 1}.F": y.F.detach() for i, y in enumerate(outputs)}
    result.update({f"y{i + 1}.C": y.C for i, y in enumerate(outputs)})
    result.update({"feats.grad": feats.grad}, **{f"w{i}.grad": w.grad for i, w in enumerate(weights)})
    return result


@pytest.mark.parametrize("config", list(CONFIGS), ids=str)
def test_conv3d_equal_with_either_backend(config, kmap_backend, generator, seed):
    coords = lidar_coords(seed, batch=2)
    spatial_range = None
    if config == "fetch_on_demand":  # clipped spconv outputs and transposed output ranges too
        coords[:, 1:] -= coords[:, 1:].amin(0)
        spatial_range = tuple(int(v) + 1 for v in coords[:, 1:].amax(0))
    native = run_network(coords, "native", CONFIGS[config], seed, spatial_range)
    mine = run_network(coords, "torch", CONFIGS[config], seed, spatial_range)
    assert native.keys() == mine.keys()
    for key in native:
        assert_same(native[key], mine[key], key)
    assert float(native["y6.F"].abs().sum()) > 0 and native["y6.C"].shape[0] > native["y5.C"].shape[0]
