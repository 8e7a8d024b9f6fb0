"""nn.functional.conv.conv3d_over_map: the conv over a kernel map built beforehand, forward and
transposed, equals the dense oracle on the map's output (or input) set, for stride-1 regular maps
(every reached site, which conv3d's stride 1 does not make) and strided ones; and it refuses a
tensor that is not on the map's coordinates."""
import pytest
import torch

from conftest import shuffled_coords
from oracle import reference_conv
from precision import rel_err
from torchsparse_pp import SparseTensor
from torchsparse_pp.kmap import ConvGeometry, strided_map
from torchsparse_pp.nn.functional.conv import conv3d_over_map

TOL = 1e-12  # float64, the oracle sums in another order


def _tensor(coords, feats) -> SparseTensor:
    return SparseTensor(feats, coords)


@pytest.mark.parametrize("transposed", [False, True], ids=["forward", "transposed"])
@pytest.mark.parametrize("kernel,stride,padding,dilation", [(3, 1, 1, 1), (2, 1, 2, 1), (3, 1, 0, 2), (3, 2, 1, 1)])
def test_conv_over_map_matches_the_dense_oracle(kernel, stride, padding, dilation, transposed, gen):
    coords = shuffled_coords(gen, per_batch=(60, 45))
    x = _tensor(coords, torch.randn(len(coords), 3, generator=gen, dtype=torch.float64))
    geometry = ConvGeometry.make(kernel, stride, dilation, padding)
    kmap = strided_map(x.cache, x.C, geometry, "spconv", None)
    weight = torch.randn(geometry.volume, 3, 4, generator=gen, dtype=torch.float64)
    bias = torch.randn(4, generator=gen, dtype=torch.float64)
    if transposed:
        coarse = SparseTensor._derive(torch.randn(kmap.num_out, 3, generator=gen, dtype=torch.float64),
                                      kmap.out_coords, geometry.stride, kmap.out_range, x.cache)
        out = conv3d_over_map(coarse, weight, kmap, bias, transposed=True)
        assert out.C is kmap.in_coords and out.s == (1, 1, 1)
        ref = reference_conv(kmap.out_coords, coarse.F, weight, kmap.in_coords, kernel, stride, dilation, padding,
                             transposed=True)
    else:
        out = conv3d_over_map(x, weight, kmap, bias)
        assert out.C is kmap.out_coords and out.s == geometry.stride
        ref = reference_conv(x.C, x.F, weight, kmap.out_coords, kernel, stride, dilation, padding)
    assert rel_err(out.F, ref + bias) < TOL  # norm-wise


def test_conv_over_map_rejects_other_coordinates(gen):
    coords = shuffled_coords(gen, per_batch=(30,))
    x = _tensor(coords, torch.randn(len(coords), 2, generator=gen, dtype=torch.float64))
    kmap = strided_map(x.cache, x.C, ConvGeometry.make(3, 1, 1, 1), "spconv", None)
    other = _tensor(coords.clone(), x.F)
    with pytest.raises(ValueError, match="map's input coordinates"):
        conv3d_over_map(other, torch.randn(27, 2, 2, dtype=torch.float64), kmap)
