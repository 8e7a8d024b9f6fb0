"""1x1x1 convs on the CPU: torch.addmm (+ the epilogue as torch ops) against fetch_on_demand's
register kernel over identity pairs (bias / residual / ReLU in its epilogue), the route
inference takes where the CPU has the kernels (torchsparse_pp/nn/functional/epilogue.py).

Layers: every 1x1x1 Conv3d of MinkUNet 0.5x and 1.0x (the residual blocks' shortcuts; the
CenterPoint backbone has none), with the shapes one eval forward gives them (recorded by hooks),
fresh random operands, each timed as a shortcut (bias) and as a block end (bias, residual, ReLU).
Both routes of a layer run round-robin in one loop (median of --repeats rounds after --warmup),
each checked against the other first. Reported: ms per layer and summed per model, and the
speed-up of the kernel route over addmm.

Output: pointwise_cpu.json and pointwise_cpu.png in a new benchmarks/out/pointwise_cpu-<time>/
(git-ignored), --out DIR, or benchmarks/results/ with --publish.

Usage: python benchmarks/pointwise_cpu.py [--repeats N] [--warmup N] [--threads T] [--quick]
       [--out DIR | --publish]
"""
import argparse
import os
import sys

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, add_round_arguments, check_round_arguments, interleaved_times,  # noqa: E402
                    load_average, machine_info, num_threads, output_dir, pyplot, save_figure, write_json)
from models import WORKLOADS  # noqa: E402

from torchsparse_pp import ops  # noqa: E402
from torchsparse_pp.nn import Conv3d  # noqa: E402
from torchsparse_pp.nn.functional.epilogue import pointwise_fused  # noqa: E402


def record_pointwise(workload) -> list:
    """(name, rows, c_in, c_out) of every 1x1x1 Conv3d in one eval forward."""
    model = workload.ours.eval()
    names = {m: n for n, m in model.named_modules()}
    seen = []

    def hook(module, inputs, output):
        if module.geometry.is_pointwise:
            seen.append({"layer": names[module], "rows": int(inputs[0].F.shape[0]), "c_in": module.in_channels,
                         "c_out": module.out_channels})
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, Conv3d)]
    with torch.no_grad():
        model(workload.ours_input("cpu"))
    for h in handles:
        h.remove()
    return seen


def layer_tasks(layer: dict, gen: torch.Generator):
    """The two routes of a shortcut-like layer (bias, no residual) and of a block-end layer
    (bias, residual, ReLU), on the same operands."""
    n, c_in, c_out = layer["rows"], layer["c_in"], layer["c_out"]
    feats = torch.randn(n, c_in, generator=gen)
    weight = torch.randn(1, c_in, c_out, generator=gen)
    bias = torch.randn(c_out, generator=gen)
    residual = torch.randn(n, c_out, generator=gen)

    def addmm(with_residual):
        out = torch.addmm(bias, feats, weight[0])
        return out.add_(residual).relu_() if with_residual else out

    def kernel(with_residual):
        return pointwise_fused(feats, weight, bias, residual if with_residual else None, with_residual)
    for r in (False, True):
        assert torch.allclose(addmm(r), kernel(r), rtol=1e-4, atol=1e-4), layer
    return {f"{route}|{'bias+residual+relu' if r else 'bias'}": (lambda f=fn, r=r: f(r), None)
            for route, fn in (("addmm", addmm), ("kernel", kernel)) for r in (False, True)}


def plot(report, path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 3.5))
    models = list(report["models"])
    for i, route in enumerate(("addmm", "kernel")):
        ms = [report["models"][m]["total_ms"][route] for m in models]
        ax.bar([j + 0.4 * i for j in range(len(models))], ms, width=0.4, label=route)
    ax.set_xticks([j + 0.2 for j in range(len(models))], models)
    ax.set_ylabel("ms, 1x1x1 convs summed (bias only)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="MinkUNet 0.5x, 3 repeats")
    add_output_arguments(parser, "pointwise_cpu")
    args = parser.parse_args(argv)
    check_round_arguments(parser, args)
    models = ["minkunet0.5"] if args.quick else ["minkunet0.5", "minkunet1.0"]
    if args.quick:
        args.repeats = 3
    out_dir = output_dir(args, "pointwise_cpu")
    if not ops.cpu_register_kernels():
        print("note: this CPU has no AVX-512 register kernels; inference keeps torch.addmm here", file=sys.stderr)
    data = {"machine": machine_info(), "load_average_before": load_average(), "threads": args.threads,
            "repeats": args.repeats, "register_kernels": ops.cpu_register_kernels(), "models": {}}
    gen = torch.Generator().manual_seed(3)
    layers = {m: record_pointwise(WORKLOADS[m]()) for m in models}
    with tqdm(total=sum(len(v) for v in layers.values()), unit="layer", file=sys.stderr) as bar:
        for model, rows in layers.items():
            total = {"addmm": 0.0, "kernel": 0.0}
            for layer in rows:
                with num_threads(args.threads):
                    times = interleaved_times(layer_tasks(layer, gen), args.repeats, args.warmup)
                layer["ms"] = {k: v["median_s"] * 1e3 for k, v in times.items()}
                for route in total:
                    total[route] += layer["ms"][f"{route}|bias"]
                bar.update()
            if rows:
                data["models"][model] = {"layers": rows, "total_ms": total,
                                         "kernel_speedup": total["addmm"] / total["kernel"]}
    data["load_average_after"] = load_average()
    print(f"\n1x1x1 convs, ms summed per model ({args.threads} threads, median of {args.repeats} rounds)")
    for model, r in data["models"].items():
        print(f"{model:12s} {len(r['layers'])} layers: addmm {r['total_ms']['addmm']:7.2f}  kernel "
              f"{r['total_ms']['kernel']:7.2f}  -> {r['kernel_speedup']:.2f}x")
        for layer in r["layers"]:
            ms = layer["ms"]
            print(f"  {layer['layer']:32s} {layer['rows']:7d} x {layer['c_in']:3d} -> {layer['c_out']:3d}: bias "
                  f"{ms['addmm|bias']:6.2f} vs {ms['kernel|bias']:6.2f}; +residual+relu "
                  f"{ms['addmm|bias+residual+relu']:6.2f} vs {ms['kernel|bias+residual+relu']:6.2f}")
    write_json(os.path.join(out_dir, "pointwise_cpu.json"), data)
    plot(data, os.path.join(out_dir, "pointwise_cpu.png"))
    print(f"wrote {out_dir}/pointwise_cpu.json and pointwise_cpu.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
