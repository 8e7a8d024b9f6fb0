"""The CPU kernels pick their inner loops at run time from the CPU's features: register
gather-GEMM-scatter kernels (AVX-512, else AVX2), bfloat16 dot products (AVX512-BF16), or float tiles
through ATen's micro-kernel. The suite runs the paths this CPU picks; here every combination is
forced in a fresh process by its environment variable (read once at start) and all must agree, forward, dgrad and
wgrad, for fetch_on_demand, implicit GEMM (sorted and with splits) and gather_scatter."""
import os
import subprocess
import sys

import pytest
import torch

from dataflow_cases import rel_to

RUN = r"""
import sys, torch
sys.path.insert(0, {tests!r})
import torchsparse_pp as tsp
from torchsparse_pp.nn.functional import ConvConfig, conv3d
from conftest import lidar_coords
g = torch.Generator().manual_seed({seed})
coords = lidar_coords({seed} % 1000, batch=2)
configs = [ConvConfig("fetch_on_demand"), ConvConfig("implicit_gemm", sorted=True, split_mask_num=2),
           ConvConfig("implicit_gemm", sorted=False, split_mask_num=0), ConvConfig("gather_scatter")]
out = {{}}
for dtype in (torch.float32, torch.bfloat16):
    # odd K (bf16 pairs), narrow W, > 64 columns, 3-vector blocks, > 128 columns
    for c_in, c_out in ((5, 7), (12, 20), (19, 70), (40, 33), (70, 150)):
        f0 = torch.randn(len(coords), c_in, generator=g)
        w0 = torch.randn(27, c_in, c_out, generator=g) / 4
        g0 = torch.randn(len(coords), c_out, generator=g)
        # The same sums over absolute values (float64): the scale of every path's rounding.
        fa, wa = f0.to(dtype).double().abs().requires_grad_(True), w0.to(dtype).double().abs().requires_grad_(True)
        ya = conv3d(tsp.SparseTensor(fa, coords), wa, 3)
        ya.F.backward(g0.to(dtype).double().abs())
        out[(str(dtype), c_in, "magnitude")] = (ya.F.detach(), fa.grad, wa.grad)
        for i, cfg in enumerate(configs):
            f = f0.to(dtype).requires_grad_(True)
            w = w0.to(dtype).requires_grad_(True)
            y = conv3d(tsp.SparseTensor(f, coords), w, 3, config=cfg)
            y.F.backward(g0.to(dtype))
            out[(str(dtype), c_in, i)] = (y.F.detach().float(), f.grad.float(), w.grad.float())
torch.save(out, {path!r})
"""
PATHS = {"default": {}, "tiles": {"TSPP_DISABLE_PAIR_KERNEL": "1"}, "no_bf16_dot": {"TSPP_DISABLE_BF16_DOT": "1"},
         "avx2": {"TSPP_DISABLE_AVX512_KERNELS": "1"},
         "plain": {"TSPP_DISABLE_PAIR_KERNEL": "1", "TSPP_DISABLE_BF16_DOT": "1"}}


def test_every_kernel_path_agrees(tmp_path, seed):
    results = {}
    for name, env in PATHS.items():
        path = str(tmp_path / f"{name}.pt")
        code = RUN.format(tests=os.path.dirname(__file__), seed=seed, path=path)
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("TSPP_DISABLE_PAIR_KERNEL", "TSPP_DISABLE_BF16_DOT", "TSPP_DISABLE_AVX512_KERNELS")}
        subprocess.run([sys.executable, "-c", code], check=True, env=dict(clean, **env), timeout=600)
        results[name] = torch.load(path)
    base = results["plain"]
    for name, res in results.items():
        for key, tensors in res.items():
            if key[2] == "magnitude":
                continue
            # Relative to the sums over absolute values: float32 sums in any order stay far under
            # 1e-5; two bfloat16 results, each at most 2 x 2^-8 of that scale from the exact one
            # (test_cpu_isa.TOLERANCE), at most 1.6e-2 apart: a bound.
            tol = 1e-5 if key[0] == "torch.float32" else 2e-2
            magnitude = base[(key[0], key[1], "magnitude")]
            for what, a, b, m in zip(("forward", "dgrad", "wgrad"), tensors, base[key], magnitude):
                err = rel_to(a, b, m)
                assert err < tol, f"{name} vs plain {key} {what}: {err:.2e}"
