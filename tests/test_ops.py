"""The registered operators: schemas, fake kernels and autograd registration via torch.library.opcheck."""
import pytest
import torch

from torchsparse_pp import ops
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, submanifold_map
from conftest import random_coords


@pytest.fixture
def kmap(generator):
    coords = random_coords(generator, 200, batch=2)
    return submanifold_map(KernelMapCache(), coords, ConvGeometry.make(3), None)


def test_opcheck_gather_scatter(kmap, generator):
    p = kmap.pairs
    feats = torch.randn(kmap.num_in, 5, generator=generator)
    weight = torch.randn(27, 5, 7, generator=generator)
    torch.library.opcheck(torch.ops.torchsparse_pp.gather_scatter_forward.default,
                          (feats, weight, p.in_idx, p.out_idx, p.offsets, p.identity, kmap.num_out, False))
    grad = torch.randn(kmap.num_out, 7, generator=generator)
    torch.library.opcheck(torch.ops.torchsparse_pp.gather_scatter_forward.default,
                          (grad, weight, p.out_idx, p.in_idx, p.offsets, p.identity, kmap.num_in, True))
    torch.library.opcheck(torch.ops.torchsparse_pp.gather_scatter_wgrad.default,
                          (feats, grad, p.in_idx, p.out_idx, p.offsets, p.identity))


def test_opcheck_kmap_out_in(kmap):
    table = ops.hash_build(kmap.in_coords)
    for submanifold in (False, True):
        torch.library.opcheck(torch.ops.torchsparse_pp.kmap_out_in.default,
                              (table, kmap.out_coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], 128, submanifold))
    torch.library.opcheck(torch.ops.torchsparse_pp.hash_query.default, (table, kmap.out_coords))


@pytest.mark.parametrize("op,args", [
    ("hash_build", lambda m: (m.in_coords,)),
    ("kmap_downsample", lambda m: (m.in_coords, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], "spconv", None, 128)),
    ("kmap_generative", lambda m: (m.in_coords, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128)),
    ("kmap_pairs", lambda m: (m.out_in, m.num_in, m.num_out)),
])
def test_fake_kernels_of_data_dependent_ops(op, args, kmap):
    """Ops whose output size depends on data: the fake kernel must agree on dtypes and rank."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    real_args = args(kmap)
    real = getattr(torch.ops.torchsparse_pp, op)(*real_args)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in real_args)
        fake = getattr(torch.ops.torchsparse_pp, op)(*fake_args)
    real = real if isinstance(real, tuple) else (real,)
    fake = fake if isinstance(fake, tuple) else (fake,)
    assert [(t.dtype, t.dim()) for t in real] == [(t.dtype, t.dim()) for t in fake]
