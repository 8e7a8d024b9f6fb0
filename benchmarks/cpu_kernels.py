"""The CPU register kernels' instruction sets side by side: every set this CPU has
(torchsparse_pp.backends.cpu_kernels: "avx512", "avx2", "none" = float tiles through ATen's
micro-kernel) on every sparse conv layer of MinkUNet 0.5x, per pass, float32 and bfloat16.

Workload: MinkUNet(4, 19, cr=0.5) on the generated 64-beam scan (seed 0) at 0.05 m
(benchmarks/models.py), its layers and operands as in defaults_cpu.py (random features and
gradients of each layer's shapes, maps cached). --dataflow picks fetch_on_demand (default) or
implicit_gemm (sorted, 1 split). Per layer, all (instruction set, dtype, pass) tasks run
round-robin in one process, the switch set before each call (benchmarks/common.py
interleaved_times); median of --repeats after --warmup; at --threads (default 2). Reported:
ms summed over the layers per (set, dtype, pass), each set's speed-up over "none", and the
rate of torch.mm on 2048^2 float32 matrices in the same run, with the layers' MACs at that rate.

Output: cpu_kernels.json + cpu_kernels.png in a new benchmarks/out/cpu_kernels-<time>/, --out DIR,
or benchmarks/results/ with --publish.

Usage: python benchmarks/cpu_kernels.py [--dataflow fetch_on_demand|implicit_gemm] [--repeats N]
       [--warmup N] [--threads T] [--quick] [--out DIR | --publish]
"""
import argparse
import os
import sys

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, add_round_arguments, check_round_arguments,  # noqa: E402
                    grouped_bars, interleaved_times, load_average, machine_info, mm_rates, num_threads,
                    output_dir, pyplot, save_figure, write_json)
from defaults_cpu import CONFIGS, PASSES, record_layers  # noqa: E402
from models import minkunet_workload  # noqa: E402

import torchsparse_pp as tsp  # noqa: E402
from torchsparse_pp.nn.functional.dataflows import DATAFLOW_MODULES  # noqa: E402

DATAFLOWS = {"fetch_on_demand": "fetch_on_demand", "implicit_gemm": "implicit_gemm(sorted, split=1)"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def layer_tasks(layer, config, isas, gen):
    flow = DATAFLOW_MODULES[config.dataflow]
    view = layer["view"]
    tasks = {}
    for dname, dtype in DTYPES.items():
        w = layer["module"].kernel.detach().to(dtype)
        feats = torch.randn(view.num_src, layer["c_in"], generator=gen).to(dtype)
        grad = torch.randn(view.num_dst, layer["c_out"], generator=gen).to(dtype)
        flow.forward(feats, w, view, config, False)  # builds the views, untimed
        flow.dgrad(grad, w, view, config, False)
        calls = {"forward": lambda w=w, f=feats: flow.forward(f, w, view, config, False),
                 "dgrad": lambda w=w, g=grad: flow.dgrad(g, w, view, config, False),
                 "wgrad": lambda f=feats, g=grad: flow.wgrad(f, g, view, config, False)}
        for isa in isas:
            for p, call in calls.items():
                def run(isa=isa, call=call):
                    tsp.backends.cpu_kernels = isa
                    call()
                tasks[f"{isa}|{dname}|{p}"] = (run, None)
    return tasks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_round_arguments(parser, repeats=5)
    parser.add_argument("--dataflow", choices=sorted(DATAFLOWS), default="fetch_on_demand")
    parser.add_argument("--quick", action="store_true", help="2 repeats")
    add_output_arguments(parser, "cpu_kernels")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 2)
    check_round_arguments(parser, args)
    out = output_dir(args, "cpu_kernels")
    start = tsp.backends.cpu_kernels
    isas = list(tsp.backends.available_cpu_kernels())
    config = CONFIGS[DATAFLOWS[args.dataflow]]
    workload = minkunet_workload(0.5)
    layers = record_layers(workload.ours.eval(), workload.ours_input("cpu"))
    gen = torch.Generator().manual_seed(7)
    rows, totals, macs = [], {}, 0
    try:
        with tqdm(total=len(layers), desc="layers", unit="layer", file=sys.stderr) as bar:
            for layer in layers:
                with num_threads(args.threads):
                    times = interleaved_times(layer_tasks(layer, config, isas, gen), args.repeats, args.warmup)
                pairs = int(layer["view"].kmap.pairs.offsets[-1])
                macs += pairs * layer["c_in"] * layer["c_out"]
                row = {"layer": layer["name"], "c_in": layer["c_in"], "c_out": layer["c_out"], "pairs": pairs,
                       "seconds": {k: v["median_s"] for k, v in times.items()}}
                for k, v in row["seconds"].items():
                    totals[k] = totals.get(k, 0.0) + v
                rows.append(row)
                bar.update(1)
    finally:
        tsp.backends.cpu_kernels = start
    mm_rate = mm_rates(args.threads, dtypes=("float32",))["float32"]
    report = {"benchmark": "cpu_kernels", "description": __doc__, "machine": machine_info(), "threads": args.threads,
              "repeats": args.repeats, "warmup": args.warmup, "dataflow": args.dataflow, "isas": isas,
              "default_isa": start, "load_after": load_average(), "mm_rate_flops": mm_rate,
              "macs_per_pass": macs, "layers": rows, "total_seconds": totals,
              "speedup_over_none": {k: totals[f"none|{k.split('|', 1)[1]}"] / v for k, v in totals.items()}}
    write_json(os.path.join(out, "cpu_kernels.json"), report)
    print_table(report)
    plot(report, os.path.join(out, "cpu_kernels.png"))
    print(f"\nwrote {out}/cpu_kernels.json and .png")
    return 0


def print_table(report) -> None:
    t = report["total_seconds"]
    roof = report["macs_per_pass"] * 2 / report["mm_rate_flops"]
    print(f"\nMinkUNet 0.5x, {report['dataflow']}, ms summed over {len(report['layers'])} layers "
          f"({report['threads']} threads; torch.mm {report['mm_rate_flops'] / 1e9:.0f} GFLOP/s: "
          f"{roof * 1e3:.0f} ms per pass at that rate); speed-up over 'none' in brackets")
    for dname in DTYPES:
        for isa in report["isas"]:
            cells = [f"{t[f'{isa}|{dname}|{p}'] * 1e3:8.1f} ({report['speedup_over_none'][f'{isa}|{dname}|{p}']:.2f}x)"
                     for p in PASSES]
            print(f"{dname:<9} {isa:<7}" + "".join(f"{c:>20}" for c in cells))


def plot(report, path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(DTYPES), figsize=(11, 4), squeeze=False)
    for ax, dname in zip(axes[0], DTYPES):
        series = {isa: [report["total_seconds"][f"{isa}|{dname}|{p}"] * 1e3 for p in PASSES] for isa in report["isas"]}
        grouped_bars(ax, PASSES, series, "ms, sum over conv layers",
                     f"MinkUNet 0.5x {report['dataflow']} {dname} ({report['threads']} threads)")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
