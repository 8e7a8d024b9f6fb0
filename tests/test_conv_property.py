"""Property-based search (hypothesis) over per-axis geometries, against the dense oracle."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchsparse_pp as tsp
from torchsparse_pp.nn.functional import conv3d
from oracle import reference_conv, reference_output_coords

axis = st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 2), st.integers(0, 3))  # k, s, d, pad


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(axes=st.tuples(axis, axis, axis), variant=st.sampled_from(["forward", "minkowski", "generative"]),
       seed=st.integers(0, 2 ** 31 - 1), channels=st.tuples(st.integers(1, 5), st.integers(1, 5)))
def test_random_geometry_matches_dense(axes, variant, seed, channels):
    kernel, stride, dilation, padding = (tuple(a[i] for a in axes) for i in range(4))
    g = torch.Generator().manual_seed(seed)
    coords = torch.unique(torch.cat([torch.randint(0, 2, (40, 1), generator=g),
                                     torch.randint(-3, 6, (40, 3), generator=g)], 1), dim=0).int()
    x = tsp.SparseTensor(torch.randn(coords.shape[0], channels[0], generator=g, dtype=torch.float64), coords,
                         stride=6)
    weight = torch.randn(kernel[0] * kernel[1] * kernel[2], channels[0], channels[1], generator=g,
                         dtype=torch.float64)
    generative = variant == "generative"
    mode = "minkowski" if variant == "minkowski" else "spconv"
    y = conv3d(x, weight, kernel, None, stride, dilation, padding, transposed=generative, generative=generative,
               downsample_mode=mode)
    if stride != (1, 1, 1) or generative:
        expected = reference_output_coords(coords, kernel, stride, dilation, padding,
                                           "generative" if generative else mode)
        assert torch.equal(y.C, expected)
    ref = reference_conv(x.C, x.F, weight, y.C, kernel, stride, dilation, padding, transposed=generative)
    assert torch.allclose(y.F, ref, rtol=1e-10, atol=1e-10)
