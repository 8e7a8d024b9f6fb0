"""CUDA kernel maps against the CPU ops: every build, view and error must be identical.

The CPU ops are themselves tested against a numpy oracle (test_kmap.py); here the GPU results
must equal them exactly (same coordinates in the same order, same tables, pairs and plans), on
fresh random, shuffled and LiDAR-like coordinates. Every map test runs per GPU backend (fixture
``gpu_ops``): the GPU side built by the native CUDA ops, by torchsparse_pp.kmap.torch_ops
(plain torch ops on CUDA tensors, the default kmap backend on CUDA) and, where triton is
installed, by torchsparse_pp.kmap.triton_ops (which leaves out the data checks that would cost a
host read: submanifold duplicates and range, transposed tables' entries).
"""
import re

import numpy as np
import pytest
import torch

from torchsparse_pp import SparseTensor, backends, ops
from torchsparse_pp.kmap import (ConvGeometry, generative_map, strided_map, submanifold_map, torch_ops,
                                 transposed_source_map, triton_ops)
from torchsparse_pp.ops.triton import runtime
from conftest import lidar_coords, random_coords, shuffled_coords

pytestmark = pytest.mark.cuda

CUDA = "cuda"

SUBMANIFOLD_GEOMETRIES = [
    ConvGeometry.make(3), ConvGeometry.make(5, dilation=2), ConvGeometry.make(2), ConvGeometry.make(3, padding=0),
    ConvGeometry.make((3, 1, 5), dilation=(1, 2, 1), padding=(1, 0, 4)), ConvGeometry.make(4, dilation=2, padding=3),
]
DOWNSAMPLE_CASES = [
    (ConvGeometry.make((3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0)), "spconv"),
    (ConvGeometry.make(3, stride=3, padding=2, dilation=2), "spconv"),
    (ConvGeometry.make(3, stride=2, padding=1), "spconv"),
    (ConvGeometry.make(2, stride=2), "spconv"),
    (ConvGeometry.make((2, 3, 1), stride=(2, 1, 3), dilation=(2, 1, 1), padding=(0, 1, 0)), "spconv"),
    (ConvGeometry.make(2, stride=2), "minkowski"),
    (ConvGeometry.make(3, stride=2, padding=1), "minkowski"),
    (ConvGeometry.make((3, 1, 2), stride=(2, 1, 3), dilation=(1, 1, 2)), "minkowski"),
]
GENERATIVE_GEOMETRIES = [
    ConvGeometry.make(2, stride=2), ConvGeometry.make(3, stride=2, padding=1),
    ConvGeometry.make((3, 1, 2), stride=(2, 1, 3), dilation=(1, 1, 2)),
]
PLAN_CONFIGS = [(0, 8, 0), (1, 64, 0), (2, 64, 0), (3, 16, 0), (1, 8, 7), (2, 128, 100)]
GPU_KMAP_BACKENDS = {"native": ops, "torch": torch_ops, **({"triton": triton_ops} if runtime.installed() else {})}


@pytest.fixture(params=list(GPU_KMAP_BACKENDS))
def gpu_ops(request):
    """The kernel-map ops that run on the CUDA tensors: the native CUDA kernels or torch_ops."""
    return GPU_KMAP_BACKENDS[request.param]


def coordinate_sets(generator, seed):
    """Uniform (negatives included, sorted), shuffled two-sample, and LiDAR-like inputs."""
    uniform = random_coords(generator, 2500, batch=2, low=-20, high=20)
    return {
        "uniform": uniform,
        "uniform-permuted": uniform[torch.randperm(uniform.shape[0], generator=generator)].contiguous(),
        "shuffled": shuffled_coords(generator),
        "lidar": lidar_coords(seed, batch=2),
    }


def assert_same(cpu: torch.Tensor, gpu: torch.Tensor, what: str = "") -> None:
    assert gpu.device.type == "cuda", f"{what}: expected a CUDA tensor, got {gpu.device}"
    assert gpu.dtype == cpu.dtype and gpu.shape == cpu.shape, f"{what}: {gpu.dtype} {tuple(gpu.shape)} vs " \
                                                              f"{cpu.dtype} {tuple(cpu.shape)}"
    assert torch.equal(gpu.cpu(), cpu), f"{what}: CUDA and CPU results differ"


def assert_same_all(cpu, gpu, what=""):
    for i, (a, b) in enumerate(zip(cpu, gpu)):
        assert_same(a, b, f"{what}[{i}]")


def assert_views_equal(out_in_cpu, out_in_gpu, num_in, num_out, gpu_ops=ops):
    """pairs, transposed table and plans of two equal maps agree on both devices (the GPU side
    computed by ``gpu_ops``)."""
    assert_same_all(ops.kmap_pairs(out_in_cpu, num_in, num_out), gpu_ops.kmap_pairs(out_in_gpu, num_in, num_out),
                    "pairs")
    in_out_cpu = ops.kmap_transpose(out_in_cpu, num_out, num_in, 128)
    in_out_gpu = gpu_ops.kmap_transpose(out_in_gpu, num_out, num_in, 128)
    assert_same(in_out_cpu, in_out_gpu, "in_out")
    assert_same_all(ops.kmap_pairs(in_out_cpu, num_out, num_in), gpu_ops.kmap_pairs(in_out_gpu, num_out, num_in),
                    "transposed pairs")
    for split, tile, window in PLAN_CONFIGS:
        if split > out_in_cpu.shape[1]:
            continue
        for table_cpu, table_gpu, rows in ((out_in_cpu, out_in_gpu, num_out), (in_out_cpu, in_out_gpu, num_in)):
            assert_same_all(ops.kmap_plan(table_cpu, rows, split, tile, window),
                            gpu_ops.kmap_plan(table_gpu, rows, split, tile, window), f"plan {split}/{tile}/{window}")


def is_centred(g: ConvGeometry) -> bool:
    return all(k % 2 == 1 and 2 * p == d * (k - 1) for k, d, p in zip(g.kernel_size, g.dilation, g.padding))


def first_error_line(fn) -> str:
    with pytest.raises(RuntimeError) as info:
        fn()
    return str(info.value).splitlines()[0]


def assert_same_error(pattern: str, op, tensor: torch.Tensor, *args, gpu_op=None) -> None:
    """op raises the same message for a CPU tensor as gpu_op (default: op) for its CUDA copy."""
    cpu = first_error_line(lambda: op(tensor, *args))
    gpu = first_error_line(lambda: (gpu_op or op)(tensor.to(CUDA), *args))
    assert re.search(pattern, cpu), cpu
    assert gpu == cpu


def on_both(op, tensor: torch.Tensor, *args, gpu_op=None):
    """op on a CPU tensor and gpu_op (default: op) on its CUDA copy."""
    return op(tensor, *args), (gpu_op or op)(tensor.to(CUDA), *args)


# --- hash table ----------------------------------------------------------------------------------
def near_misses(coords: torch.Tensor) -> torch.Tensor:
    probes = [coords.clone() for _ in range(8)]
    for i, p in enumerate(probes):
        p[:, i // 2] += 1 if i % 2 else -1
    probes.append(coords * torch.tensor([1, -1, 1, 1], dtype=torch.int32))
    query = torch.cat([coords] + probes)
    query[:, 0].clamp_(min=0)
    return query


@pytest.mark.native_cuda
def test_hash_build_and_query_match_cpu(generator):
    coords = random_coords(generator, 6000, batch=3, low=-300, high=300)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    query = near_misses(coords)
    table_cpu, table_gpu = ops.hash_build(coords), ops.hash_build(coords.to(CUDA))
    assert table_gpu.shape == table_cpu.shape and table_gpu.dtype == torch.int64
    expected = ops.hash_query(table_cpu, query)
    assert int((expected >= 0).sum()) >= coords.shape[0]  # the queries hit and miss
    assert_same(expected, ops.hash_query(table_gpu, query.to(CUDA)), "query")
    # One table format: either device's table answers the other device's queries.
    assert torch.equal(ops.hash_query(table_gpu.cpu(), query), expected)
    assert_same(expected, ops.hash_query(table_cpu.to(CUDA), query.to(CUDA)), "CPU table on CUDA")
    # Keys outside the packable range are never found.
    far = torch.tensor([[0, 40000, 0, 0], [-1, 0, 0, 0], [40000, 1, 2, 3]], dtype=torch.int32)
    assert_same(ops.hash_query(table_cpu, far), ops.hash_query(table_gpu, far.to(CUDA)), "far")


@pytest.mark.native_cuda
def test_hash_extreme_coordinates():
    values = [-32768, -32767, -1, 0, 1, 32766, 32767]
    coords = torch.tensor([[b, x, y, z] for b in (0, 32767) for x in values for y in values[:3]
                           for z in values[-3:]], dtype=torch.int32)
    table = ops.hash_build(coords.to(CUDA))
    assert_same(torch.arange(coords.shape[0], dtype=torch.int32), ops.hash_query(table, coords.to(CUDA)))


def splitmix_home(keys: np.ndarray, capacity: int) -> np.ndarray:
    """Home slot of packed keys (coords.h hash_key), to build a pathological key set."""
    h = keys.astype(np.uint64)
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return (h & np.uint64(capacity - 1)).astype(np.int64)


@pytest.mark.native_cuda
def test_hash_probe_overflow_is_a_clear_error():
    """6400 keys whose home slots all lie in [0, 2048) of a 16384-slot table: linear probing
    fills slots [0, 6400), so some key needs more than 4096 probes."""
    side = np.arange(-60, 60, dtype=np.int64)
    x, y, z = (a.ravel() for a in np.meshgrid(side, side, side, indexing="ij"))
    keys = ((x + 32768) << 32) | ((y + 32768) << 16) | (z + 32768)
    pick = np.nonzero(splitmix_home(keys, 16384) < 2048)[0][:6400]
    assert len(pick) == 6400
    coords = torch.from_numpy(np.stack([np.zeros_like(x[pick]), x[pick], y[pick], z[pick]], 1)).int()
    pattern = r"coordinate hash table: an insert exceeded the probe bound of 4096 slots \(capacity 16384\)"
    assert_same_error(pattern, ops.hash_build, coords)
    # The CUDA maps that hash (the CPU's submanifold build sorts instead) report it too.
    with pytest.raises(RuntimeError, match=pattern):
        ops.kmap_submanifold(coords.to(CUDA), [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)


@pytest.mark.native_cuda
def test_hash_errors_match_cpu(generator):
    coords = random_coords(generator, 800, batch=2, low=-30, high=30)
    dup = coords.clone()
    dup[600], dup[700] = dup[100], dup[350]
    unique = "the coordinates of a SparseTensor must be unique"
    assert_same_error(rf"duplicate coordinate \(.*\) at row 600: {unique}", ops.hash_build, dup)
    bad = coords.clone()
    bad[500, 2], bad[300, 0] = 40000, -1
    assert_same_error(r"coords row 300 = \(-1, .*\) is outside the supported coordinate range", ops.hash_build, bad)
    table = ops.hash_build(coords.to(CUDA))
    with pytest.raises(RuntimeError, match=r"must be the \[capacity, 2\] int64 tensor that hash_build returns"):
        ops.hash_query(table[:-1], coords.to(CUDA))
    with pytest.raises(RuntimeError, match=r"query must be int32"):
        ops.hash_query(table, coords.to(CUDA).long())
    with pytest.raises(RuntimeError, match=r"the hash table is on cpu but query is on cuda"):
        ops.hash_query(table.cpu(), coords.to(CUDA))


# --- maps by the ops -----------------------------------------------------------------------------
@pytest.mark.parametrize("geometry", SUBMANIFOLD_GEOMETRIES)
def test_submanifold_maps_match_cpu(geometry, generator, seed, gpu_ops):
    for name, coords in coordinate_sets(generator, seed).items():
        args = (geometry.kernel_size, geometry.dilation, geometry.padding, 128)
        cpu = ops.kmap_submanifold(coords, *args)
        gpu = gpu_ops.kmap_submanifold(coords.to(CUDA), *args)
        assert_same(cpu, gpu, f"kmap_submanifold on {name}")
        assert_views_equal(cpu, gpu, coords.shape[0], coords.shape[0], gpu_ops)
        if gpu_ops is not ops:
            continue
        # The hash-probe op, with and without the mirrored half.
        table = ops.hash_build(coords.to(CUDA))
        assert_same(cpu, ops.kmap_out_in(table, coords.to(CUDA), *geometry.args(), 128), f"kmap_out_in on {name}")
        if is_centred(geometry):
            assert_same(cpu, ops.kmap_out_in(table, coords.to(CUDA), *geometry.args(), 128, True),
                        f"mirrored kmap_out_in on {name}")


def test_submanifold_never_aliases_across_packed_fields(gpu_ops):
    coords = torch.tensor([[0, 5, 32767, 0], [0, 6, -32768, 0], [0, 5, 32766, 0], [1, 0, 0, 32767],
                           [1, 0, 1, -32768], [2, -32768, 0, 0], [2, 32767, 0, 0]], dtype=torch.int32)
    for ks, dil in (([3, 3, 3], [1, 1, 1]), ([5, 5, 5], [2, 2, 2])):
        pad = [(k - 1) * d // 2 for k, d in zip(ks, dil)]
        cpu = ops.kmap_submanifold(coords, ks, dil, pad, 128)
        assert_same(cpu, gpu_ops.kmap_submanifold(coords.to(CUDA), ks, dil, pad, 128))
        if gpu_ops is ops:
            assert_same(cpu, ops.kmap_out_in(ops.hash_build(coords.to(CUDA)), coords.to(CUDA), ks, [1, 1, 1], dil,
                                             pad, 128, True))


@pytest.mark.parametrize("geometry,mode", DOWNSAMPLE_CASES)
def test_downsample_maps_match_cpu(geometry, mode, generator, seed, gpu_ops):
    for name, coords in coordinate_sets(generator, seed).items():
        out_cpu, map_cpu = ops.kmap_downsample(coords, *geometry.args(), mode, None, 128)
        out_gpu, map_gpu = gpu_ops.kmap_downsample(coords.to(CUDA), *geometry.args(), mode, None, 128)
        assert_same(out_cpu, out_gpu, f"{mode} coords on {name}")
        assert_same(map_cpu, map_gpu, f"{mode} out_in on {name}")
        assert_views_equal(map_cpu, map_gpu, coords.shape[0], out_cpu.shape[0], gpu_ops)
        if gpu_ops is ops:
            # The same map by hash lookups of the new set in a table of the input.
            table = ops.hash_build(coords.to(CUDA))
            assert_same(map_cpu, ops.kmap_out_in(table, out_gpu, *geometry.args(), 128), f"lookup on {name}")


@pytest.mark.parametrize("geometry", [ConvGeometry.make(3, stride=2, padding=0), ConvGeometry.make(2, stride=2),
                                      ConvGeometry.make((3, 2, 5), stride=(2, 3, 1), padding=(1, 0, 3))])
def test_downsample_out_range_clips_like_cpu(geometry, generator, gpu_ops):
    coords = random_coords(generator, 1500, batch=2, low=0, high=12)
    for out_range in ([4, 3, 5], [1, 7, 2], geometry.dense_output_size((12, 12, 12))):
        cpu = ops.kmap_downsample(coords, *geometry.args(), "spconv", list(out_range), 128)
        gpu = gpu_ops.kmap_downsample(coords.to(CUDA), *geometry.args(), "spconv", list(out_range), 128)
        assert_same_all(cpu, gpu, f"out_range {out_range}")
        assert bool((gpu[0][:, 1:] < torch.tensor(out_range, device=CUDA)).all())


@pytest.mark.parametrize("geometry", GENERATIVE_GEOMETRIES)
def test_generative_maps_match_cpu(geometry, generator, seed, gpu_ops):
    for name, coords in coordinate_sets(generator, seed).items():
        for out_range in (None, [9, 30, 17]):
            cpu = ops.kmap_generative(coords, *geometry.args(), out_range, 128)
            gpu = gpu_ops.kmap_generative(coords.to(CUDA), *geometry.args(), out_range, 128)
            assert_same_all(cpu, gpu, f"generative on {name}, range {out_range}")
            fine, out_in = cpu
            assert_views_equal(out_in, gpu[1], fine.shape[0], coords.shape[0], gpu_ops)


def test_empty_inputs_match_cpu(gpu_ops):
    empty = torch.zeros(0, 4, dtype=torch.int32)
    assert_same(*on_both(ops.kmap_submanifold, empty, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128,
                         gpu_op=gpu_ops.kmap_submanifold))
    for mode in ("spconv", "minkowski"):
        args = ([2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], mode, None, 128)
        assert_same_all(*on_both(ops.kmap_downsample, empty, *args, gpu_op=gpu_ops.kmap_downsample))
    assert_same_all(*on_both(ops.kmap_generative, empty, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128,
                             gpu_op=gpu_ops.kmap_generative))
    table = torch.full((256, 8), -1, dtype=torch.int32)
    assert_same_all(*on_both(ops.kmap_pairs, table, 0, 0, gpu_op=gpu_ops.kmap_pairs))
    assert_same_all(*on_both(ops.kmap_plan, table, 0, 2, 64, gpu_op=gpu_ops.kmap_plan))


# --- views of arbitrary tables -------------------------------------------------------------------
def random_table(generator, rows, K, num_in, fill=0.4):
    """A valid map: per offset a random injective assignment of inputs to some outputs."""
    table = torch.full((rows, K), -1, dtype=torch.int32)
    for k in range(K):
        take = torch.rand(rows, generator=generator) < fill
        n = min(int(take.sum()), num_in)
        chosen = torch.nonzero(take)[:n, 0]
        table[chosen, k] = torch.randperm(num_in, generator=generator)[:n].int()
    return table


@pytest.mark.parametrize("K", [1, 27, 64, 65, 125])
def test_views_of_random_tables_match_cpu(K, generator, gpu_ops):
    """Wide maps (several mask words), rows that are not a tile multiple, identity offsets."""
    num_out, num_in = 1000 + int(torch.randint(0, 300, (1,), generator=generator)), 1100
    table = random_table(generator, num_out + 57, K, num_in)
    table[num_out:] = -1
    assert_views_equal(table, table.to(CUDA), num_in, num_out, gpu_ops)
    square = random_table(generator, 900, K, 900)
    square[:, K // 2] = torch.arange(900, dtype=torch.int32)  # an identity offset
    _, _, _, identity = gpu_ops.kmap_pairs(square.to(CUDA), 900, 900)
    assert bool(identity[K // 2]) and identity.device.type == "cuda"
    assert_views_equal(square, square.to(CUDA), 900, 900, gpu_ops)
    for split in range(0, min(K, 6) + 1):
        assert_same_all(ops.kmap_plan(table, num_out, split, 64), gpu_ops.kmap_plan(table.to(CUDA), num_out, split, 64))


def test_view_errors_match_cpu(generator, gpu_ops):
    coords = random_coords(generator, 300, batch=1, low=-6, high=6)
    n = coords.shape[0]
    out_in = ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    assert_same_error(r"out_in holds input rows >= num_in", ops.kmap_pairs, out_in, n - 5, n,
                      gpu_op=gpu_ops.kmap_pairs)
    assert_same_error(r"exceeds the rows of out_in", ops.kmap_pairs, out_in, n, out_in.shape[0] + 1,
                      gpu_op=gpu_ops.kmap_pairs)
    assert_same_error(r"split_mask_num must be in \[0, K = 27\]", ops.kmap_plan, out_in, n, 28, 8,
                      gpu_op=gpu_ops.kmap_plan)
    assert_same_error(r"tile_rows must be >= 1", ops.kmap_plan, out_in, n, 1, 0, gpu_op=gpu_ops.kmap_plan)
    if gpu_ops is not triton_ops:  # which reads nothing back, so checks no table entry
        assert_same_error(r"the map holds a row index outside \[-1, ", ops.kmap_transpose, out_in, n, n - 5, 128,
                          gpu_op=gpu_ops.kmap_transpose)
        clash = out_in.clone()
        row = int(torch.nonzero(clash[:n, 0] >= 0)[0, 0])
        other = next(r for r in range(n) if r != row and int(clash[r, 0]) < 0)
        clash[other, 0] = clash[row, 0]  # two outputs read one input through offset 0
        assert_same_error(r"kmap_transpose: an input is read twice through one offset", ops.kmap_transpose, clash, n,
                          n, 128, gpu_op=gpu_ops.kmap_transpose)
    # The native message names the device; torch_ops' message names none.
    with pytest.raises(RuntimeError, match=r"the map must be a contiguous int32 \[rows, K = 27\] (CUDA )?tensor"):
        gpu_ops.kmap_plan(out_in.to(CUDA).long(), n, 1, 8)


# --- map errors ----------------------------------------------------------------------------------
def test_map_errors_match_cpu(generator, gpu_ops):
    coords = random_coords(generator, 400, batch=2, low=-8, high=8)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    dup = coords.clone()
    dup[250], dup[90] = dup[40], dup[300]
    sub = ([3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    unique = "the coordinates of a SparseTensor must be unique"
    checks_submanifold_data = gpu_ops is not triton_ops  # which reads nothing back there
    if checks_submanifold_data:
        assert_same_error(rf"duplicate coordinate \(.*\) at rows \d+ and \d+: {unique}", ops.kmap_submanifold, dup,
                          *sub, gpu_op=gpu_ops.kmap_submanifold)
    for mode in ("spconv", "minkowski"):
        args = ([3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], mode, None, 128)
        assert_same_error(rf"duplicate coordinate at row \d+: {unique}", ops.kmap_downsample, dup, *args,
                          gpu_op=gpu_ops.kmap_downsample)
    gen_args = ([2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128)
    assert_same_error(r"duplicate coordinate \(.*\) at rows \d+ and \d+", ops.kmap_generative, dup, *gen_args,
                      gpu_op=gpu_ops.kmap_generative)

    far = coords.clone()
    far[77, 3], far[33, 1] = 32767, -32768
    coarse = ([3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], None, 128)
    outside = r"input row 33 produces an output coordinate outside the supported range"
    assert_same_error(outside, ops.kmap_generative, far, *coarse, gpu_op=gpu_ops.kmap_generative)
    one = ([3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], "spconv", None, 128)  # stride 1 reaches past the edge
    assert_same_error(outside, ops.kmap_downsample, far, *one, gpu_op=gpu_ops.kmap_downsample)
    bad = coords.clone()
    bad[12, 0] = -2
    if checks_submanifold_data:
        assert_same_error(r"coords row 12 = \(-2, .*\) is outside the supported coordinate range",
                          ops.kmap_submanifold, bad, *sub, gpu_op=gpu_ops.kmap_submanifold)

    with pytest.raises(RuntimeError, match=r"unknown downsample mode 'dense'"):
        gpu_ops.kmap_downsample(coords.to(CUDA), [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], "dense", None, 128)
    with pytest.raises(RuntimeError, match=r"out_range must be positive"):
        gpu_ops.kmap_generative(coords.to(CUDA), [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], [4, 0, 4], 128)
    with pytest.raises(RuntimeError, match=r"coords must have shape \[N, 4\]"):
        gpu_ops.kmap_submanifold(coords[:, :3].contiguous().to(CUDA), *sub)
    if gpu_ops is not ops:
        return
    table = ops.hash_build(coords.to(CUDA))
    geo = ([3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1])
    with pytest.raises(RuntimeError, match=r"submanifold=True needs out_coords"):
        ops.kmap_out_in(table, coords.flip(0).contiguous().to(CUDA), *geo, 128, True)
    with pytest.raises(RuntimeError, match=r"submanifold=True needs out_coords"):
        ops.kmap_out_in(ops.hash_build(torch.cat([coords, coords + 50]).to(CUDA)), (coords + 50).to(CUDA), *geo, 128,
                        True)


# --- SparseTensor / KernelMap on both devices ----------------------------------------------------
def build_map(x: SparseTensor, geometry: ConvGeometry, mode: str):
    if mode == "submanifold":
        return submanifold_map(x.cache, x.C, geometry, x.spatial_range)
    if mode == "generative":
        return generative_map(x.cache, x.C, geometry, x.spatial_range)
    return strided_map(x.cache, x.C, geometry, mode, x.spatial_range)


def assert_kernel_maps_equal(cpu, gpu):
    assert gpu.out_in.device.type == "cuda" and gpu.num_in == cpu.num_in and gpu.num_out == cpu.num_out
    assert gpu.out_range == cpu.out_range and gpu.in_range == cpu.in_range
    assert_same(cpu.in_coords, gpu.in_coords, "in_coords")
    assert_same(cpu.out_coords, gpu.out_coords, "out_coords")
    assert_same(cpu.out_in, gpu.out_in, "out_in")
    assert_same(cpu.in_out, gpu.in_out, "in_out")
    for side in ("out", "in"):
        a, b = cpu.pairs_sorted_by(side), gpu.pairs_sorted_by(side)
        assert_same_all((a.in_idx, a.out_idx, a.offsets, a.identity), (b.in_idx, b.out_idx, b.offsets, b.identity),
                        f"pairs by {side}")
        for split, tile, window in PLAN_CONFIGS:
            if split <= cpu.geometry.volume:
                assert_same_all(cpu.plan(side, split, tile, window), gpu.plan(side, split, tile, window),
                                f"plan {side} {split}/{tile}/{window}")


MAP_CASES = ([(g, "submanifold") for g in SUBMANIFOLD_GEOMETRIES[:3]] + DOWNSAMPLE_CASES[:4] + DOWNSAMPLE_CASES[5:7]
             + [(g, "generative") for g in GENERATIVE_GEOMETRIES])


@pytest.mark.parametrize("geometry,mode", MAP_CASES)
@pytest.mark.parametrize("ranged", [False, True])
@pytest.mark.parametrize("gpu_backend", list(GPU_KMAP_BACKENDS))
def test_kernel_maps_equal_on_both_devices(geometry, mode, ranged, gpu_backend, generator, seed, monkeypatch):
    """The CPU map by the native ops, the CUDA one by backends.kmap_backend = gpu_backend."""
    coords = lidar_coords(seed, batch=2)
    spatial_range = None
    if ranged:
        coords[:, 1:] -= coords[:, 1:].amin(0)
        spatial_range = tuple(int(v) + 1 for v in coords[:, 1:].amax(0))
    feats = torch.randn(coords.shape[0], 3, generator=generator)
    maps = {}
    for device, backend in (("cpu", "native"), (CUDA, gpu_backend)):
        monkeypatch.setattr(backends, "kmap_backend", backend)
        x = SparseTensor(feats.to(device), coords.to(device), spatial_range=spatial_range)
        kmap = build_map(x, geometry, mode)
        assert kmap.backend == backend
        assert build_map(x, geometry, mode) is kmap and len(x.cache) == 1
        if mode in ("spconv", "minkowski"):
            assert transposed_source_map(x.cache, kmap.out_coords, geometry) is kmap
        maps[device] = kmap
    assert_kernel_maps_equal(maps["cpu"], maps[CUDA])
    # Maps of the new coordinate sets, built on each device from that device's result.
    if mode != "submanifold":
        new_cpu = maps["cpu"].in_coords if mode == "generative" else maps["cpu"].out_coords
        new_gpu = maps[CUDA].in_coords if mode == "generative" else maps[CUDA].out_coords
        assert_same(new_cpu, new_gpu, "new coordinate set")
        sub = ([3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
        assert_same(ops.kmap_submanifold(new_cpu, *sub), GPU_KMAP_BACKENDS[gpu_backend].kmap_submanifold(new_gpu, *sub),
                    "map of the new set")


# --- scale ---------------------------------------------------------------------------------------
def test_two_million_points_match_cpu(generator, gpu_ops):
    coords = random_coords(generator, 2_200_000, batch=2, low=-150, high=150)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    assert coords.shape[0] > 2_000_000
    gpu_coords = coords.to(CUDA)
    cpu = ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    gpu = gpu_ops.kmap_submanifold(gpu_coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    assert_same(cpu, gpu, "submanifold out_in")
    n = coords.shape[0]
    assert_same_all(ops.kmap_pairs(cpu, n, n), gpu_ops.kmap_pairs(gpu, n, n), "pairs")
    assert_same_all(ops.kmap_plan(cpu, n, 1, 64), gpu_ops.kmap_plan(gpu, n, 1, 64), "plan")
    down_cpu = ops.kmap_downsample(coords, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], "spconv", None, 128)
    down_gpu = gpu_ops.kmap_downsample(gpu_coords, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], "spconv", None, 128)
    assert_same_all(down_cpu, down_gpu, "downsample")
    if gpu_ops is not ops:
        return
    table = ops.hash_build(gpu_coords)
    assert_same(torch.arange(n, dtype=torch.int32), ops.hash_query(table, gpu_coords), "query")
