"""What the CUDA path costs a GPU, counted on the CPU: device ops (non-view ATen ops + Triton
launches; uninitialised allocations apart) and host syncs per forward, training step and cached conv, today's defaults beside the
former ones (torch-ops kernel maps + gather_scatter) and the budget tests/test_gpu_budget.py
enforces. JSON + PNG.

Everything runs under torchsparse_pp.backends.device_policy("cuda") (CPU tensors take every
decision CUDA tensors take) with the Triton kernels interpreted (TRITON_INTERPRET=1, set here),
counted by torchsparse_pp.utils.gpu_cost. The counts do not depend on the voxel count (no host
loop runs over rows), so a crop of the generated 64-beam scan (a --window metres square around
one of its voxels) keeps the interpreter's time short; the JSON records the voxel counts.

Usage: python benchmarks/gpu_budget.py [--window M] [--quick] [--out DIR | --publish]
"""
import argparse
import contextlib
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, git_revision, grouped_bars, lidar_batch, machine_info,  # noqa: E402
                    output_dir, pyplot, save_figure, write_json)

import torchsparse_pp as tsp  # noqa: E402
from torchsparse_pp import backends  # noqa: E402
from torchsparse_pp.models import MinkUNet  # noqa: E402
from torchsparse_pp.nn.functional import ConvConfig, default_config  # noqa: E402
from torchsparse_pp.utils.gpu_cost import count_gpu_cost  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (ops, syncs) budgets of tests/test_gpu_budget.py; the training step's ops: 3x inference.
BUDGETS = {"MinkUNet 0.5x inference": (400, 5), "MinkUNet 0.5x training step": (None, 5),
           "conv C=64 s1, cached map: forward": (3, 0), "conv C=64 s1, cached map: dgrad + wgrad": (6, 0),
           "conv C=64 s2, cached map: forward": (3, 0), "conv C=64 s2, cached map: dgrad + wgrad": (6, 0)}


class Former:
    """The CUDA path's former defaults: kernel maps in torch ops, gather_scatter for every conv."""

    def __enter__(self):
        self._kmap = backends.kmap_backend
        backends.kmap_backend = "torch"
        self._config = default_config(ConvConfig("gather_scatter"))
        self._config.__enter__()

    def __exit__(self, *exc):
        self._config.__exit__(*exc)
        backends.kmap_backend = self._kmap


def scan(window: float):
    coords, _ = lidar_batch(64, 0.05, [0])
    centre = coords[len(coords) // 2, 1:].float()  # a voxel of the scan: its window holds points
    keep = ((coords[:, 1:3].float() - centre[:2]).abs() * 0.05 < window / 2).all(1)
    coords = coords[keep]
    gen = torch.Generator().manual_seed(0)
    return coords, torch.randn(len(coords), 4, generator=gen)


def count(fn):
    with backends.device_policy("cuda"), count_gpu_cost() as cost:
        fn()
    return {"device_ops": cost.device_ops, "triton_launches": cost.launches, "host_syncs": cost.host_syncs,
            "allocations": cost.allocations, "syncs": dict(cost.syncs)}


def model_rows(coords, feats):
    torch.manual_seed(0)
    model = MinkUNet(4, 19, cr=0.5)
    labels = torch.randint(0, 19, (len(coords),), generator=torch.Generator().manual_seed(0))

    with torch.no_grad(), backends.device_policy("cuda"):  # folds the BatchNorms (once per model)
        model.eval()(tsp.SparseTensor(feats[: len(coords) // 2], coords[: len(coords) // 2]))

    def inference():
        with torch.no_grad():
            model.eval()(tsp.SparseTensor(feats, coords))

    def step():
        TF.cross_entropy(model.train()(tsp.SparseTensor(feats, coords)), labels).backward()
    return {"MinkUNet 0.5x inference": inference, "MinkUNet 0.5x training step": step}


def conv_rows(coords, stride: int, channels: int = 64):
    conv = tsp.nn.Conv3d(channels, channels, 3, stride=stride)
    gen = torch.Generator().manual_seed(1)
    x = tsp.SparseTensor(torch.randn(len(coords), channels, generator=gen, requires_grad=True), coords)
    holder = {}

    def warm():
        with backends.device_policy("cuda"):
            holder["out"] = conv(x)  # builds and caches the map and its views
            holder["grad"] = torch.ones_like(holder["out"].F)

    def forward():
        with torch.no_grad():
            conv(x)

    def backward():
        holder["out"].F.backward(holder["grad"])
    name = f"conv C={channels} s{stride}, cached map"
    return warm, {f"{name}: forward": forward, f"{name}: dgrad + wgrad": backward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=6.0, help="crop side in metres (default 6)")
    parser.add_argument("--quick", action="store_true", help="a 3 m window (a test of the script)")
    add_output_arguments(parser, "gpu_budget")
    args = parser.parse_args()
    out_dir = output_dir(args, "gpu_budget")
    coords, feats = scan(3.0 if args.quick else args.window)
    print(f"{len(coords)} voxels", flush=True)
    started = time.time()
    results = {}
    for label, setting in (("former", Former), ("current", contextlib.nullcontext)):
        rows = {}
        with setting():
            for name, fn in model_rows(coords, feats).items():
                rows[name] = count(fn)
                print(f"{label:8s} {name:42s} {rows[name]}", flush=True)
            for stride in (1, 2):
                warm, fns = conv_rows(coords, stride)
                warm()
                for name, fn in fns.items():
                    rows[name] = count(fn)
                    print(f"{label:8s} {name:42s} {rows[name]}", flush=True)
        results[label] = rows
    data = {"description": __doc__, "voxels": len(coords), "window_m": 3.0 if args.quick else args.window,
            "budgets": {k: {"device_ops": v[0], "host_syncs": v[1]} for k, v in BUDGETS.items()},
            "results": results, "machine": machine_info(), "revision": git_revision(ROOT),
            "seconds": round(time.time() - started, 1)}
    write_json(os.path.join(out_dir, "gpu_budget.json"), data)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(results["current"])
    short = [n.replace("MinkUNet 0.5x ", "MinkUNet ").replace(", cached map", "") for n in names]
    for ax, key, title in ((axes[0], "device_ops", "device ops"), (axes[1], "host_syncs", "host syncs")):
        grouped_bars(ax, short, {label: [results[label][n][key] for n in names] for label in results},
                     key.replace("_", " "), f"{title} per call (log scale)")
        ax.set_yscale("symlog")
        ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    save_figure(fig, os.path.join(out_dir, "gpu_budget.png"), dpi=120)
    print(f"wrote {out_dir}/gpu_budget.json and .png")


if __name__ == "__main__":
    main()
