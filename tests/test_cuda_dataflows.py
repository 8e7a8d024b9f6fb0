"""The GPU dataflows through the public API, on both backends: the native CUDA kernels and the
Triton kernels (all three dataflows on each), every configuration named "<config>[native]" /
"<config>[triton]"; maps are built by the default GPU map builder (torch ops) and, in one test, by
the native CUDA builders too. Native fetch_on_demand runs its fused atomic kernel, or with
backends.deterministic its owned-rows kernel (the bit-identical repeats below).

References are float64 CPU computations: the library's CPU dataflows in float64 (themselves
checked against dense conv3d in test_dataflows.py), the dense oracle directly on small inputs,
and an independent per-row sum for the large case. Every CUDA run is preceded by poisoning:
memory the caching allocator will hand out next is filled with NaN bytes, so an output row the
kernels never write shows up as non-finite.

1. every configuration x geometry against the float64 CPU reference in forward, dgrad and wgrad,
   dtypes float32, TF32, float16, bfloat16 and float64 and channel counts rotating over the cases;
2. every configuration agrees with the reference and with each other on whole 64-beam scans;
3. repeated runs are bit-identical (gather_scatter by construction, every config with
   backends.deterministic);
4. float64 on CUDA against the dense oracle;
5. autocast;
6. the gather_scatter ops against the CPU ops on the same pairs (vectorised and scalar paths);
7. a feature tensor above 2^31 elements: correct on sampled rows, or a clear error;
8. bad inputs to the gather_scatter ops give clear errors with backends.validate_plans (the ops
   check no index per call otherwise: maps validate their views once), and the device stays
   usable.

Errors are norm-wise relative to the same sums over absolute values (|feats|, |W|, |grad|), as
in test_dataflows.py: a float32 sum is accurate relative to the size of its terms, while a sum of
random terms can cancel. float16 / bfloat16 results of exact operands round each output (and
gather_scatter each offset's GEMM) once: at most 2 x their unit roundoff of that scale, element
by element, a bound under the 1e-2 they are held to.
"""
import dataclasses
import functools
import itertools
import math
import re

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import backends, ops
from torchsparse_pp.data import generate_scan
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, submanifold_map
from torchsparse_pp.nn.functional import ConvConfig, PassConfigs, conv3d
from torchsparse_pp.ops.triton.tiles import tiles_for
from torchsparse_pp.utils import sparse_quantize
from conftest import fresh_seed, lidar_coords, random_coords, triple
from oracle import reference_conv
from precision import rel_err

pytestmark = pytest.mark.cuda
DEVICE = "cuda"

GS = "gather_scatter"
IG = "implicit_gemm"
FOD = "fetch_on_demand"
BASE_CONFIGS = {
    "gs_eps0_thr0": ConvConfig(GS, epsilon=0.0, mm_thresh=0),
    "gs_eps0.2_thrinf": ConvConfig(GS, epsilon=0.2, mm_thresh=10 ** 9),
    "gs_eps0.5_thr50": ConvConfig(GS, epsilon=0.5, mm_thresh=50),
    "gs_eps1_thrinf": ConvConfig(GS, epsilon=1.0, mm_thresh=10 ** 9),
    "ig_unsorted": ConvConfig(IG, sorted=False, split_mask_num=0),
    "ig_sorted_split1": ConvConfig(IG, sorted=True, split_mask_num=1),
    "ig_sorted_split2": ConvConfig(IG, sorted=True, split_mask_num=2),
    "ig_sorted_split3": ConvConfig(IG, sorted=True, split_mask_num=3),
    "ig_sorted_split4": ConvConfig(IG, sorted=True, split_mask_num=4),
    # forward implicit GEMM, dgrad grouped gather-scatter, wgrad unsorted implicit GEMM
    "mixed_ig_gs_ig": PassConfigs(ConvConfig(IG, sorted=True, split_mask_num=2),
                                  ConvConfig(GS, epsilon=0.5, mm_thresh=50),
                                  ConvConfig(IG, sorted=False, split_mask_num=0)),
    # forward gather-scatter, dgrad sorted implicit GEMM (3 splits), wgrad batched gather-scatter
    "mixed_gs_ig_gs": PassConfigs(ConvConfig(GS),
                                  ConvConfig(IG, sorted=True, split_mask_num=3),
                                  ConvConfig(GS, epsilon=1.0, mm_thresh=10 ** 9)),
    "fod": ConvConfig(FOD),
    # forward fetch-on-demand, dgrad sorted implicit GEMM (2 splits), wgrad fetch-on-demand
    "mixed_fod_ig_fod": PassConfigs(ConvConfig(FOD), ConvConfig(IG, sorted=True, split_mask_num=2), ConvConfig(FOD)),
}
BACKENDS = ("native", "triton")


def on_backend(config, backend):
    """The config with every pass on ``backend``."""
    if isinstance(config, PassConfigs):
        return PassConfigs(*(dataclasses.replace(c, backend=backend) for c in config))
    return dataclasses.replace(config, backend=backend)


def named(*names):
    """Names of CONFIGS entries: each base config on each backend."""
    return [f"{n}[{b}]" for b in BACKENDS for n in names]


CONFIGS = {f"{name}[{b}]": on_backend(cfg, b) for b in BACKENDS for name, cfg in BASE_CONFIGS.items()}
GATHER_SCATTER = [name for name in CONFIGS if name.startswith("gs_")]  # deterministic by construction

# name -> (dtype, TF32 allowed, tolerance, errors relative to the sums over absolute values)
DTYPES = {
    "float32": (torch.float32, False, 1e-5, True),
    "tf32": (torch.float32, True, 3e-4, True),
    "float16": (torch.float16, False, 1e-2, True),
    "bfloat16": (torch.bfloat16, False, 1e-2, True),
    "float64": (torch.float64, False, 1e-10, True),
}

# conv3d keyword arguments plus how the input is made:
#   transposed_from: the strided conv whose coarse output is the transposed conv's input;
#   input_stride: tensor stride of the input (generative convs go from stride 2 to 1).
GEOMETRIES = {
    "subm_k3": dict(kernel_size=3),
    "subm_k5": dict(kernel_size=5),
    "subm_k311": dict(kernel_size=(3, 1, 1)),
    "subm_k3_d2": dict(kernel_size=3, dilation=2),
    "k2s2_spconv": dict(kernel_size=2, stride=2),
    "k3s2p1_spconv": dict(kernel_size=3, stride=2, padding=1),
    "transposed_k3s2p1": dict(kernel_size=3, stride=2, padding=1, transposed=True,
                              transposed_from=dict(kernel_size=3, stride=2, padding=1)),
    "generative_k2s2": dict(kernel_size=2, stride=2, transposed=True, generative=True, input_stride=2),
}
# Every channel count of interest appears on both sides; 3, 5, 13 and 37 are not multiples of 8.
CHANNEL_PAIRS = [(3, 5), (13, 37), (16, 32), (64, 96), (128, 64), (37, 13), (5, 128), (96, 16)]


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------
def volume(kernel_size) -> int:
    return math.prod(triple(kernel_size))


def resolved_padding(geom: dict):
    if geom.get("padding") is not None:
        return triple(geom["padding"])
    k, d = triple(geom["kernel_size"]), triple(geom.get("dilation", 1))
    return tuple(dd * (kk - 1) // 2 if kk % 2 else 0 for kk, dd in zip(k, d))


def conv_kwargs(geom: dict) -> dict:
    keys = ("kernel_size", "stride", "dilation", "padding", "transposed", "generative", "downsample_mode")
    return {k: geom[k] for k in keys if k in geom}


def poison_cuda_memory():
    """Fills memory that the caching allocator hands out next with 0xFF bytes, a NaN in every
    floating type: one large block (the large pool, for requests above 1 MiB) and many 1 MiB
    blocks (the small pool). Freed, not returned to the driver, so the next allocations reuse it."""
    free, _ = torch.cuda.mem_get_info()
    big = torch.empty(min(1 << 30, free // 4), dtype=torch.uint8, device=DEVICE).fill_(255)
    small = [torch.full((1 << 20,), 255, dtype=torch.uint8, device=DEVICE) for _ in range(64)]
    del big, small


def assert_finite(**tensors):
    bad = [name for name, t in tensors.items() if not bool(torch.isfinite(t).all())]
    assert not bad, f"non-finite values (rows never written?) in {bad}"


@pytest.fixture
def restore_switches():
    """Restores every switch a test may flip."""
    saved = (backends.deterministic, backends.allow_tf32, torch.backends.cuda.matmul.allow_tf32, backends.kmap_backend)
    try:
        yield
    finally:
        (backends.deterministic, backends.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
         backends.kmap_backend) = saved


def set_tf32(allowed: bool):
    """TF32 for implicit GEMM (backends.allow_tf32) and for gather_scatter's cuBLAS GEMMs."""
    backends.allow_tf32 = allowed
    torch.backends.cuda.matmul.allow_tf32 = allowed


@functools.lru_cache(maxsize=None)
def lidar_scene(index: int) -> torch.Tensor:
    """Crops of two generated 64-beam scans at 0.1 m (a few thousand voxels), built once."""
    return lidar_coords(2000 + index, batch=2, voxel=0.1, box=48, beams=64)


def input_coords(gen: torch.Generator, source: str) -> torch.Tensor:
    if source == "lidar":
        return lidar_scene(int(torch.randint(0, 3, (1,), generator=gen)))
    return random_coords(gen, 2000, batch=2, low=-8, high=8)


def conv_inputs(gen, coords: torch.Tensor, geom: dict, c_in: int, dtype: torch.dtype):
    """The conv's input on the CPU (float64) and on CUDA (``dtype``): equal coordinates and
    equal values (those of ``dtype``). A transposed conv's input is the coarse output of its
    strided conv, run on each device so each finds its map."""
    bases = {}
    for device in ("cpu", DEVICE):
        c = coords.to(device)
        if "transposed_from" in geom:
            down = geom["transposed_from"]
            fine = tsp.SparseTensor(torch.randn(len(c), 2, generator=gen).to(device), c)
            w = torch.randn(volume(down["kernel_size"]), 2, 3, generator=gen).to(device)
            bases[device] = conv3d(fine, w, **down)
        else:
            bases[device] = tsp.SparseTensor(torch.randn(len(c), 1, generator=gen).to(device), c,
                                             stride=geom.get("input_stride", 1))
    assert torch.equal(bases[DEVICE].C.cpu(), bases["cpu"].C), "CUDA and CPU conv inputs differ in coordinates"
    feats = torch.randn(bases["cpu"].num_points, c_in, generator=gen).to(dtype)
    return bases["cpu"].replace_feats(feats.double()), bases[DEVICE].replace_feats(feats.to(DEVICE))


def random_weight(gen, geom: dict, c_in: int, c_out: int, dtype: torch.dtype) -> torch.Tensor:
    """Scaled so outputs stay near unit size (float16 range) whatever the volume and width."""
    k = volume(geom["kernel_size"])
    return (torch.randn(k, c_in, c_out, generator=gen) / math.sqrt(k * c_in)).to(dtype)


def run_cuda(x: tsp.SparseTensor, weight: torch.Tensor, geom: dict, config, grad_cpu_of_shape):
    """Forward and backward on CUDA, memory poisoned before each pass. ``grad_cpu_of_shape``
    makes the output gradient (on the CPU, in the output dtype) from the output shape."""
    feats = x.F.detach().clone().requires_grad_(True)
    w = weight.detach().to(DEVICE).requires_grad_(True)
    poison_cuda_memory()
    y = conv3d(x.replace_feats(feats), w, config=config, **conv_kwargs(geom))
    grad = grad_cpu_of_shape(tuple(y.F.shape)).to(y.F.dtype)
    grad_cuda = grad.to(DEVICE)
    poison_cuda_memory()
    y.F.backward(grad_cuda)
    torch.cuda.synchronize()
    return y, feats.grad, w.grad, grad


def run_cpu_reference(x_cpu: tsp.SparseTensor, weight: torch.Tensor, geom: dict, grad: torch.Tensor,
                      absolute: bool):
    """The same conv by the CPU library in float64 (over |values| when ``absolute``)."""
    f, w, g = x_cpu.F.detach().double(), weight.detach().double(), grad.double()
    if absolute:
        f, w, g = f.abs(), w.abs(), g.abs()
    f.requires_grad_(True)
    w.requires_grad_(True)
    y = conv3d(x_cpu.replace_feats(f), w, config=ConvConfig(), **conv_kwargs(geom))
    y.F.backward(g)
    return y, f.grad, w.grad


def errors_against(ours, ref, mag, dtype_name: str) -> dict:
    """Forward / dgrad / wgrad errors of ``ours`` = (out, dfeats, dweight) against ``ref``."""
    scaled = DTYPES[dtype_name][3]
    names = ("forward", "dgrad", "wgrad")
    return {n: rel_err(o, r, m if scaled else r) for n, o, r, m in zip(names, ours, ref, mag)}


def assert_small(errors: dict, tolerance: float, context: str = ""):
    bad = {k: v for k, v in errors.items() if not v < tolerance}
    assert not bad, f"{context} relative errors above {tolerance}: {bad} (all: {errors})"


def check_case(gen, coords, geom, config, dtype_name, c_in, c_out):
    """One config on one input against the float64 CPU library; returns our results."""
    dtype, tf32, tol, _ = DTYPES[dtype_name]
    set_tf32(tf32)
    x_cpu, x_cuda = conv_inputs(gen, coords, geom, c_in, dtype)
    weight = random_weight(gen, geom, c_in, c_out, dtype)
    grad_seed = int(torch.randint(0, 2 ** 31, (1,), generator=gen))
    def make_grad(shape):
        return torch.randn(shape, generator=torch.Generator().manual_seed(grad_seed))

    y, dfeats, dweight, grad = run_cuda(x_cuda, weight, geom, config, make_grad)
    assert y.F.shape == (y.C.shape[0], c_out)
    assert y.F.dtype == dfeats.dtype == dweight.dtype == dtype
    assert all(t.device.type == DEVICE for t in (y.F, y.C, dfeats, dweight))
    assert_finite(out=y.F, dgrad=dfeats, wgrad=dweight)
    ref_y, ref_df, ref_dw = run_cpu_reference(x_cpu, weight, geom, grad, absolute=False)
    assert torch.equal(y.C.cpu(), ref_y.C), "output coordinates differ from the CPU's"
    mags = run_cpu_reference(x_cpu, weight, geom, grad, absolute=True)
    mags = (mags[0].F, mags[1], mags[2])
    errors = errors_against((y.F, dfeats, dweight), (ref_y.F, ref_df, ref_dw), mags, dtype_name)
    assert_small(errors, tol)
    return y, dfeats, dweight


# --------------------------------------------------------------------------------------------
# 1. Every configuration x geometry against the float64 CPU library
# --------------------------------------------------------------------------------------------
DTYPE_NAMES = list(DTYPES)
CASES = [(g, c, DTYPE_NAMES[(i + j) % len(DTYPE_NAMES)], ("random", "lidar")[(i + j) % 2],
          CHANNEL_PAIRS[(i + 3 * j) % len(CHANNEL_PAIRS)])
         for (i, g), (j, c) in itertools.product(enumerate(GEOMETRIES), enumerate(CONFIGS))]


@pytest.mark.parametrize("geometry, config, dtype, source, channels", CASES,
                         ids=[f"{g}-{c}-{d}-{s}-{ci}x{co}" for g, c, d, s, (ci, co) in CASES])
def test_cuda_matches_cpu_float64(geometry, config, dtype, source, channels, gen, restore_switches):
    geom = GEOMETRIES[geometry]
    check_case(gen, input_coords(gen, source), geom, CONFIGS[config], dtype, *channels)


# Every dtype with both dataflows on the channel counts that defeat vector loads, and on wide ones.
DTYPE_SWEEP = list(itertools.product(DTYPES, named("gs_eps0_thr0", "gs_eps0.5_thr50", "ig_unsorted", "ig_sorted_split2",
                                                   "fod"),
                                     [(3, 13), (37, 5), (64, 128)]))


@pytest.mark.parametrize("dtype, config, channels", DTYPE_SWEEP,
                         ids=[f"{d}-{c}-{ci}x{co}" for d, c, (ci, co) in DTYPE_SWEEP])
def test_dtypes_and_channels_on_lidar(dtype, config, channels, gen, restore_switches):
    check_case(gen, lidar_scene(0), GEOMETRIES["subm_k3"], CONFIGS[config], dtype, *channels)


# Every Triton tile of every compute mode, on both tiled dataflows.
MODE_DTYPES = {"half": "float16", "tf32": "tf32", "fp32": "float32", "fp64": "float64"}
TILE_CASES = [(mode, t.name, dataflow) for mode in MODE_DTYPES for t in tiles_for(mode)
              for dataflow in ("fetch_on_demand", "implicit_gemm")]


@pytest.mark.parametrize("mode, tile, dataflow", TILE_CASES, ids=[f"{m}-{t}-{d}" for m, t, d in TILE_CASES])
def test_every_triton_tile(mode, tile, dataflow, gen, restore_switches):
    extra = {"sorted": True, "split_mask_num": 2} if dataflow == IG else {}
    config = ConvConfig(dataflow, backend="triton", tile=tile, **extra)
    check_case(gen, lidar_scene(2), GEOMETRIES["subm_k3"], config, MODE_DTYPES[mode], 37, 70)


# --------------------------------------------------------------------------------------------
# 2. All configurations agree on whole 64-beam scans
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scan64():
    """Two whole generated 64-beam scans at 0.1 m as two batch entries (about 90k voxels)."""
    seed = fresh_seed() % 100_000
    rows = []
    for b in range(2):
        voxels = torch.from_numpy(sparse_quantize(generate_scan(64, seed=seed + b)["points"][:, :3], 0.1))
        rows.append(torch.cat([torch.full((len(voxels), 1), b, dtype=torch.int32), voxels], 1))
    return torch.cat(rows), seed


SCAN_LAYERS = {"subm_k3": GEOMETRIES["subm_k3"], "k2s2": GEOMETRIES["k2s2_spconv"],
               "transposed_k3s2p1": GEOMETRIES["transposed_k3s2p1"]}
SCAN_CASES = list(itertools.product(SCAN_LAYERS, DTYPES))


@pytest.mark.parametrize("layer, dtype", SCAN_CASES, ids=[f"{l}-{d}" for l, d in SCAN_CASES])
def test_configs_agree_on_64_beam_scans(layer, dtype, scan64, restore_switches):
    coords, seed = scan64
    assert 40_000 < len(coords) < 250_000, f"scans {seed}, {seed + 1} have {len(coords)} voxels"
    geom = SCAN_LAYERS[layer]
    torch_dtype, tf32, tol, _ = DTYPES[dtype]
    set_tf32(tf32)
    gen = torch.Generator().manual_seed(seed)
    x_cpu, x_cuda = conv_inputs(gen, coords, geom, 32, torch_dtype)
    weight = random_weight(gen, geom, 32, 32, torch_dtype)

    def make_grad(shape):
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed + 7))

    results = {}
    for name, config in CONFIGS.items():
        y, df, dw, grad = run_cuda(x_cuda, weight, geom, config, make_grad)
        assert_finite(out=y.F, dgrad=df, wgrad=dw)
        results[name] = (y.F.cpu(), df.cpu(), dw.cpu())
    ref_y, ref_df, ref_dw = run_cpu_reference(x_cpu, weight, geom, grad, absolute=False)
    mag = run_cpu_reference(x_cpu, weight, geom, grad, absolute=True)
    ref, mag = (ref_y.F, ref_df, ref_dw), (mag[0].F, mag[1], mag[2])
    failures = {}
    base_name, base = next(iter(results.items()))
    for name, ours in results.items():
        against_ref = errors_against(ours, ref, mag, dtype)
        # Two results each within tol of the reference are within 2 tol of each other.
        against_base = errors_against(ours, base, mag, dtype)
        bad = {f"{k} vs reference": v for k, v in against_ref.items() if not v < tol}
        bad.update({f"{k} vs {base_name}": v for k, v in against_base.items() if not v < 2 * tol})
        if bad:
            failures[name] = bad
    assert not failures, f"scans {seed}, {seed + 1} ({len(coords)} voxels): {failures}"


# --------------------------------------------------------------------------------------------
# 3. Bit-identical repeats
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_scan():
    rows = []
    for b in range(2):
        voxels = torch.from_numpy(sparse_quantize(generate_scan(64, seed=91 + b, max_range=15.0)["points"][:, :3], 0.2))
        rows.append(torch.cat([torch.full((len(voxels), 1), b, dtype=torch.int32), voxels], 1))
    return torch.cat(rows)


def run_network(coords: torch.Tensor, config, dtype: torch.dtype, seed: int) -> dict:
    """SubM k3 -> strided k2 s2 -> transposed k2 s2 on fresh CUDA tensors (maps rebuilt);
    every output and gradient."""
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(len(coords), 16, generator=gen).to(dtype).to(DEVICE).requires_grad_(True)
    weights = [(torch.randn(k, 16, 16, generator=gen) / math.sqrt(16 * k)).to(dtype).to(DEVICE).requires_grad_(True)
               for k in (27, 8, 8)]
    x = tsp.SparseTensor(feats, coords.to(DEVICE))
    y1 = conv3d(x, weights[0], 3, config=config)
    y2 = conv3d(y1, weights[1], 2, stride=2, config=config)
    y3 = conv3d(y2, weights[2], 2, stride=2, transposed=True, config=config)
    grad = torch.randn(y3.F.shape, generator=gen).to(dtype).to(DEVICE)
    (y1.F.float().square().sum() * 1e-3 + (y3.F.float() * grad.float()).sum()).backward()
    out = {"subm.out": y1.F, "strided.coords": y2.C, "strided.out": y2.F, "transposed.out": y3.F,
           "feats.grad": feats.grad, "subm.wgrad": weights[0].grad, "strided.wgrad": weights[1].grad,
           "transposed.wgrad": weights[2].grad}
    return {k: v.detach().cpu() for k, v in out.items()}


def assert_bit_identical(runs: dict):
    (base_name, base), *others = runs.items()
    for name, other in others:
        differ = [k for k in base if not torch.equal(base[k], other[k])]
        assert not differ, f"{name} differs from {base_name} in {differ}"


REPEAT_CASES = list(itertools.product(CONFIGS, ["float32", "float16"]))


@pytest.mark.parametrize("config, dtype", REPEAT_CASES, ids=[f"{c}-{d}" for c, d in REPEAT_CASES])
def test_deterministic_mode_is_bit_identical(config, dtype, small_scan, restore_switches):
    backends.deterministic = True
    seed = fresh_seed()
    runs = {f"run {i}": run_network(small_scan, CONFIGS[config], DTYPES[dtype][0], seed) for i in range(3)}
    assert_bit_identical(runs)


@pytest.mark.parametrize("config", ["gs_eps0_thr0[triton]", "ig_sorted_split2[native]", "fod[triton]", "fod[native]"])
def test_native_and_torch_maps_give_the_same_results(config, small_scan, restore_switches):
    """Maps from the native CUDA builders and from torch ops are equal (test_cuda_kmap.py), so
    the convs over them are bit-identical."""
    backends.deterministic = True
    seed = fresh_seed()
    runs = {}
    for kmap_backend in ("torch", "native"):
        backends.kmap_backend = kmap_backend
        runs[f"maps by {kmap_backend}"] = run_network(small_scan, CONFIGS[config], torch.float32, seed)
    assert_bit_identical(runs)


@pytest.mark.parametrize("config", GATHER_SCATTER)
def test_gather_scatter_is_bit_identical_without_the_flag(config, small_scan, restore_switches):
    """gather_scatter on CUDA is deterministic by construction: the flag changes nothing."""
    seed = fresh_seed()
    backends.deterministic = False
    runs = {f"flag off, run {i}": run_network(small_scan, CONFIGS[config], torch.float32, seed) for i in range(2)}
    backends.deterministic = True
    runs["flag on"] = run_network(small_scan, CONFIGS[config], torch.float32, seed)
    assert_bit_identical(runs)


# --------------------------------------------------------------------------------------------
# 4. float64 on CUDA against the dense oracle
# --------------------------------------------------------------------------------------------
ORACLE_CASES = list(itertools.product(GEOMETRIES, named("gs_eps0_thr0", "gs_eps1_thrinf", "ig_unsorted",
                                                         "ig_sorted_split4", "mixed_ig_gs_ig", "fod")))


@pytest.mark.parametrize("geometry, config", ORACLE_CASES, ids=[f"{g}-{c}" for g, c in ORACLE_CASES])
def test_float64_matches_dense_oracle(geometry, config, gen):
    geom = GEOMETRIES[geometry]
    coords = random_coords(gen, 300, batch=2, low=-4, high=6)
    x_cpu, x_cuda = conv_inputs(gen, coords, geom, 5, torch.float64)
    weight = random_weight(gen, geom, 5, 6, torch.float64)
    y, dfeats, dweight, grad = run_cuda(x_cuda, weight, geom, CONFIGS[config],
                                        lambda shape: torch.randn(shape, generator=gen))
    f = x_cpu.F.detach().clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    args = (geom["kernel_size"], geom.get("stride", 1), geom.get("dilation", 1), resolved_padding(geom))
    ref = reference_conv(x_cpu.C, f, w, y.C.cpu(), *args, transposed=geom.get("transposed", False))
    ref.backward(grad)
    errors = {"forward": rel_err(y.F, ref, ref), "dgrad": rel_err(dfeats, f.grad, f.grad),
              "wgrad": rel_err(dweight, w.grad, w.grad)}
    assert_small(errors, 1e-10)


# --------------------------------------------------------------------------------------------
# 5. Autocast
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", named("gs_eps0_thr0", "ig_sorted_split1", "mixed_gs_ig_gs", "fod"))
def test_autocast_runs_in_float16(config, gen):
    coords = lidar_scene(1)
    geom = GEOMETRIES["subm_k3"]
    x_cpu, x_cuda = conv_inputs(gen, coords, geom, 16, torch.float32)
    weight = random_weight(gen, geom, 16, 24, torch.float32).to(DEVICE).requires_grad_(True)
    feats = x_cuda.F.clone().requires_grad_(True)
    with torch.autocast(DEVICE, dtype=torch.float16):
        y = conv3d(x_cuda.replace_feats(feats), weight, 3, config=CONFIGS[config])
    assert y.F.dtype == torch.float16
    y.F.float().sum().backward()
    assert feats.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    f, w = x_cpu.F.half().double(), weight.detach().cpu().half().double()
    ref = conv3d(x_cpu.replace_feats(f), w, 3)
    magnitude = conv3d(x_cpu.replace_feats(f.abs()), w.abs(), 3)  # see the module docstring
    assert rel_err(y.F, ref.F, magnitude.F) < 1e-2
    assert_finite(dgrad=feats.grad, wgrad=weight.grad)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zero_output_channels_give_empty_outputs(config, dtype, gen):
    """C_out = 0 (the native CPU kernels once crashed here): an [N, 0] output, a zero input
    gradient and an empty weight gradient, on every config and backend."""
    coords = lidar_scene(0)
    feats = torch.randn(len(coords), 16, generator=gen).to(DEVICE, dtype).requires_grad_(True)
    weight = torch.randn(27, 16, 0, generator=gen).to(DEVICE, dtype).requires_grad_(True)
    y = conv3d(tsp.SparseTensor(feats, coords.to(DEVICE)), weight, 3, config=CONFIGS[config])
    assert y.F.shape == (len(coords), 0) and y.F.dtype == dtype
    y.F.sum().backward()
    torch.cuda.synchronize()
    assert torch.equal(feats.grad, torch.zeros_like(feats))
    assert weight.grad.shape == weight.shape


# --------------------------------------------------------------------------------------------
# 6. The gather_scatter ops against the CPU ops on the same pairs
# --------------------------------------------------------------------------------------------
def cpu_pairs(gen, coords=None, kernel_size=3):
    """A submanifold map built on the CPU (independent of the CUDA map builders) and its pairs."""
    coords = random_coords(gen, 600, batch=2, low=-5, high=6) if coords is None else coords
    geometry = ConvGeometry.make(kernel_size)
    kmap = submanifold_map(KernelMapCache(), coords, geometry, None)
    return kmap, kmap.pairs_sorted_by("out")


def unaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values in a contiguous tensor whose data starts one element past an aligned
    address: the kernels must fall back from wide vector loads."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


OP_CASES = list(itertools.product(["float32", "float64", "float16", "bfloat16"], [False, True],
                                  [(0.0, 0), (0.6, 10 ** 9)], [False, True], ["host", "device"]))


@pytest.mark.parametrize("dtype, transpose, grouping, misaligned, counts", OP_CASES,
                         ids=[f"{d}-{'T' if t else 'N'}-eps{g[0]}-{'unaligned' if m else 'aligned'}-{c}_counts"
                              for d, t, g, m, c in OP_CASES])
@pytest.mark.native_cuda
def test_gather_scatter_ops_match_cpu(dtype, transpose, grouping, misaligned, counts, gen):
    """The CUDA ops take the offsets and identity flags on the host (what KernelMap passes: no
    device read) or on the device (read back); both give the CPU op's result."""
    torch_dtype, _, tol, _ = DTYPES[dtype]
    kmap, p = cpu_pairs(gen)
    c_in, c_out = 12, 18  # 18 % 4 = 2: the scatter's two-element vectors
    weight = random_weight(gen, dict(kernel_size=3), c_in, c_out, torch_dtype)
    c_src = c_out if transpose else c_in
    feats = torch.randn(kmap.num_in, c_src, generator=gen).to(torch_dtype)
    grad = torch.randn(kmap.num_out, c_out, generator=gen).to(torch_dtype)
    src, dst = (p.out_idx, p.in_idx) if transpose else (p.in_idx, p.out_idx)
    num_dst = kmap.num_in if transpose else kmap.num_out
    on_cuda = [t.to(DEVICE) for t in (src, dst)]
    on_cuda += [p.offsets, p.identity] if counts == "host" else [p.offsets.to(DEVICE), p.identity.to(DEVICE)]
    f_cuda, w_cuda, g_cuda = feats.to(DEVICE), weight.to(DEVICE), grad.to(DEVICE)
    if misaligned:
        f_cuda, g_cuda = unaligned(f_cuda), unaligned(g_cuda)
        assert f_cuda.data_ptr() % 16 != 0
    poison_cuda_memory()
    out = ops.gather_scatter_forward(f_cuda, w_cuda, *on_cuda, num_dst, transpose, *grouping)
    poison_cuda_memory()
    w_in, w_pairs = ([p.in_idx, p.out_idx], [t.to(DEVICE) for t in (p.in_idx, p.out_idx)])
    x_in = torch.randn(kmap.num_in, c_in, generator=gen).to(torch_dtype)
    x_cuda = unaligned(x_in.to(DEVICE)) if misaligned else x_in.to(DEVICE)
    dw = ops.gather_scatter_wgrad(x_cuda, g_cuda, *w_pairs, *on_cuda[2:])
    torch.cuda.synchronize()
    assert out.dtype == dw.dtype == torch_dtype and out.shape == (num_dst, c_in if transpose else c_out)
    assert_finite(out=out, wgrad=dw)
    ref = ops.gather_scatter_forward(feats.double(), weight.double(), src, dst, p.offsets, p.identity, num_dst,
                                     transpose)
    ref_dw = ops.gather_scatter_wgrad(x_in.double(), grad.double(), *w_in, p.offsets, p.identity)
    mag = ops.gather_scatter_forward(feats.double().abs(), weight.double().abs(), src, dst, p.offsets, p.identity,
                                     num_dst, transpose)
    mag_dw = ops.gather_scatter_wgrad(x_in.double().abs(), grad.double().abs(), *w_in, p.offsets, p.identity)
    scaled = DTYPES[dtype][3]
    errors = {"forward": rel_err(out, ref, mag if scaled else ref),
              "wgrad": rel_err(dw, ref_dw, mag_dw if scaled else ref_dw)}
    assert_small(errors, tol)


@pytest.mark.native_cuda
def test_gather_scatter_ops_offsets_without_pairs(gen):
    """Points on the plane z = 0: 18 of the 27 offsets have no pairs; their weight gradient is
    zero, and empty offsets do not upset the grouping."""
    coords = random_coords(gen, 200, batch=2, low=-5, high=6)
    coords[:, 3] = 0
    coords = torch.unique(coords, dim=0)
    kmap, p = cpu_pairs(gen, coords)
    feats = torch.randn(kmap.num_in, 6, generator=gen)
    weight = torch.randn(27, 6, 4, generator=gen)
    grad = torch.randn(kmap.num_out, 4, generator=gen)
    pairs = (p.in_idx, p.out_idx, p.offsets, p.identity)
    for eps, thresh in ((0.0, 0), (1.0, 10 ** 9)):
        out = ops.gather_scatter_forward(feats.to(DEVICE), weight.to(DEVICE), *[t.to(DEVICE) for t in pairs], kmap.num_out,
                                         False, eps, thresh)
        ref, magnitude = (ops.gather_scatter_forward(f, w, *pairs, kmap.num_out, False)
                          for f, w in ((feats.double(), weight.double()), (feats.double().abs(), weight.double().abs())))
        assert rel_err(out, ref, magnitude) < 1e-5
    dw = ops.gather_scatter_wgrad(feats.to(DEVICE), grad.to(DEVICE), *[t.to(DEVICE) for t in pairs]).cpu()
    dz = torch.arange(27) % 3 - 1
    assert torch.count_nonzero(dw[dz != 0]) == 0
    assert bool((dw[dz == 0].abs().sum((1, 2)) > 0).all())


# --------------------------------------------------------------------------------------------
# 7. More than 2^31 feature elements
# --------------------------------------------------------------------------------------------
BLOCK = (512, 256, 256)  # 2^25 points: with the extra 1000, N = 2^31 / 64 + 1000 rows of 64 channels
EXTRA = 1000
SIZE_ERROR = re.compile(r"2\^31|2\*\*31|2147483647|int32|32-bit|too large|too many|exceed|overflow|limit", re.I)
DEVICE_FAULT = re.compile(r"illegal memory access|misaligned address|unspecified launch failure|CUDA error", re.I)


def large_coords() -> torch.Tensor:
    """A dense x-major block (z fastest) in batch 0, then EXTRA points of a 32-wide plane in batch 1."""
    r = torch.arange(math.prod(BLOCK), device=DEVICE, dtype=torch.int32)
    block = torch.stack([torch.zeros_like(r), r // (BLOCK[1] * BLOCK[2]), (r // BLOCK[2]) % BLOCK[1], r % BLOCK[2]], 1)
    i = torch.arange(EXTRA, device=DEVICE, dtype=torch.int32)
    extra = torch.stack([torch.ones_like(i), torch.zeros_like(i), i // 32, i % 32], 1)
    return torch.cat([block, extra])


def large_row_of(c: torch.Tensor) -> torch.Tensor:
    """Row of each (batch, x, y, z) in large_coords(), or -1 if absent (computed, not looked up)."""
    b, x, y, z = c.long().unbind(-1)
    in_block = (b == 0) & (x >= 0) & (x < BLOCK[0]) & (y >= 0) & (y < BLOCK[1]) & (z >= 0) & (z < BLOCK[2])
    block_row = (x * BLOCK[1] + y) * BLOCK[2] + z
    extra_row = y * 32 + z
    in_extra = (b == 1) & (x == 0) & (y >= 0) & (z >= 0) & (z < 32) & (extra_row < EXTRA)
    row = torch.full_like(x, -1)
    row = torch.where(in_block, block_row, row)
    return torch.where(in_extra, math.prod(BLOCK) + extra_row, row)


@pytest.mark.parametrize("config", named("gs_eps0_thr0", "ig_sorted_split1", "fod"))
def test_more_than_2_31_feature_elements(config, gen):
    if torch.cuda.get_device_properties(0).total_memory < 70 * 2 ** 30:
        pytest.skip("needs a GPU with 70 GiB or more")
    coords = large_coords()
    n, c = len(coords), 64
    assert n * c > 2 ** 31
    cuda_gen = torch.Generator(device=DEVICE).manual_seed(int(torch.randint(0, 2 ** 31, (1,), generator=gen)))
    feats = torch.randn(n, c, device=DEVICE, dtype=torch.float16, generator=cuda_gen)
    weight = (torch.randn(27, c, c, generator=gen) / math.sqrt(27 * c)).half()
    x = tsp.SparseTensor(feats, coords)
    try:
        poison_cuda_memory()
        with torch.no_grad():
            y = conv3d(x, weight.to(DEVICE), 3, config=CONFIGS[config])
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as err:  # a RuntimeError too, but not a clear size error
        pytest.fail(f"out of GPU memory on a device with 70 GiB or more: {err}")
    except (RuntimeError, ValueError, NotImplementedError) as err:
        message = str(err)
        assert not DEVICE_FAULT.search(message), f"a device fault, not a clear error: {message}"
        assert SIZE_ERROR.search(message), f"the error does not say what limit was hit: {message}"
        return
    assert y.F.shape == (n, c) and torch.equal(y.C, coords)
    assert_finite(out=y.F)
    # Sampled rows: random ones, the block's first and last rows, and the extra plane.
    rows = torch.cat([torch.randint(0, n, (3000,), generator=gen), torch.arange(0, 64),
                      torch.arange(math.prod(BLOCK) - 64, n)]).unique()
    offsets = torch.stack(torch.meshgrid(*[torch.arange(3)] * 3, indexing="ij"), -1).reshape(27, 3) - 1
    q = coords[rows.to(DEVICE)].cpu()
    neighbours = q[:, None, :].repeat(1, 27, 1)
    neighbours[:, :, 1:] += offsets.int()
    src = large_row_of(neighbours)  # [S, 27]
    present = src >= 0
    gathered = feats[src.clamp(min=0).to(DEVICE)].cpu().double() * present[..., None]  # [S, 27, C]
    ref = torch.einsum("skc,kcd->sd", gathered, weight.double())
    magnitude = torch.einsum("skc,kcd->sd", gathered.abs(), weight.double().abs())
    err = rel_err(y.F[rows.to(DEVICE)], ref, magnitude)
    assert err < 1e-2, f"sampled rows: relative error {err}"


# --------------------------------------------------------------------------------------------
# 8. Bad inputs to the gather_scatter ops
# --------------------------------------------------------------------------------------------
@pytest.fixture
def validating():
    """backends.validate_plans on: the op wrappers validate every call (the CUDA ops check
    shapes only; index values are validated when a map builds its views)."""
    saved = backends.validate_plans
    backends.validate_plans = True
    try:
        yield
    finally:
        backends.validate_plans = saved


@pytest.fixture
def subm_cuda(gen):
    kmap, p = cpu_pairs(gen, random_coords(gen, 150, batch=2, low=-3, high=4))
    feats = torch.randn(kmap.num_in, 4, generator=gen).to(DEVICE)
    weight = torch.randn(27, 4, 5, generator=gen).to(DEVICE)
    pairs = [t.to(DEVICE) for t in (p.in_idx, p.out_idx, p.offsets, p.identity)]
    return kmap, feats, weight, pairs


def first_gathered_pair(offsets: torch.Tensor, identity: torch.Tensor):
    counts = offsets.diff().cpu()
    k = next(k for k in range(len(counts)) if not bool(identity[k]) and int(counts[k]) > 1)
    return int(offsets[k]), k


def still_works(kmap, feats, weight, pairs):
    out = ops.gather_scatter_forward(feats, weight, *pairs, kmap.num_out, False)
    torch.cuda.synchronize()
    assert_finite(out=out)


@pytest.mark.parametrize("which, value, message", [
    (0, 10 ** 6, r"source index is out of range"),
    (0, -1, r"source index is out of range"),
    (1, 10 ** 6, r"destination index is out of range"),
    (1, -5, r"destination index is out of range"),
])
@pytest.mark.native_cuda
def test_out_of_range_indices_are_rejected(subm_cuda, validating, which, value, message):
    kmap, feats, weight, pairs = subm_cuda
    pos, _ = first_gathered_pair(pairs[2], pairs[3])
    bad = [t.clone() for t in pairs]
    bad[which][pos] = value
    with pytest.raises(RuntimeError, match=message):
        ops.gather_scatter_forward(feats, weight, *bad, kmap.num_out, False)
    with pytest.raises(RuntimeError, match=message):
        ops.gather_scatter_wgrad(feats, torch.randn(kmap.num_out, 5, device=DEVICE), *bad)
    still_works(kmap, feats, weight, pairs)


@pytest.mark.native_cuda
def test_identity_flag_on_an_ordinary_offset_is_rejected(subm_cuda, validating):
    kmap, feats, weight, pairs = subm_cuda
    _, k = first_gathered_pair(pairs[2], pairs[3])
    identity = pairs[3].clone()
    identity[k] = True
    with pytest.raises(RuntimeError, match=rf"identity\[{k}\] is set"):
        ops.gather_scatter_forward(feats, weight, *pairs[:3], identity, kmap.num_out, False)
    still_works(kmap, feats, weight, pairs)


@pytest.mark.native_cuda
def test_identity_offset_that_is_not_the_identity_is_rejected(subm_cuda, validating):
    kmap, feats, weight, pairs = subm_cuda
    k = int(pairs[3].nonzero()[0])
    src = pairs[0].clone()
    start = int(pairs[2][k])
    src[start], src[start + 1] = pairs[0][start + 1], pairs[0][start]
    with pytest.raises(RuntimeError, match=rf"identity\[{k}\] is set but offset {k} does not map every row"):
        ops.gather_scatter_forward(feats, weight, src, *pairs[1:], kmap.num_out, False)


@pytest.mark.native_cuda
def test_duplicate_destination_within_an_offset_is_rejected(subm_cuda, validating):
    """The scatter has no atomics; a repeated destination would lose sums silently."""
    kmap, feats, weight, pairs = subm_cuda
    pos, k = first_gathered_pair(pairs[2], pairs[3])
    dst = pairs[1].clone()
    dst[pos + 1] = dst[pos]
    with pytest.raises(RuntimeError, match=rf"offset {k} pairs some destination row more than once"):
        ops.gather_scatter_forward(feats, weight, pairs[0], dst, *pairs[2:], kmap.num_out, False)
    still_works(kmap, feats, weight, pairs)


@pytest.mark.native_cuda
def test_bad_offsets_are_rejected(subm_cuda, validating):
    kmap, feats, weight, pairs = subm_cuda
    offsets = pairs[2].clone()
    offsets[5], offsets[6] = pairs[2][6] + 1, pairs[2][5]
    with pytest.raises(RuntimeError, match="non-decreasing|start at 0 and end"):
        ops.gather_scatter_forward(feats, weight, *pairs[:2], offsets, pairs[3], kmap.num_out, False)
    short = pairs[2].clone()
    short[-1] -= 1
    with pytest.raises(RuntimeError, match="end at the number of pairs"):
        ops.gather_scatter_forward(feats, weight, *pairs[:2], short, pairs[3], kmap.num_out, False)
    still_works(kmap, feats, weight, pairs)


@pytest.mark.native_cuda
def test_mixed_devices_and_dtypes_are_rejected(subm_cuda):
    kmap, feats, weight, pairs = subm_cuda
    with pytest.raises(RuntimeError, match="contiguous tensors on the feats' device"):
        ops.gather_scatter_forward(feats, weight, pairs[0].cpu(), *pairs[1:], kmap.num_out, False)
    with pytest.raises(RuntimeError, match="weight is on"):
        ops.gather_scatter_forward(feats, weight.cpu(), *pairs, kmap.num_out, False)
    with pytest.raises(RuntimeError, match="grad_out must be a CUDA tensor"):
        ops.gather_scatter_wgrad(feats, torch.randn(kmap.num_out, 5), *pairs)
    with pytest.raises(RuntimeError, match="support float32, float64, float16 and bfloat16"):
        ops.gather_scatter_forward(feats.int(), weight.int(), *pairs, kmap.num_out, False)
    with pytest.raises(RuntimeError, match="does not match"):
        ops.gather_scatter_forward(feats, weight.double(), *pairs, kmap.num_out, False)
    with pytest.raises(RuntimeError, match="epsilon must be in"):
        ops.gather_scatter_forward(feats, weight, *pairs, kmap.num_out, False, 1.5, 10)
    with pytest.raises(RuntimeError, match="mm_thresh must be >= 0"):
        ops.gather_scatter_forward(feats, weight, *pairs, kmap.num_out, False, 0.5, -1)
    still_works(kmap, feats, weight, pairs)
