"""Bad inputs must raise clear Python exceptions (type and message), never crash the process."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import torchsparse_pp
from torchsparse_pp import SparseTensor
from torchsparse_pp.nn import BatchNorm, Conv3d, GroupNorm, InstanceNorm, MaxPool3d
from torchsparse_pp.nn import functional as F
from torchsparse_pp.nn.functional import ConvConfig
from torchsparse_pp.utils import sparse_collate, sparse_quantize

OPS = torch.ops.torchsparse_pp
RANGE_TEXT = r"batch in \[0, 32767\], x/y/z in \[-32768, 32767\]"


# --- helpers -----------------------------------------------------------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _coords(gen: torch.Generator, n: int = 40, extent: int = 8, batch: int = 1) -> torch.Tensor:
    """Unique random int32 (batch, x, y, z) rows in random order."""
    raw = torch.cat([torch.randint(0, batch, (4 * n, 1), generator=gen),
                     torch.randint(0, extent, (4 * n, 3), generator=gen)], dim=1)
    unique = torch.unique(raw, dim=0)
    perm = torch.randperm(unique.shape[0], generator=gen)[:n]
    return unique[perm].int()


def _tensor(seed: int, channels: int = 4, n: int = 40, extent: int = 8, batch: int = 1,
            stride=1, dtype=torch.float32) -> SparseTensor:
    gen = _gen(seed)
    coords = _coords(gen, n, extent, batch)
    feats = torch.randn(coords.shape[0], channels, generator=gen, dtype=dtype)
    return SparseTensor(feats, coords, stride=stride)


# --- coordinates -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_coords_rejected(dtype):
    gen = _gen(1)
    coords = _coords(gen).to(dtype)
    feats = torch.randn(coords.shape[0], 3, generator=gen)
    with pytest.raises(TypeError, match=r"int32.*got torch\.float.*sparse_quantize"):
        SparseTensor(feats, coords)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int16])
def test_other_int_coords_rejected(dtype):
    gen = _gen(2)
    coords = _coords(gen).to(dtype)
    feats = torch.randn(coords.shape[0], 3, generator=gen)
    with pytest.raises(TypeError, match=r"coords must be int32.*" + str(dtype).replace(".", r"\.")):
        SparseTensor(feats, coords)


def test_non_tensor_coords_rejected():
    gen = _gen(3)
    coords = _coords(gen)
    feats = torch.randn(coords.shape[0], 3, generator=gen)
    with pytest.raises(TypeError, match=r"coords must be a torch\.Tensor, got list"):
        SparseTensor(feats, coords.tolist())


@pytest.mark.parametrize("shape_of", ["n3", "n5", "1d", "3d"])
def test_coords_shape_rejected(shape_of):
    gen = _gen(4)
    coords = _coords(gen)
    n = coords.shape[0]
    bad = {
        "n3": coords[:, 1:],
        "n5": torch.cat([coords, torch.randint(0, 5, (n, 1), generator=gen, dtype=torch.int32)], 1),
        "1d": coords[:, 1].contiguous(),
        "3d": coords[:, None, :],
    }[shape_of]
    feats = torch.randn(n, 3, generator=gen)
    with pytest.raises(ValueError, match=r"coords must have shape \[N, 4\] \(batch, x, y, z\), got \["):
        SparseTensor(feats, bad)


# --- features ----------------------------------------------------------------------------------
def test_feats_coords_length_mismatch():
    gen = _gen(5)
    coords = _coords(gen, n=30)
    feats = torch.randn(coords.shape[0] - 3, 4, generator=gen)
    with pytest.raises(ValueError, match=rf"feats have {feats.shape[0]} rows but coords have {coords.shape[0]}"):
        SparseTensor(feats, coords)


def test_feats_1d_rejected():
    gen = _gen(6)
    coords = _coords(gen)
    feats = torch.randn(coords.shape[0], generator=gen)
    with pytest.raises(ValueError, match=r"feats must have shape \[N, C\].*feats\[:, None\]"):
        SparseTensor(feats, coords)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_feats_int_dtype_rejected(dtype):
    gen = _gen(7)
    coords = _coords(gen)
    feats = torch.randint(1, 9, (coords.shape[0], 3), generator=gen).to(dtype)
    with pytest.raises(TypeError, match=r"feats must be a floating-point tensor"):
        SparseTensor(feats, coords)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_feats_rejected(bad_value, dtype):
    gen = _gen(8)
    coords = _coords(gen)
    feats = torch.randn(coords.shape[0], 5, generator=gen).to(dtype)
    row = int(torch.randint(0, coords.shape[0], (1,), generator=gen))
    col = int(torch.randint(0, 5, (1,), generator=gen))
    feats[row, col] = bad_value
    with pytest.raises(ValueError, match=r"feats contain NaN or Inf"):
        SparseTensor(feats, coords)


def test_empty_tensor_rejected():
    with pytest.raises(ValueError, match=r"coords are empty.*at least one point"):
        SparseTensor(torch.empty(0, 4), torch.empty(0, 4, dtype=torch.int32))


def test_zero_channels_rejected():
    coords = _coords(_gen(9))
    with pytest.raises(ValueError, match=r"zero channels"):
        SparseTensor(torch.empty(coords.shape[0], 0), coords)


@pytest.mark.parametrize("cin, cout", [(0, 4), (4, 0)])
def test_conv_zero_channels_rejected(cin, cout):
    with pytest.raises(ValueError, match=r"channel counts must be positive"):
        Conv3d(cin, cout)


# --- channel mismatches ------------------------------------------------------------------------
def test_conv_channel_mismatch():
    x = _tensor(10, channels=4)
    with pytest.raises(ValueError, match=r"channel mismatch: the input has 4 channels but the weight expects 8"):
        Conv3d(8, 16)(x)


@pytest.mark.parametrize("make", [lambda: BatchNorm(8), lambda: GroupNorm(2, 8), lambda: InstanceNorm(8)])
def test_norm_channel_mismatch(make):
    norm = make()
    x = _tensor(11, channels=4)
    with pytest.raises(ValueError, match=rf"channel mismatch: {type(norm).__name__} has 8 channels, the input has 4"):
        norm(x)


def test_functional_conv_wrong_kernel_volume():
    x = _tensor(12, channels=4)
    weight = torch.randn(8, 4, 6, generator=_gen(12))  # 2x2x2 weight used as a 3x3x3 kernel
    with pytest.raises(ValueError, match=r"weight has 8 kernel offsets but kernel_size \(3, 3, 3\) has 27"):
        F.conv3d(x, weight, 3)


def test_functional_conv_weight_not_3d():
    x = _tensor(13, channels=4)
    with pytest.raises(ValueError, match=r"weight must be a \[K, C_in, C_out\] tensor"):
        F.conv3d(x, torch.randn(27 * 4, 6, generator=_gen(13)), 3)


def test_functional_conv_bad_bias():
    x = _tensor(14, channels=4)
    gen = _gen(14)
    with pytest.raises(ValueError, match=r"bias must have shape \[6\]"):
        F.conv3d(x, torch.randn(27, 4, 6, generator=gen), 3, bias=torch.randn(5, generator=gen))


# --- coordinate range --------------------------------------------------------------------------
BAD_ROWS = {
    "batch<0": (-1, 0, 0, 0),
    "batch>32767": (32768, 0, 0, 0),
    "x>32767": (0, 32768, 0, 0),
    "x<-32768": (0, -32769, 0, 0),
    "y>32767": (0, 0, 40000, 0),
    "z<-32768": (0, 0, 0, -2 ** 31),
}


def _with_bad_row(seed: int, row):
    gen = _gen(seed)
    coords = _coords(gen, n=50)
    at = int(torch.randint(0, coords.shape[0], (1,), generator=gen))
    coords[at] = torch.tensor(row, dtype=torch.int32)
    return coords, at, torch.randn(coords.shape[0], 3, generator=gen)


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_out_of_range_coords_at_construction(name):
    coords, _, feats = _with_bad_row(15, BAD_ROWS[name])
    with pytest.raises(ValueError, match=r"the supported range is " + RANGE_TEXT):
        SparseTensor(feats, coords)


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_out_of_range_coords_in_hash_build(name):
    coords, at, _ = _with_bad_row(16, BAD_ROWS[name])
    with pytest.raises(RuntimeError, match=rf"coords row {at} = .* outside the supported coordinate range: "
                       + RANGE_TEXT):
        OPS.hash_build(coords)


def test_range_limits_themselves_are_accepted():
    """The extreme values of the range must work, so the checks above are not just over-strict."""
    gen = _gen(17)
    coords = torch.tensor([[32767, 32767, -32768, 5], [0, -32768, 32767, -32768], [3, 0, 0, 0]],
                          dtype=torch.int32)
    x = SparseTensor(torch.randn(3, 2, generator=gen), coords)
    table = OPS.hash_build(coords)
    found = OPS.hash_query(table, coords.flip(0).contiguous())
    assert found.tolist() == [2, 1, 0]
    assert x.batch_size == 32768


def test_generative_output_leaving_range_raw_op():
    gen = _gen(18)
    coords = _coords(gen, n=20)
    coords[int(torch.randint(0, 20, (1,), generator=gen)), 1] = 32767
    with pytest.raises(RuntimeError, match=r"input row \d+ produces an output coordinate outside the supported "
                       r"range: " + RANGE_TEXT):
        OPS.kmap_generative(coords, [3, 3, 3], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128)


def test_generative_output_leaving_range_negative_side_raw_op():
    coords = torch.tensor([[0, -32768, 4, 4], [0, 3, 2, 1]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"input row 0 produces an output coordinate outside"):
        OPS.kmap_generative(coords, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], None, 128)


def test_generative_output_leaving_range_module():
    gen = _gen(19)
    coords = _coords(gen, n=20)
    coords[0, 3] = 32767  # at stride 2 the finer coordinates reach 65534 + kernel extent
    x = SparseTensor(torch.randn(coords.shape[0], 3, generator=gen), coords, stride=2)
    conv = Conv3d(3, 2, 3, stride=2, transposed=True, generative=True)
    with pytest.raises(RuntimeError, match=r"produces an output coordinate outside the supported range"):
        conv(x)


def test_duplicate_coords_fail_at_first_conv():
    gen = _gen(20)
    coords = _coords(gen, n=40)
    src, dst = 5, 31
    coords[dst] = coords[src]
    x = SparseTensor(torch.randn(coords.shape[0], 4, generator=gen), coords)
    c = coords[src].tolist()
    with pytest.raises(RuntimeError, match=rf"duplicate coordinate \({c[0]}, {c[1]}, {c[2]}, {c[3]}\) at rows "
                       rf"{src} and {dst}.*must be unique"):
        Conv3d(4, 4, 3)(x)


def test_duplicate_coords_fail_in_strided_conv():
    gen = _gen(21)
    coords = _coords(gen, n=40)
    coords[-1] = coords[0]
    x = SparseTensor(torch.randn(coords.shape[0], 4, generator=gen), coords)
    with pytest.raises(RuntimeError, match=r"duplicate coordinate"):
        Conv3d(4, 4, 2, stride=2)(x)


# --- devices -----------------------------------------------------------------------------------
def test_feats_on_meta_coords_on_cpu():
    gen = _gen(22)
    coords = _coords(gen)
    feats = torch.randn(coords.shape[0], 3, generator=gen).to("meta")
    with pytest.raises(ValueError, match=r"feats are on meta but coords are on cpu.*one device"):
        SparseTensor(feats, coords)


def test_replace_feats_on_other_device():
    x = _tensor(23)
    with pytest.raises(ValueError, match=r"feats are on meta but coords are on cpu"):
        x.replace_feats(torch.empty(x.num_points, 2, device="meta"))


def test_conv_weight_on_meta():
    x = _tensor(24, channels=4)
    conv = Conv3d(4, 5).to("meta")
    with pytest.raises(ValueError, match=r"weight is on meta but the input is on cpu"):
        conv(x)


# --- transposed / generative -------------------------------------------------------------------
def test_transposed_without_matching_strided_conv():
    x = _tensor(25, channels=4, stride=2)  # made at stride 2 by the user, not by a conv
    with pytest.raises(ValueError, match=r"no matching strided conv"):
        Conv3d(4, 4, 2, stride=2, transposed=True)(x)


def test_transposed_with_other_geometry_than_strided_conv():
    x = _tensor(26, channels=4)
    down = Conv3d(4, 4, 3, stride=2)(x)  # k3 s2 made these coords; a k2 s2 transposed has no source
    with pytest.raises(ValueError, match=r"kernel_size=\(2, 2, 2\).*no matching strided conv"):
        Conv3d(4, 4, 2, stride=2, transposed=True)(down)


def test_transposed_stride_would_be_fractional():
    x = _tensor(27, channels=4)
    with pytest.raises(ValueError, match=r"would make the tensor stride fractional"):
        Conv3d(4, 4, 2, stride=2, transposed=True)(x)


def test_generative_without_transposed():
    with pytest.raises(ValueError, match=r"generative=True needs transposed=True"):
        Conv3d(4, 4, 2, stride=2, generative=True)
    x = _tensor(28, channels=4)
    with pytest.raises(ValueError, match=r"generative=True needs transposed=True"):
        F.conv3d(x, torch.randn(8, 4, 4, generator=_gen(28)), 2, stride=2, generative=True)


def test_unknown_downsample_mode():
    with pytest.raises(ValueError, match=r"downsample_mode must be one of \('spconv', 'minkowski'\)"):
        Conv3d(4, 4, 2, stride=2, downsample_mode="torchsparse")


# --- config ------------------------------------------------------------------------------------
def test_unknown_dataflow():
    with pytest.raises(ValueError, match=r"unknown dataflow 'fast_conv'; expected one of"):
        ConvConfig("fast_conv")


@pytest.mark.parametrize("dataflow", ["gather_scatter", "implicit_gemm", "fetch_on_demand"])
def test_dataflow_without_kernels_on_the_device(dataflow, monkeypatch):
    """A build without native CUDA kernels: asking for a native dataflow there raises, never
    falls back (to Triton or anything else)."""
    from torchsparse_pp.nn.functional import config as config_module
    monkeypatch.delitem(config_module.IMPLEMENTED, "cuda", raising=False)
    with pytest.raises(NotImplementedError, match=rf"dataflow '{dataflow}' \(forward pass\) is not implemented on cuda "
                                                  r"with the native backend"):
        config_module.resolve_configs(ConvConfig(dataflow, backend="native"), "cuda")


@pytest.mark.parametrize("bad", ["gather_scatter", {"dataflow": "gather_scatter"}, 3, (ConvConfig(),)])
def test_config_of_wrong_type(bad):
    with pytest.raises(TypeError, match=r"a conv config must be a ConvConfig, a PassConfigs or a \(forward, dgrad, wgrad\)"):
        Conv3d(4, 4, config=bad)
    conv = Conv3d(4, 4)
    with pytest.raises(TypeError, match=r"a conv config must be a ConvConfig"):
        conv.config = bad


# --- spatial range -----------------------------------------------------------------------------
@pytest.mark.parametrize("axis, value", [(1, -1), (2, 10), (3, 7)])
def test_coords_outside_spatial_range(axis, value):
    gen = _gen(31)
    coords = _coords(gen, n=30, extent=6)
    coords[int(torch.randint(0, coords.shape[0], (1,), generator=gen)), axis] = value
    feats = torch.randn(coords.shape[0], 2, generator=gen)
    with pytest.raises(ValueError, match=r"outside spatial_range \(8, 10, 7\).*\[0, size\)"):
        SparseTensor(feats, coords, spatial_range=(8, 10, 7))


@pytest.mark.parametrize("bad", [(8, 0, 8), (8, 8), -4])
def test_bad_spatial_range_value(bad):
    coords = _coords(_gen(32))
    feats = torch.randn(coords.shape[0], 2, generator=_gen(33))
    with pytest.raises(ValueError, match=r"spatial_range must be"):
        SparseTensor(feats, coords, spatial_range=bad)


# --- geometry ----------------------------------------------------------------------------------
GEOMETRY_CASES = [
    (dict(kernel_size=0), ValueError, r"kernel_size must be >= 1 on every axis, got 0"),
    (dict(kernel_size=(3, 0, 3)), ValueError, r"kernel_size must be >= 1 on every axis"),
    (dict(padding=-1), ValueError, r"padding must be >= 0 on every axis, got -1"),
    (dict(stride=0), ValueError, r"stride must be >= 1 on every axis, got 0"),
    (dict(dilation=(1, 0, 1)), ValueError, r"dilation must be >= 1 on every axis"),
    (dict(kernel_size=(3, 3, 3, 3)), ValueError, r"kernel_size must be an int or 3 ints \(x, y, z\)"),
    (dict(kernel_size=(3, 3)), ValueError, r"kernel_size must be an int or 3 ints"),
    (dict(stride=True), TypeError, r"stride must be an int or 3 ints"),
    (dict(kernel_size=2.5), TypeError, r"kernel_size must be an int or 3 ints"),
]


@pytest.mark.parametrize("kwargs, exc, pattern", GEOMETRY_CASES)
def test_bad_geometry_module(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        Conv3d(4, 4, **kwargs)


@pytest.mark.parametrize("kwargs, exc, pattern", GEOMETRY_CASES)
def test_bad_geometry_functional(kwargs, exc, pattern):
    x = _tensor(34, channels=4)
    kwargs = dict(kwargs)
    kernel_size = kwargs.pop("kernel_size", 3)
    weight = torch.randn(27, 4, 2, generator=_gen(34))
    with pytest.raises(exc, match=pattern):
        F.conv3d(x, weight, kernel_size, **kwargs)


def test_bad_geometry_pool():
    with pytest.raises(ValueError, match=r"kernel_size must be >= 1"):
        MaxPool3d(0)
    with pytest.raises(ValueError, match=r"padding must be >= 0"):
        MaxPool3d(2, padding=-2)


# --- dtypes ------------------------------------------------------------------------------------
def test_weight_dtype_mismatch():
    x = _tensor(35, channels=4)
    weight = torch.randn(27, 4, 3, dtype=torch.float64, generator=_gen(35))
    with pytest.raises(TypeError, match=r"weight dtype torch\.float64 does not match input dtype torch\.float32"):
        F.conv3d(x, weight, 3)


def test_float16_conv_on_cpu_with_float32_weight():
    """float16 features on the CPU are taken (computed in float32, tests/test_cpu_float16.py), but
    a weight of another dtype is still refused."""
    x = _tensor(36, channels=4).half()
    with pytest.raises(TypeError, match=r"weight dtype torch\.float32 does not match input dtype torch\.float16"):
        Conv3d(4, 3)(x)


# --- arithmetic and cat ------------------------------------------------------------------------
def test_add_and_cat_with_different_coords():
    gen = _gen(37)
    coords = _coords(gen, n=30)
    a = SparseTensor(torch.randn(30, 3, generator=gen), coords)
    other = coords.clone()
    other[7, 2] += 100  # same length, one row differs
    b = SparseTensor(torch.randn(30, 3, generator=gen), other)
    with pytest.raises(ValueError, match=r"'\+' needs both tensors on the same coordinates in the same order"):
        a + b
    with pytest.raises(ValueError, match=r"'cat' needs both tensors on the same coordinates"):
        torchsparse_pp.cat([a, b])


def test_add_and_cat_with_different_lengths_or_order():
    gen = _gen(38)
    coords = _coords(gen, n=30)
    a = SparseTensor(torch.randn(30, 3, generator=gen), coords)
    shorter = SparseTensor(torch.randn(29, 3, generator=gen), coords[:29].clone())
    shuffled = SparseTensor(torch.randn(30, 3, generator=gen), coords.flip(0).contiguous())
    for b in (shorter, shuffled):
        with pytest.raises(ValueError, match=r"same coordinates in the same order"):
            a + b
        with pytest.raises(ValueError, match=r"same coordinates in the same order"):
            torchsparse_pp.cat([a, b])


def test_add_and_cat_with_different_strides():
    gen = _gen(39)
    coords = _coords(gen, n=30)
    a = SparseTensor(torch.randn(30, 3, generator=gen), coords, stride=2)
    b = SparseTensor(torch.randn(30, 3, generator=gen), coords, stride=(2, 2, 4))
    with pytest.raises(ValueError, match=r"'\+' needs equal strides, got \(2, 2, 2\) and \(2, 2, 4\)"):
        a + b
    with pytest.raises(ValueError, match=r"'cat' needs equal strides"):
        torchsparse_pp.cat([a, b])


def test_add_with_non_sparse_tensor():
    x = _tensor(40)
    with pytest.raises(TypeError, match=r"unsupported operand type\(s\) for \+: 'SparseTensor' and 'Tensor'"):
        x + x.F
    with pytest.raises(TypeError, match=r"unsupported operand type\(s\) for \+: 'SparseTensor' and 'float'"):
        x + 1.5


@pytest.mark.parametrize("bad", [[], "not tensors", None])
def test_cat_with_bad_sequence(bad):
    x = _tensor(41)
    inputs = [] if bad == [] else [x, x.F] if bad is None else [x, bad]
    with pytest.raises(TypeError, match=r"cat expects a non-empty sequence of SparseTensors"):
        torchsparse_pp.cat(inputs)


# --- sparse_quantize ---------------------------------------------------------------------------
def _points(seed: int, n: int = 200) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-5.0, 5.0, (n, 3))


@pytest.mark.parametrize("bad_value", [np.nan, np.inf])
def test_quantize_non_finite(bad_value):
    rng = np.random.default_rng(42)
    points = _points(42)
    points[rng.integers(len(points)), rng.integers(3)] = bad_value
    with pytest.raises(ValueError, match=r"coords contain NaN or Inf"):
        sparse_quantize(points, 0.1)
    with pytest.raises(ValueError, match=r"coords contain NaN or Inf"):
        sparse_quantize(torch.from_numpy(points), 0.1)


@pytest.mark.parametrize("size", [0, 0.0, -0.1, (0.1, 0.0, 0.1), (0.1, -1.0, 0.1), float("nan"), float("inf")])
def test_quantize_non_positive_voxel_size(size):
    with pytest.raises(ValueError, match=r"voxel_size must be positive and finite"):
        sparse_quantize(_points(43), size)


@pytest.mark.parametrize("size", [(0.1, 0.1), (0.1, 0.1, 0.1, 0.1), [[0.1, 0.2]]])
def test_quantize_wrong_voxel_size_length(size):
    with pytest.raises(ValueError, match=r"voxel_size must be a scalar or have 3 entries"):
        sparse_quantize(_points(44), size)


@pytest.mark.parametrize("scale", [3300.0, -3300.0])
def test_quantize_overflowing_range(scale):
    points = _points(45)
    points[17] = [0.5, scale * 1.0, 0.25]  # 3300 m / 0.1 m = 33000 voxels > 32767
    with pytest.raises(ValueError, match=r"outside the supported range \[-32768, 32767\].*larger voxel_size"):
        sparse_quantize(points, 0.1)


@pytest.mark.parametrize("bad, exc, pattern", [
    (np.zeros((0, 3)), ValueError, r"non-empty \[N, D\]"),
    (np.arange(1.0, 7.0), ValueError, r"non-empty \[N, D\]"),
    ([[1.0, 2.0, 3.0]], TypeError, r"numpy array or torch tensor, got list"),
    (np.ones((4, 3), dtype=np.complex64) * (1 + 2j), TypeError, r"real numbers"),
])
def test_quantize_bad_array(bad, exc, pattern):
    with pytest.raises(exc, match=pattern):
        sparse_quantize(bad, 0.1)


# --- sparse_collate ----------------------------------------------------------------------------
def test_collate_different_channels():
    a = _tensor(46, channels=4)
    b = _tensor(47, channels=5)
    with pytest.raises(ValueError, match=r"sample 1 has 5 channels .* but sample 0 has 4"):
        sparse_collate([a, b])


def test_collate_different_strides():
    a = _tensor(48, channels=4)
    b = _tensor(49, channels=4, stride=2)
    with pytest.raises(ValueError, match=r"sample 1 has stride \(2, 2, 2\)"):
        sparse_collate([a, b])


@pytest.mark.parametrize("bad", [[], [torch.ones(3, 4) * 2]])
def test_collate_not_sparse_tensors(bad):
    with pytest.raises(TypeError, match=r"sparse_collate expects a non-empty sequence of SparseTensors"):
        sparse_collate(bad)


# --- raw operators in a subprocess: errors must be exceptions, never aborts -------------------
_RAW_OPS_SCRIPT = textwrap.dedent(r"""
    import re
    import sys
    import torch
    import torchsparse_pp  # noqa: F401  (registers the ops)

    ops = torch.ops.torchsparse_pp
    g = torch.Generator().manual_seed(1234)
    results = []

    def expect(name, pattern, fn):
        try:
            fn()
        except RuntimeError as err:
            ok = re.search(pattern, str(err)) is not None
            results.append((name, ok, str(err).splitlines()[0]))
        else:
            results.append((name, False, "no exception"))

    coords = torch.unique(torch.randint(0, 6, (60, 4), generator=g, dtype=torch.int32), dim=0)
    coords[:, 0] = 0
    coords = torch.unique(coords, dim=0)
    n = coords.shape[0]

    bad = coords.clone(); bad[n // 2, 1] = 40000
    expect("hash_build x too large", r"outside the supported coordinate range", lambda: ops.hash_build(bad))
    bad = coords.clone(); bad[1, 0] = -3
    expect("hash_build negative batch", r"outside the supported coordinate range", lambda: ops.hash_build(bad))
    expect("hash_build float", r"must be int32", lambda: ops.hash_build(coords.float()))
    dup = coords.clone(); dup[-1] = dup[0]
    expect("hash_build duplicate", r"duplicate coordinate", lambda: ops.hash_build(dup))

    table = ops.hash_build(coords)
    geo = ([3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1])
    out_in = ops.kmap_out_in(table, coords, *geo, 128)
    expect("kmap_pairs int64 out_in", r"out_in must be an int32 \[rows, K\] map",
           lambda: ops.kmap_pairs(out_in.long(), n, n))
    expect("kmap_pairs 1-D out_in", r"out_in must be an int32 \[rows, K\] map",
           lambda: ops.kmap_pairs(out_in[:, 0].contiguous(), n, n))
    expect("kmap_pairs num_out > rows", r"exceeds the rows of out_in",
           lambda: ops.kmap_pairs(out_in, n, out_in.shape[0] + 1))
    expect("kmap_pairs num_out < 0", r"num_out must be >= 0", lambda: ops.kmap_pairs(out_in, n, -1))
    expect("kmap_out_in bad table", r"must be the \[capacity, 2\] int64 tensor that hash_build returns",
           lambda: ops.kmap_out_in(table[:-1], coords, *geo, 128))
    expect("kmap_out_in submanifold foreign coords", r"submanifold=True needs out_coords",
           lambda: ops.kmap_out_in(ops.hash_build(torch.cat([coords, coords + 50])), coords + 50, *geo, 128, True))
    expect("kmap_out_in submanifold reordered coords", r"submanifold=True needs out_coords",
           lambda: ops.kmap_out_in(table, coords.flip(0).contiguous(), *geo, 128, True))
    expect("kmap_out_in submanifold even kernel", r"submanifold=True needs stride 1 and odd kernels",
           lambda: ops.kmap_out_in(table, coords, [2, 2, 2], [1, 1, 1], [1, 1, 1], [0, 0, 0], 128, True))
    expect("kmap_downsample mode", r"unknown downsample mode 'dense'",
           lambda: ops.kmap_downsample(coords, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], "dense", None, 128))
    expect("kmap_downsample kernel 0", r"kernel_size must be in \[1, ",
           lambda: ops.kmap_downsample(coords, [2, 0, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], "spconv", None, 128))
    expect("kmap_generative bad range", r"out_range must be positive",
           lambda: ops.kmap_generative(coords, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], [4, 0, 4], 128))

    in_idx, out_idx, offsets, identity = ops.kmap_pairs(out_in, n, n)
    feats = torch.randn(n, 4, generator=g)
    weight = torch.randn(27, 4, 5, generator=g)
    fwd = lambda f, w, s, d, o, i, m: ops.gather_scatter_forward(f, w, s, d, o, i, m, False)
    expect("gs src/dst length", r"two int32 vectors of equal length",
           lambda: fwd(feats, weight, in_idx, out_idx[:-1], offsets, identity, n))
    expect("gs channels", r"feats have 3 channels but the weight expects 4",
           lambda: fwd(feats[:, :3], weight, in_idx, out_idx, offsets, identity, n))
    expect("gs offsets length", r"offsets must be an int64 vector of length K \+ 1 = 28",
           lambda: fwd(feats, weight, in_idx, out_idx, offsets[:-1], identity, n))
    expect("gs identity length", r"identity must be a bool vector of length K = 27",
           lambda: fwd(feats, weight, in_idx, out_idx, offsets, identity[:-1], n))
    expect("gs weight 2-D", r"weight must be \[K, C_in, C_out\]",
           lambda: fwd(feats, weight[0], in_idx, out_idx, offsets, identity, n))
    expect("gs weight dtype", r"weight dtype Double does not match feats dtype Float",
           lambda: fwd(feats, weight.double(), in_idx, out_idx, offsets, identity, n))
    counts = offsets.diff()
    k = next(k for k in range(27) if not bool(identity[k]) and int(counts[k]) > 0)
    pos = int(offsets[k])  # first pair of an offset that is gathered (not an identity offset)
    big = in_idx.clone(); big[pos] = n + 7
    expect("gs source index too large", r"source index is out of range \[0, %d\)" % n,
           lambda: fwd(feats, weight, big, out_idx, offsets, identity, n))
    neg = in_idx.clone(); neg[pos] = -2
    expect("gs source index negative", r"source index is out of range",
           lambda: fwd(feats, weight, neg, out_idx, offsets, identity, n))
    no_identity = torch.zeros_like(identity)
    expect("gs destination index too large", r"destination index is out of range \[0, %d\)" % (n - 1),
           lambda: fwd(feats, weight, in_idx, out_idx, offsets, no_identity, n - 1))
    grad = torch.randn(n, 5, generator=g)
    expect("wgrad source index", r"source index is out of range",
           lambda: ops.gather_scatter_wgrad(feats, grad, big, out_idx, offsets, identity))
    expect("wgrad dtype", r"does not match grad_out dtype",
           lambda: ops.gather_scatter_wgrad(feats, grad.double(), in_idx, out_idx, offsets, identity))

    for name, ok, message in results:
        print(("PASS " if ok else "FAIL ") + name + ": " + message)
    # a valid call still works after all those errors
    out = fwd(feats, weight, in_idx, out_idx, offsets, identity, n)
    assert out.shape == (n, 5) and bool(torch.isfinite(out).all())
    sys.exit(0 if all(ok for _, ok, _ in results) else 3)
""")


def _run_script(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_raw_op_errors_do_not_crash_the_process():
    proc = _run_script(_RAW_OPS_SCRIPT)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.stdout.count("PASS ") == 26 and "FAIL" not in proc.stdout, proc.stdout


_INCONSISTENT_OFFSETS_SCRIPT = textwrap.dedent(r"""
    import sys
    import torch
    import torchsparse_pp  # noqa: F401

    ops = torch.ops.torchsparse_pp
    g = torch.Generator().manual_seed(7)
    feats = torch.randn(3, 4, generator=g)
    weight = torch.randn(2, 4, 5, generator=g)
    src = torch.tensor([0, 1, 2, 1, 0], dtype=torch.int32)
    dst = torch.tensor([0, 1, 2, 0, 2], dtype=torch.int32)
    identity = torch.zeros(2, dtype=torch.bool)
    # offsets[K] equals the number of pairs, but offsets[1] points far past the pair lists
    offsets = torch.tensor([0, 1 << 20, 5])
    messages = []
    for name, fn in [
        ("forward", lambda: ops.gather_scatter_forward(feats, weight, src, dst, offsets, identity, 3, False)),
        ("wgrad", lambda: ops.gather_scatter_wgrad(feats, torch.randn(3, 5, generator=g), src, dst, offsets,
                                                   identity)),
    ]:
        try:
            fn()
            messages.append(name + ": no exception")
        except RuntimeError as err:
            messages.append(name + ": " + str(err).splitlines()[0])
    print("\n".join(messages))
""")


def test_inconsistent_pair_offsets_raise_instead_of_crashing():
    proc = _run_script(_INCONSISTENT_OFFSETS_SCRIPT)
    assert proc.returncode == 0, f"process died with exit code {proc.returncode}"
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "offsets" in line.split(": ", 1)[1], line
