"""Cases and helpers shared by the dataflow tests (native in test_dataflows.py, Triton in
test_triton_dataflows.py): geometries, inputs on random and LiDAR-like coordinates, our conv
with backward, and the float64 dense oracle (oracle.py) with error measures.

float32 errors are measured norm-wise relative to the same sums taken over absolute values
(|feats|, |W|, |grad|): a float32 sum is accurate relative to the size of its terms, while a
sum of random terms can cancel to almost nothing.
"""
import functools

import torch

import torchsparse_pp as tsp
from torchsparse_pp.nn.functional import ConvConfig, PassConfigs, conv3d
from conftest import lidar_coords, random_coords, triple
from oracle import reference_conv, reference_conv_by_offset, reference_output_coords
from precision import assert_as_accurate_as_plain

TOLERANCE = 1e-5
FLOAT64_TOLERANCE = 1e-12

# Geometry: conv3d keyword arguments plus how the input is made.
#   transposed_from: the strided conv whose coarse output is the transposed conv's input;
#   input_stride: tensor stride of the input (generative convs go from stride 2 to 1).
GEOMETRIES = {
    "subm_k3": dict(kernel_size=3),
    "subm_k5": dict(kernel_size=5),  # 125 offsets: neighbour bitmasks wider than 64 bits
    "subm_k311": dict(kernel_size=(3, 1, 1)),
    "subm_k133_d2": dict(kernel_size=(1, 3, 3), dilation=2),
    "subm_k2": dict(kernel_size=2),
    "k2s2_spconv": dict(kernel_size=2, stride=2, downsample_mode="spconv"),
    "k2s2_minkowski": dict(kernel_size=2, stride=2, downsample_mode="minkowski"),
    "k3s2p1_spconv": dict(kernel_size=3, stride=2, padding=1, downsample_mode="spconv"),
    "k3s2p1_minkowski": dict(kernel_size=3, stride=2, padding=1, downsample_mode="minkowski"),
    "transposed_k3s2p1": dict(kernel_size=3, stride=2, padding=1, transposed=True,
                              transposed_from=dict(kernel_size=3, stride=2, padding=1)),
    "generative_k2s2": dict(kernel_size=2, stride=2, transposed=True, generative=True, input_stride=2),
}
CHANNEL_PAIRS = [(3, 5), (8, 4), (12, 10), (5, 2)]


def volume(kernel_size) -> int:
    kx, ky, kz = triple(kernel_size)
    return kx * ky * kz


def resolved_padding(geom: dict):
    """conv3d's padding: the given one, else centred for odd kernels and 0 for even ones."""
    if geom.get("padding") is not None:
        return triple(geom["padding"])
    k, d = triple(geom["kernel_size"]), triple(geom.get("dilation", 1))
    return tuple(dd * (kk - 1) // 2 if kk % 2 else 0 for kk, dd in zip(k, d))


def conv_kwargs(geom: dict) -> dict:
    keys = ("kernel_size", "stride", "dilation", "padding", "transposed", "generative", "downsample_mode")
    return {k: geom[k] for k in keys if k in geom}


def rel_to(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> float:
    """||a - b|| / ||scale|| in float64."""
    diff = (a.detach().double() - b.detach().double()).norm()
    return (diff / scale.detach().double().norm().clamp(min=1e-30)).item()


@functools.lru_cache(maxsize=None)
def lidar_scene(index: int) -> torch.Tensor:
    """One of a few LiDAR-like crops (2 scans each), built once per session."""
    return lidar_coords(1000 + index, batch=2)


def input_coords(gen: torch.Generator, source: str) -> torch.Tensor:
    if source == "lidar":
        return lidar_scene(int(torch.randint(0, 4, (1,), generator=gen)))
    return random_coords(gen, 300, batch=2, low=-4, high=6)


def make_input(gen: torch.Generator, geom: dict, source: str, c_in: int, dtype=torch.float32) -> tsp.SparseTensor:
    """The conv's input: features on random or LiDAR-like coordinates, for transposed convs
    the coarse output of the matching strided conv (so the transposed conv finds its map)."""
    coords = input_coords(gen, source)
    if "transposed_from" in geom:
        fine = tsp.SparseTensor(torch.randn(len(coords), 2, generator=gen), coords)
        down = geom["transposed_from"]
        coarse = conv3d(fine, torch.randn(volume(down["kernel_size"]), 2, 3, generator=gen), **down)
        return coarse.replace_feats(torch.randn(coarse.num_points, c_in, generator=gen).to(dtype))
    feats = torch.randn(len(coords), c_in, generator=gen).to(dtype)
    return tsp.SparseTensor(feats, coords, stride=geom.get("input_stride", 1))


def run_ours(x: tsp.SparseTensor, weight: torch.Tensor, geom: dict, config, grad_seed: int):
    """Forward + backward through conv3d; the output gradient is a fixed function of its shape."""
    feats = x.F.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    y = conv3d(x.replace_feats(feats), w, config=config, **conv_kwargs(geom))
    grad = torch.randn(y.F.shape, generator=torch.Generator().manual_seed(grad_seed)).to(y.F.dtype)
    y.F.backward(grad)
    return y, feats.grad, w.grad, grad


def run_oracle(x: tsp.SparseTensor, weight: torch.Tensor, out_coords: torch.Tensor, geom: dict,
               grad: torch.Tensor, magnitudes: bool = True):
    """Float64 dense reference (forward, dgrad, wgrad) and (with ``magnitudes``) the same over
    absolute values."""
    args = (geom["kernel_size"], geom.get("stride", 1), geom.get("dilation", 1), resolved_padding(geom))
    transposed = geom.get("transposed", False)
    results = []
    for absolute in (False, True)[:2 if magnitudes else 1]:
        f = x.F.detach().double()
        w = weight.detach().double()
        g = grad.double()
        if absolute:
            f, w, g = f.abs(), w.abs(), g.abs()
        f.requires_grad_(True)
        w.requires_grad_(True)
        out = reference_conv(x.C, f, w, out_coords, *args, transposed=transposed)
        out.backward(g)
        results.append((out.detach(), f.grad, w.grad))
    return results


def oracle_by_offset(x: tsp.SparseTensor, weight: torch.Tensor, out_coords: torch.Tensor, geom: dict,
                     grad: torch.Tensor, dtype: torch.dtype):
    """Forward and dgrad as GEMMs in ``dtype``, one per offset, give them: the sum of each
    offset's exact product rounded to ``dtype``, then rounded."""
    K, c_in = weight.shape[:2]
    args = (geom["kernel_size"], geom.get("stride", 1), geom.get("dilation", 1), resolved_padding(geom))
    feats = x.F.detach().double().repeat(1, K).requires_grad_(True)
    parts = reference_conv_by_offset(x.C, feats, weight.detach().double(), out_coords, *args,
                                     transposed=geom.get("transposed", False))
    parts.backward(grad.double().expand(K, *grad.shape))
    dfeats = feats.grad.reshape(len(feats), K, c_in).permute(1, 0, 2)
    rounded = lambda v: v.to(dtype).double().sum(0).to(dtype)  # noqa: E731
    return rounded(parts.detach()), rounded(dfeats)


def _pass_dataflows(config) -> dict:
    if isinstance(config, PassConfigs):
        return {"forward": config.forward.dataflow, "dgrad": config.dgrad.dataflow, "wgrad": config.wgrad.dataflow}
    return dict.fromkeys(("forward", "dgrad", "wgrad"), config.dataflow)


def reduced_precision_errors(x, weight, geom, config, y, dfeats, dweight, grad, what: str) -> dict:
    """Our forward, dgrad and wgrad in a reduced precision against the float64 oracle, held to the
    plain computation's error (precision.assert_as_accurate_as_plain): the float64 result rounded
    once to the dtype, except gather_scatter's forward and dgrad, whose plain way rounds each
    offset's GEMM (oracle_by_offset). A weight gradient's offsets are its own outputs."""
    names = ("forward", "dgrad", "wgrad")
    ours = dict(zip(names, (y.F, dfeats, dweight)))
    exact = dict(zip(names, run_oracle(x, weight, y.C, geom, grad, magnitudes=False)[0]))
    plain = {k: v.to(y.F.dtype) for k, v in exact.items()}
    by_offset = [k for k, flow in _pass_dataflows(config).items() if flow == "gather_scatter" and k != "wgrad"]
    if by_offset:
        plain.update((k, v) for k, v in zip(("forward", "dgrad"), oracle_by_offset(x, weight, y.C, geom, grad, y.F.dtype))
                     if k in by_offset)
    return assert_as_accurate_as_plain(ours, plain, exact, what=what)


def check_against_oracle(x, weight, geom, config, y, dfeats, dweight, grad, what: str = "") -> dict:
    """Our results against the float64 oracle in the precision they were computed in: float16 /
    bfloat16 by the plain-computation rule (reduced_precision_errors), float32 (TF32 included:
    the interpreter computes its dots in float32) and float64 norm-wise relative to the same sums
    over absolute values, within TOLERANCE / FLOAT64_TOLERANCE."""
    if y.F.dtype in (torch.float16, torch.bfloat16):
        return reduced_precision_errors(x, weight, geom, config, y, dfeats, dweight, grad, what)
    (ref, ref_df, ref_dw), (mag, mag_df, mag_dw) = run_oracle(x, weight, y.C, geom, grad)
    errors = {"forward": rel_to(y.F, ref, mag), "dgrad": rel_to(dfeats, ref_df, mag_df),
              "wgrad": rel_to(dweight, ref_dw, mag_dw)}
    assert_small(errors, FLOAT64_TOLERANCE if y.F.dtype == torch.float64 else TOLERANCE)
    return errors


def oracle_errors(x, weight, geom, config, gen) -> dict:
    grad_seed = int(torch.randint(0, 2 ** 31, (1,), generator=gen))
    y, dfeats, dweight, grad = run_ours(x, weight, geom, config, grad_seed)
    (ref, ref_df, ref_dw), (mag, mag_df, mag_dw) = run_oracle(x, weight, y.C, geom, grad)
    return y, {"forward": rel_to(y.F, ref, mag), "dgrad": rel_to(dfeats, ref_df, mag_df),
               "wgrad": rel_to(dweight, ref_dw, mag_dw)}


def assert_small(errors: dict, tolerance: float = TOLERANCE):
    bad = {k: v for k, v in errors.items() if not v < tolerance}
    assert not bad, f"relative errors above {tolerance}: {bad} (all: {errors})"


def library_abs_sums(x, weight, geom, grad):
    """The conv's sums over absolute values (|feats|, |W|, |grad|), by the library in float64."""
    f = x.F.detach().double().abs().requires_grad_(True)
    w = weight.detach().double().abs().requires_grad_(True)
    y = conv3d(x.replace_feats(f), w, config=ConvConfig(), **conv_kwargs(geom))
    y.F.backward(grad.double().abs())
    return y.F.detach(), f.grad, w.grad


def check_output_coords(x: tsp.SparseTensor, y: tsp.SparseTensor, geom: dict):
    """Coordinates do not depend on the dataflow; check them where the oracle defines them."""
    stride = geom.get("stride", 1)
    if geom.get("generative"):
        mode = "generative"
    elif geom.get("transposed") or triple(stride) == (1, 1, 1):
        return
    else:
        mode = geom.get("downsample_mode", "spconv")
    expected = reference_output_coords(x.C, geom["kernel_size"], stride, geom.get("dilation", 1),
                                       resolved_padding(geom), mode)
    assert torch.equal(y.C, expected)


def planar_coords(gen):
    """Points on the plane z = 0 only: every offset with dz != 0 has no pairs."""
    coords = random_coords(gen, 120, batch=2, low=-4, high=6)
    coords[:, 3] = 0
    return torch.unique(coords, dim=0)


EDGE_CASES = {
    # (geometry, coordinates, c_in, c_out)
    "empty_offsets_subm_k3": (dict(kernel_size=3), planar_coords, 4, 5),
    "empty_offsets_k3s2p1": (dict(kernel_size=3, stride=2, padding=1), planar_coords, 4, 5),
    "single_point_subm_k3": (dict(kernel_size=3), lambda g: torch.tensor([[0, 1, -2, 3]], dtype=torch.int32), 4, 3),
    "single_point_k2s2": (dict(kernel_size=2, stride=2), lambda g: torch.tensor([[1, -3, 2, 5]], dtype=torch.int32), 4, 3),
    "single_point_generative_k3s2": (dict(kernel_size=3, stride=2, transposed=True, generative=True, input_stride=2),
                                     lambda g: torch.tensor([[0, 2, 0, -1]], dtype=torch.int32), 4, 3),
    "channels_1_to_33_subm_k3": (dict(kernel_size=3), lambda g: lidar_scene(0), 1, 33),
    "channels_33_to_1_k2s2": (dict(kernel_size=2, stride=2), lambda g: lidar_scene(1), 33, 1),
    "channels_33_to_33_subm_k5": (dict(kernel_size=5), lambda g: random_coords(g, 60, batch=1), 33, 33),
    # More than two column blocks of 64 in the register kernels, both ways (forward 200, dgrad 150).
    "channels_150_to_200_subm_k3": (dict(kernel_size=3), lambda g: random_coords(g, 60, batch=1), 150, 200),
    "kernel_211_subm": (dict(kernel_size=(2, 1, 1)), lambda g: random_coords(g, 300, batch=2, low=-4, high=6), 6, 5),
    "kernel_211_stride_211": (dict(kernel_size=(2, 1, 1), stride=(2, 1, 1)), lambda g: lidar_scene(2), 6, 5),
    "kernel_1_stride_2": (dict(kernel_size=1, stride=2), lambda g: lidar_scene(3), 6, 5),
}
