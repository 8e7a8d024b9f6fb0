"""Native CUDA fetch-on-demand ops against the CPU op (in float64) and the Triton kernels.

Op level, on maps built on the CPU (independent of the GPU map builders): the fused atomic
forward and the deterministic owned-rows forward, dgrad (pairs sorted by source, W^T) and the
weight gradient, in float16, bfloat16, float32 (exact and TF32) and float64, channel counts on and
off the 16-byte vector widths, maps with 8, 27 and 125 offsets (several warp scans and owned-rows
windows), offsets without pairs. Outputs land in memory poisoned with NaN first, so an unwritten
row fails. The Triton kernels run on the same inputs, so the first GPU run checks both GPU
implementations against one reference. Skipped without a GPU (and without a CUDA build).
"""
import pytest
import torch

import torchsparse_pp  # noqa: F401  (registers the ops)
from torchsparse_pp import ops
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map, submanifold_map
from torchsparse_pp.ops import triton as triton_kernels
from torchsparse_pp.ops.triton import runtime as triton_runtime
from conftest import fresh_seed, lidar_coords, random_coords

pytestmark = [pytest.mark.cuda, pytest.mark.native_cuda]

DEVICE = "cuda"
# name -> (dtype, TF32, tolerance); errors are norm-wise relative to the same sums over absolute
# values: float32 sums of any order stay far under 1e-5, fp16 / bf16 results of exact operands
# round once (at most 2^-11 / 2^-8 of that scale element by element, a bound).
DTYPES = {"f16": (torch.float16, False, 1e-2), "bf16": (torch.bfloat16, False, 1e-2),
          "f32": (torch.float32, False, 1e-5), "tf32": (torch.float32, True, 3e-4),
          "f64": (torch.float64, False, 1e-12)}
CHANNELS = [(3, 5), (16, 32), (37, 13), (64, 64), (96, 128)]


def poison():
    """Hands NaN-filled memory to the caching allocator, so rows a kernel never writes show up."""
    junk = torch.full((64 << 20,), float("nan"), device=DEVICE)
    del junk


@pytest.fixture(scope="module")
def kmaps():
    gen = torch.Generator().manual_seed(fresh_seed())
    lidar = lidar_coords(fresh_seed(), batch=2, voxel=0.2, box=16)
    rnd = random_coords(gen, 700, batch=2, low=-5, high=6)
    plane = rnd.clone()
    plane[:, 3] = 0  # 18 of 27 offsets have no pairs
    plane = torch.unique(plane, dim=0)
    return {
        "subm3_lidar": submanifold_map(KernelMapCache(), lidar, ConvGeometry.make(3), None),
        "subm5_random": submanifold_map(KernelMapCache(), rnd, ConvGeometry.make(5, 1, 1, 2), None),
        "k2s2_lidar": strided_map(KernelMapCache(), lidar, ConvGeometry.make(2, 2, 1, 0), "spconv", None),
        "k3s2_random": strided_map(KernelMapCache(), rnd, ConvGeometry.make(3, 2, 1, 1), "spconv", None),
        "subm3_plane": submanifold_map(KernelMapCache(), plane, ConvGeometry.make(3), None),
    }


def relative_error(out, ref, scale):
    out = out.double().cpu()
    assert torch.isfinite(out).all(), "non-finite values: a row was not written"
    return float((out - ref).norm() / scale.norm().clamp_min(1e-30))


def inputs(kmap, c_in, c_out, dtype, gen):
    K = kmap.out_in.shape[1]
    feats = torch.randn(kmap.num_in, c_in, generator=gen).to(dtype)
    weight = (torch.randn(K, c_in, c_out, generator=gen) / (K * c_in) ** 0.5).to(dtype)
    grad = torch.randn(kmap.num_out, c_out, generator=gen).to(dtype)
    return feats, weight, grad


def cpu_reference(kmap, feats, weight, grad):
    """Forward, dgrad and wgrad by the CPU op in float64."""
    p_out, p_in = kmap.pairs_sorted_by("out"), kmap.pairs_sorted_by("in")
    f, w, g = feats.double(), weight.double(), grad.double()
    fwd = ops.fetch_on_demand_forward(f, w, p_out.in_idx, p_out.out_idx, p_out.offsets, p_out.identity, kmap.num_out)
    dgrad = ops.fetch_on_demand_forward(g, w, p_in.out_idx, p_in.in_idx, p_in.offsets, p_in.identity, kmap.num_in, True)
    wgrad = ops.fetch_on_demand_wgrad(f, g, p_out.in_idx, p_out.out_idx, p_out.offsets, p_out.identity)
    return fwd, dgrad, wgrad


def cuda_pairs(kmap):
    return ([t.to(DEVICE) for t in (p.in_idx, p.out_idx, p.offsets, p.identity)]
            for p in (kmap.pairs_sorted_by("out"), kmap.pairs_sorted_by("in")))


def native(kmap, feats, weight, grad, deterministic, tf32):
    (i_o, o_o, off_o, id_o), (i_i, o_i, off_i, id_i) = cuda_pairs(kmap)
    f, w, g = feats.to(DEVICE), weight.to(DEVICE), grad.to(DEVICE)
    poison()
    fwd = ops.fetch_on_demand_forward(f, w, i_o, o_o, off_o, id_o, kmap.num_out, False, deterministic, tf32)
    poison()
    dgrad = ops.fetch_on_demand_forward(g, w, o_i, i_i, off_i, id_i, kmap.num_in, True, deterministic, tf32)
    poison()
    wgrad = ops.fetch_on_demand_wgrad(f, g, i_o, o_o, off_o, id_o, tf32)
    torch.cuda.synchronize()
    return fwd, dgrad, wgrad


def triton(kmap, feats, weight, grad, deterministic, tf32):
    """The same three passes by the Triton fetch-on-demand kernels."""
    kernels = triton_kernels.load("fetch_on_demand")
    (i_o, o_o, off_o, _), (i_i, o_i, off_i, _) = cuda_pairs(kmap)
    f, w, g = feats.to(DEVICE), weight.to(DEVICE), grad.to(DEVICE)
    if deterministic:
        fwd = kernels.forward_owned(f, w, kmap.out_in.to(DEVICE), kmap.num_out, False, None, tf32)
        dgrad = kernels.forward_owned(g, w, kmap.in_out.to(DEVICE), kmap.num_in, True, None, tf32)
    else:
        fwd = kernels.forward(f, w, i_o, o_o, off_o, kmap.num_out, False, None, tf32)
        dgrad = kernels.forward(g, w, o_i, i_i, off_i, kmap.num_in, True, None, tf32)
    wgrad = kernels.wgrad(f, g, i_o, o_o, off_o, None, tf32, deterministic)
    return fwd, dgrad, wgrad


@pytest.mark.parametrize("channels", CHANNELS, ids=[f"{a}x{b}" for a, b in CHANNELS])
@pytest.mark.parametrize("name", ["subm3_lidar", "subm5_random", "k2s2_lidar", "k3s2_random", "subm3_plane"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "owned_rows"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_ops_match_cpu_and_triton(kmaps, dtype, deterministic, name, channels):
    kmap = kmaps[name]
    torch_dtype, tf32, tol = DTYPES[dtype]
    gen = torch.Generator().manual_seed(fresh_seed())
    feats, weight, grad = inputs(kmap, *channels, torch_dtype, gen)
    refs = cpu_reference(kmap, feats, weight, grad)
    scales = cpu_reference(kmap, feats.abs(), weight.abs(), grad.abs())
    ours = native(kmap, feats, weight, grad, deterministic, tf32)
    shapes = [(kmap.num_out, channels[1]), (kmap.num_in, channels[0]), (kmap.out_in.shape[1], *channels)]
    for pass_name, out, ref, scale, shape in zip(("forward", "dgrad", "wgrad"), ours, refs, scales, shapes):
        assert out.shape == shape and out.dtype == torch_dtype and out.device.type == DEVICE, pass_name
        err = relative_error(out, ref, scale)
        assert err < tol, f"{pass_name}: relative error {err} against the CPU op"
    if triton_runtime.installed():
        for pass_name, a, b, scale in zip(("forward", "dgrad", "wgrad"), ours,
                                          triton(kmap, feats, weight, grad, deterministic, tf32), scales):
            diff = float((a.double() - b.double()).norm().cpu() / scale.norm().clamp_min(1e-30))
            assert diff < 2 * tol, f"{pass_name}: native and Triton differ by {diff}"


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_owned_rows_forward_and_wgrad_are_bit_identical(kmaps, dtype):
    kmap = kmaps["subm3_lidar"]
    torch_dtype = DTYPES[dtype][0]
    gen = torch.Generator().manual_seed(fresh_seed())
    feats, weight, grad = inputs(kmap, 32, 48, torch_dtype, gen)
    runs = [native(kmap, feats, weight, grad, True, False) for _ in range(3)]
    for other in runs[1:]:
        for pass_name, a, b in zip(("forward", "dgrad", "wgrad"), runs[0], other):
            assert torch.equal(a, b), f"{pass_name} differs between runs"


def unaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values in a contiguous tensor whose data starts one element past an aligned address."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "owned_rows"])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_misaligned_inputs_take_element_loads(kmaps, dtype, deterministic):
    """Channel counts that are multiples of the vector width but a base address that is not
    16-byte aligned: the element-load kernels run and agree with the CPU op."""
    kmap = kmaps["subm3_lidar"]
    torch_dtype, _, tol = DTYPES[dtype]
    gen = torch.Generator().manual_seed(fresh_seed())
    feats, weight, grad = inputs(kmap, 32, 64, torch_dtype, gen)
    ref_fwd, _, ref_wgrad = cpu_reference(kmap, feats, weight, grad)
    scale_fwd, _, scale_wgrad = cpu_reference(kmap, feats.abs(), weight.abs(), grad.abs())
    (i_o, o_o, off_o, id_o), _ = cuda_pairs(kmap)
    f, g = unaligned(feats.to(DEVICE)), unaligned(grad.to(DEVICE))
    assert f.data_ptr() % 16 != 0
    poison()
    out = ops.fetch_on_demand_forward(f, weight.to(DEVICE), i_o, o_o, off_o, id_o, kmap.num_out, False,
                                      deterministic)
    dw = ops.fetch_on_demand_wgrad(f, g, i_o, o_o, off_o, id_o)
    assert relative_error(out, ref_fwd, scale_fwd) < tol and relative_error(dw, ref_wgrad, scale_wgrad) < tol


def test_empty_inputs_give_zeros(kmaps):
    kmap = kmaps["subm3_lidar"]
    (i_o, o_o, off_o, id_o), _ = cuda_pairs(kmap)
    w = torch.randn(27, 4, 6, device=DEVICE)
    none = torch.zeros(28, dtype=torch.long, device=DEVICE)
    empty = i_o[:0]
    out = ops.fetch_on_demand_forward(torch.randn(5, 4, device=DEVICE), w, empty, empty, none, id_o, 7)
    assert out.shape == (7, 6) and not bool(out.any())
    dw = ops.fetch_on_demand_wgrad(torch.randn(5, 4, device=DEVICE), torch.randn(7, 6, device=DEVICE), empty, empty,
                                   none, id_o)
    assert dw.shape == (27, 4, 6) and not bool(dw.any())
    zero_rows = ops.fetch_on_demand_forward(torch.randn(kmap.num_in, 4, device=DEVICE), w, i_o, o_o, off_o, id_o, 0)
    assert zero_rows.shape == (0, 6)
