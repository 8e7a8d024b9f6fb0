"""torch.library.opcheck on every registered torchsparse_pp operator.

opcheck runs each op on real inputs and checks its schema (no mutation or aliasing it does not
declare), its fake kernel against the real outputs (dtype, shape, strides; data-dependent sizes
as unbacked SymInts), its autograd registration, and that AOT dispatch handles it (static and
dynamic shapes). ``test_every_registered_op_has_a_case`` fails when an op registered under
torch.ops.torchsparse_pp (C++ schemas in csrc/ops.cpp and Python custom ops alike) has no case
here. The Triton ops run under the Triton interpreter without a GPU (conftest).
"""
import pytest
import torch

import torchsparse_pp  # noqa: F401  (registers the C++ ops)
import torchsparse_pp.nn  # noqa: F401  (registers sparse_conv and the Triton entry points)
from torchsparse_pp import ops
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map, submanifold_map
from torchsparse_pp.nn.functional.config import ConvConfig, PassConfigs, resolve_for_call
from torchsparse_pp.nn.functional.dataflows import DATAFLOW_MODULES, OrientedMap
from torchsparse_pp.nn.functional.dataflows.passes import PASSES
from torchsparse_pp.ops import kmap_torch  # noqa: F401  (registers torch_kmap_*)
from conftest import random_coords

NS = "torchsparse_pp"
K3 = [3, 3, 3]
ONES = [1, 1, 1]


class Maps:
    """Small maps every case draws its operands from: a 2-sample submanifold k3 map and a
    k2 s2 strided map out of it."""

    def __init__(self, generator: torch.Generator):
        self.gen = generator
        coords = random_coords(generator, 260, batch=2)
        cache = KernelMapCache()
        self.sub = submanifold_map(cache, coords, ConvGeometry.make(3), None)
        self.down = strided_map(cache, coords, ConvGeometry.make(2, 2), "spconv", None)

    def randn(self, *shape, dtype=torch.float32, requires_grad=False):
        return torch.randn(*shape, generator=self.gen, dtype=dtype).requires_grad_(requires_grad)


def _pairs(m, kmap, side="out"):
    p = kmap.pairs_sorted_by(side)
    return p.in_idx, p.out_idx, p.offsets, p.identity


def _plan(kmap, splits=2, tile_rows=8):
    return ops.kmap_plan(kmap.out_in, kmap.num_out, splits, tile_rows, 0)


def _conv_args(m, dataflow, backend="native", requires_grad=True):
    kmap = m.sub
    config = ConvConfig(dataflow=dataflow, backend=backend)
    configs, text = resolve_for_call(PassConfigs(config, config, config), "cpu")
    view = OrientedMap(kmap, False)
    operands = [DATAFLOW_MODULES[cfg.dataflow].operands(view, p, cfg, False) if requires_grad or p == "forward" else []
                for p, cfg in zip(PASSES, configs)]
    feats = m.randn(kmap.num_in, 5, requires_grad=requires_grad)
    weight = m.randn(27, 5, 6, requires_grad=requires_grad)
    return (feats, weight, *operands, kmap.num_in, kmap.num_out, text, False, False)


def _relu_mask(m, channels):
    """A random ReLU mask as batch_norm_apply_masked makes it: int16 bits, a word per 16 channels."""
    return torch.randint(-2 ** 15, 2 ** 15, (m.sub.num_in, (channels + 15) // 16), generator=m.gen,
                         dtype=torch.int32).to(torch.int16)


def _swapped(pairs):
    """A pair view read from outputs to inputs (what dgrad passes)."""
    in_idx, out_idx, offsets, identity = pairs
    return out_idx, in_idx, offsets, identity


# op name -> list of (case id, function of Maps returning the argument tuple)
CASES = {
    "cpu_bf16_dot": [("", lambda m: ())],
    "cpu_register_kernels": [("", lambda m: ())],
    "cpu_register_isa": [("", lambda m: ())],
    # Sets what is set already: the check leaves the process's choice as it was.
    "cpu_set_register_isa": [("", lambda m: (ops.cpu_register_isa(),))],
    "cuda_built": [("", lambda m: ())],
    "hash_build": [("", lambda m: (m.sub.in_coords,))],
    "hash_query": [("", lambda m: (ops.hash_build(m.sub.in_coords), m.down.out_coords))],
    "kmap_out_in": [
        (f"submanifold={s}", lambda m, s=s: (ops.hash_build(m.sub.in_coords), m.sub.in_coords, K3, ONES, ONES, ONES,
                                               128, s)) for s in (False, True)],
    "kmap_submanifold": [("", lambda m: (m.sub.in_coords, K3, ONES, ONES, 128))],
    "kmap_downsample": [
        ("spconv", lambda m: (m.sub.in_coords, K3, [2, 2, 2], ONES, ONES, "spconv", None, 128)),
        ("minkowski", lambda m: (m.sub.in_coords, [2, 2, 2], [2, 2, 2], ONES, [0, 0, 0], "minkowski", None, 128)),
    ],
    "kmap_generative": [("", lambda m: (m.down.out_coords, [2, 2, 2], [2, 2, 2], ONES, [0, 0, 0], None, 128))],
    "kmap_pairs": [("", lambda m: (m.sub.out_in, m.sub.num_in, m.sub.num_out))],
    "kmap_transpose": [("", lambda m: (m.down.out_in, m.down.num_out, m.down.num_in, 128))],
    "kmap_plan": [(f"splits={s}", lambda m, s=s: (m.sub.out_in, m.sub.num_out, s, 8, w))
                  for s, w in ((0, 0), (2, 0), (3, 64))],
    "gather_scatter_forward": [
        ("forward", lambda m: (m.randn(m.sub.num_in, 5), m.randn(27, 5, 7), *_pairs(m, m.sub, "in"),
                               m.sub.num_out, False)),
        ("dgrad-batched", lambda m: (m.randn(m.down.num_out, 7), m.randn(8, 5, 7), *_swapped(_pairs(m, m.down)),
                                     m.down.num_in, True, 0.5, 1000)),
    ],
    "gather_scatter_wgrad": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(m.sub.num_out, 7),
                                            *_pairs(m, m.sub, "in")))],
    "fetch_on_demand_forward": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(27, 5, 7), *_pairs(m, m.sub),
                                               m.sub.num_out, False))],
    "fetch_on_demand_wgrad": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(m.sub.num_out, 7),
                                             *_pairs(m, m.sub)))],
    "fetch_on_demand_forward_fused": [
        (f"bias={b}-residual={r}-relu={a}",
         lambda m, b=b, r=r, a=a: (m.randn(m.sub.num_in, 5), m.randn(27, 5, 7), *_pairs(m, m.sub), m.sub.num_out,
                                   m.randn(7) if b else None, m.randn(m.sub.num_out, 7) if r else None, a))
        for b, r, a in ((False, False, False), (True, True, True))],
    "implicit_gemm_forward": [
        (f"splits={s}", lambda m, s=s: (m.randn(m.sub.num_in, 5), m.randn(27, 5, 7), m.sub.out_in, m.sub.num_out,
                                        False, *_plan(m.sub, s), 8)) for s in (0, 2)],
    "implicit_gemm_row_groups": [(f"splits={s}", lambda m, s=s: (m.sub.out_in, m.sub.num_out, *_plan(m.sub, s), 8))
                                 for s in (0, 2)],
    "implicit_gemm_forward_grouped": [
        (f"splits={s}", lambda m, s=s: (m.randn(m.sub.num_in, 5), m.randn(27, 5, 7), m.sub.out_in, m.sub.num_out,
                                        False, *_plan(m.sub, s), 8,
                                        *ops.implicit_gemm_row_groups(m.sub.out_in, m.sub.num_out, *_plan(m.sub, s),
                                                                      8))) for s in (0, 2)],
    "implicit_gemm_wgrad": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(m.sub.num_out, 7), m.sub.out_in,
                                           *_plan(m.sub), 8))],
    "pool_pairs_max": [("", lambda m: (m.randn(m.down.num_in, 6, requires_grad=True), *_pairs(m, m.down)[:2],
                                      m.down.num_out))],
    "pool_pairs_mean": [("", lambda m: (m.randn(m.down.num_in, 6, requires_grad=True), *_pairs(m, m.down)[:2],
                                       m.down.num_out))],
    "segment_max": [("", lambda m: (m.randn(m.sub.num_in, 6, requires_grad=True), m.sub.in_coords[:, 0].long()))],
    "segment_mean": [("", lambda m: (m.randn(m.sub.num_in, 6, requires_grad=True), m.sub.in_coords[:, 0].long()))],
    "sample_group_norm": [
        ("affine", lambda m: (m.randn(m.sub.num_in, 6, requires_grad=True), m.sub.in_coords[:, 0].long(), 3,
                              m.randn(6, requires_grad=True), m.randn(6, requires_grad=True), 1e-5)),
        ("plain", lambda m: (m.randn(m.sub.num_in, 6, requires_grad=True), m.sub.in_coords[:, 0].long(), 2,
                             None, None, 1e-5)),
    ],
    "batch_norm_stats": [(f"{dt}", lambda m, dt=dt: (m.randn(m.sub.num_in, 6, dtype=dt), 1e-5))
                         for dt in (torch.float32, torch.float64)],
    "batch_norm_apply": [
        ("residual_relu", lambda m: (m.randn(m.sub.num_in, 6), m.randn(6), m.randn(6), m.randn(m.sub.num_in, 6),
                                     True)),
        ("plain", lambda m: (m.randn(m.sub.num_in, 6, dtype=torch.float64), m.randn(6, dtype=torch.float64),
                             m.randn(6, dtype=torch.float64), None, False)),
    ],
    "batch_norm_apply_masked": [
        ("residual", lambda m: (m.randn(m.sub.num_in, 20), m.randn(20), m.randn(20), m.randn(m.sub.num_in, 20))),
        ("plain", lambda m: (m.randn(m.sub.num_in, 6, dtype=torch.float64), m.randn(6, dtype=torch.float64),
                             m.randn(6, dtype=torch.float64), None)),
    ],
    "batch_norm_backward": [
        ("relu_residual", lambda m: (m.randn(m.sub.num_in, 6), m.randn(m.sub.num_in, 6), m.randn(6),
                                     m.randn(6).abs() + 0.5, m.randn(6), _relu_mask(m, 6), True)),
        ("relu", lambda m: (m.randn(m.sub.num_in, 20), m.randn(m.sub.num_in, 20), m.randn(20),
                            m.randn(20).abs() + 0.5, None, _relu_mask(m, 20), False)),
        ("plain", lambda m: (m.randn(m.sub.num_in, 6, dtype=torch.float64), m.randn(m.sub.num_in, 6,
                                                                                    dtype=torch.float64),
                             m.randn(6, dtype=torch.float64), m.randn(6, dtype=torch.float64).abs() + 0.5, None, None,
                             False)),
    ],
    "sparse_conv": [(f"{d}", lambda m, d=d: _conv_args(m, d)) for d in DATAFLOW_MODULES]
    + [("inference", lambda m: _conv_args(m, "fetch_on_demand", requires_grad=False))],
    "torch_kmap_submanifold": [("", lambda m: (m.sub.in_coords, K3, ONES, ONES, 128))],
    "torch_kmap_downsample": [("", lambda m: (m.sub.in_coords, K3, [2, 2, 2], ONES, ONES, "spconv", [6, 6, 6], 128))],
    "torch_kmap_generative": [("", lambda m: (m.down.out_coords, [2, 2, 2], [2, 2, 2], ONES, [0, 0, 0], None,
                                             128))],
    "torch_kmap_pairs": [("", lambda m: (m.sub.out_in, m.sub.num_in, m.sub.num_out))],
    "torch_kmap_transpose": [("", lambda m: (m.down.out_in, m.down.num_out, m.down.num_in, 128))],
    "torch_kmap_plan": [("", lambda m: (m.sub.out_in, m.sub.num_out, 2, 64, 0))],
    # The Triton entry points (run by the Triton interpreter on CPU tensors).
    "triton_fetch_on_demand_forward": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(27, 5, 7),
                                                      *_pairs(m, m.sub)[:3], m.sub.num_out, False, None, False))],
    "triton_fetch_on_demand_forward_owned": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(27, 5, 7), m.sub.out_in,
                                                            m.sub.num_out, False, None, False))],
    "triton_fetch_on_demand_wgrad": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(m.sub.num_out, 7),
                                                    *_pairs(m, m.sub)[:3], None, False, True))],
    "triton_implicit_gemm_forward": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(27, 5, 7), m.sub.out_in,
                                                    m.sub.num_out, False, *_plan(m.sub, 1, 64), 64, None, False))],
    "triton_implicit_gemm_wgrad": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(m.sub.num_out, 7), m.sub.out_in,
                                                  *_plan(m.sub, 1, 64), 64, None, False, True))],
    "triton_gather_scatter_forward": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(27, 5, 7),
                                                     *_pairs(m, m.sub, "in"), m.sub.num_out, False, 0.0, 0))],
    "triton_gather_scatter_wgrad": [("", lambda m: (m.randn(m.sub.num_in, 5), m.randn(m.sub.num_out, 7),
                                                   *_pairs(m, m.sub, "in")))],
}


def registered_ops():
    return sorted(name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith(f"{NS}::"))


def test_every_registered_op_has_a_case():
    registered = set(registered_ops())
    # The registrations are where they should be (a failed import would shrink both sides).
    assert {"sparse_conv", "kmap_submanifold", "torch_kmap_plan", "triton_implicit_gemm_wgrad",
            "sample_group_norm"} <= registered
    assert registered - set(CASES) == set(), "registered ops without an opcheck case"
    assert set(CASES) - registered == set(), "opcheck cases for ops that are not registered"


@pytest.mark.parametrize("op,case", [(op, i) for op, cases in CASES.items() for i in range(len(cases))],
                         ids=[f"{op}-{cid}" if cid else op for op, cases in CASES.items() for cid, _ in cases])
def test_opcheck(op, case, generator):
    args = CASES[op][case][1](Maps(generator))
    overload = getattr(torch.ops.torchsparse_pp, op).default
    torch.library.opcheck(overload, args)
