"""bfloat16 against float32 per CPU dataflow and pass: how much each dataflow's bf16 kernels gain
over their own float32 selves, on the sparse conv layers of MinkUNet (0.5x).

Layers and operands as in benchmarks/defaults_cpu.py (one forward records every Conv3d with a
kernel map; each pass then runs through the dataflow module on the cached map, with random
features and gradients of the layer's shapes), once in float32 and once in bfloat16 (the same
values rounded). The float32 and bf16 tasks of a layer run round-robin in one loop, so load from
elsewhere hits both alike; per (dataflow, pass) the report sums the medians over the layers and
gives bf16's speed-up over float32. Which inner loops ran (AVX512-BF16 dot products or float
tiles) is recorded from torch.ops.torchsparse_pp.cpu_bf16_dot().

Output: bf16_cpu.json and bf16_cpu.png in a new benchmarks/out/bf16_cpu-<time>/ (git-ignored),
--out DIR, or benchmarks/results/ with --publish.

Usage: python benchmarks/bf16_cpu.py [--repeats N] [--warmup N] [--threads T] [--quick]
       [--out DIR | --publish]
"""
import argparse
import os
import sys

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, add_round_arguments, busy_processes, check_round_arguments,  # noqa: E402
                    grouped_bars, interleaved_times, load_average, machine_info, num_threads, output_dir, pyplot,
                    save_figure, write_json)
from defaults_cpu import CONFIGS, PASSES, layer_tasks, record_layers  # noqa: E402
from models import minkunet_workload  # noqa: E402

from torchsparse_pp import ops  # noqa: E402

DATAFLOWS = ("gather_scatter", "fetch_on_demand", "implicit_gemm(sorted, split=1)")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run(workload, layers, args, bar) -> dict:
    configs = {n: CONFIGS[n] for n in DATAFLOWS}
    totals = {d: {p: {n: 0.0 for n in configs} for p in PASSES} for d in DTYPES}
    rows = []
    for layer in layers:
        tasks = {}
        for d, dtype in DTYPES.items():
            gen = torch.Generator().manual_seed(7)  # the same values in both dtypes
            for (n, p), task in layer_tasks(layer, configs, gen, dtype).items():
                tasks[f"{d}|{n}|{p}"] = task
        with num_threads(args.threads):
            times = interleaved_times(tasks, args.repeats, args.warmup)
        row = {"layer": layer["name"], "c_in": layer["c_in"], "c_out": layer["c_out"], "seconds": {}}
        for key, stats in times.items():
            d, n, p = key.split("|")
            row["seconds"].setdefault(d, {}).setdefault(p, {})[n] = stats["median_s"]
            totals[d][p][n] += stats["median_s"]
        rows.append(row)
        bar.update(1)
    speedup = {n: {p: totals["float32"][p][n] / totals["bfloat16"][p][n] for p in PASSES} for n in configs}
    return {"model": workload.name, "layers": rows, "total_seconds": totals, "bf16_speedup": speedup}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_round_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    add_output_arguments(parser, "bf16_cpu")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 3)
    check_round_arguments(parser, args)
    out = output_dir(args, "bf16_cpu")
    report = {"benchmark": "bf16_cpu", "description": __doc__, "machine": machine_info(),
              "cpu_bf16_dot": bool(ops.cpu_bf16_dot()), "threads": args.threads,
              "repeats": args.repeats, "warmup": args.warmup, "target_speedup": 1.6,
              "load_before": load_average(), "busy_before": busy_processes()}
    workload = minkunet_workload(0.5)
    layers = record_layers(workload.ours.eval(), workload.ours_input("cpu"))
    with tqdm(total=len(layers), desc="layers", unit="layer", file=sys.stderr) as bar:
        report.update(run(workload, layers, args, bar))
    report["load_after"] = load_average()
    write_json(os.path.join(out, "bf16_cpu.json"), report)
    print_table(report)
    plot(report, os.path.join(out, "bf16_cpu.png"))
    print(f"\nwrote {out}/bf16_cpu.json and .png")
    return 0


def print_table(report) -> None:
    print(f"\n{report['model']}: ms summed over its conv layers, float32 / bfloat16 and bf16's speed-up "
          f"({report['threads']} threads; bf16 dot kernels: {report['cpu_bf16_dot']})")
    print(f"{'dataflow':<34}" + "".join(f"{p:>26}" for p in PASSES))
    for n, by_pass in report["bf16_speedup"].items():
        cells = [f"{report['total_seconds']['float32'][p][n] * 1e3:7.1f} / "
                 f"{report['total_seconds']['bfloat16'][p][n] * 1e3:6.1f} ({by_pass[p]:4.2f}x)" for p in PASSES]
        print(f"{n:<34}" + "".join(f"{c:>26}" for c in cells))


def plot(report, path) -> None:
    plt = pyplot()
    if plt is None:
        return
    names = list(report["bf16_speedup"])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.axhline(report["target_speedup"], color="k", linestyle="--", linewidth=1, label="target")
    grouped_bars(ax, PASSES, {n: [report["bf16_speedup"][n][p] for p in PASSES] for n in names},
                 "bf16 speed-up over float32", f"{report['model']}, {report['threads']} threads")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
