"""Kept freed memory against glibc's default trimming: what torchsparse_pp's import-time malloc
settings (torchsparse_pp/utils/malloc.py) change in a model's inference and training step.

The setting is per process, so each round starts one process per setting (the default,
TSPP_KEEP_FREED_MEMORY=0 for glibc's own thresholds, and the default plus MALLOC_MMAP_MAX_=0,
which keeps buffers above 32 MiB too), alternating; each process warms up once and
times --calls calls per mode, counting the minor page faults of each call. The report pools the
calls of all rounds per setting: median ms, median faults per call, peak RSS, and the ratio.

Output: malloc_cpu.json and malloc_cpu.png in a new benchmarks/out/malloc_cpu-<time>/
(git-ignored), --out DIR, or benchmarks/results/ with --publish.

Usage: python benchmarks/malloc_cpu.py [--models minkunet0.5 ...] [--rounds N] [--calls N]
       [--threads T] [--quick] [--out DIR | --publish]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, load_average, machine_info, output_dir, pyplot,  # noqa: E402
                    save_figure, write_json)

SETTINGS = {"kept (default)": {}, "glibc default": {"TSPP_KEEP_FREED_MEMORY": "0"},
            "kept + MALLOC_MMAP_MAX_=0": {"MALLOC_MMAP_MAX_": "0"}}
MODES = ("inference", "training")


def child(model: str, calls: int, threads: int) -> dict:
    """Runs in the timed process: per mode, ``calls`` timed calls after one warm-up."""
    from models import WORKLOADS
    import torchsparse_pp

    torch.set_num_threads(threads)
    w = WORKLOADS[model]()
    net = w.ours
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)

    def infer(x):
        with torch.no_grad():
            w.ours_output(net(x))

    def train(x):
        optimizer.zero_grad(set_to_none=True)
        w.loss(w.ours_output(net(x))[1]).backward()
        optimizer.step()
    out = {"malloc_settings": torchsparse_pp.utils.malloc_settings()}
    for mode, fn in (("inference", infer), ("training", train)):
        net.train(mode == "training")
        fn(w.ours_input("cpu"))
        seconds, faults = [], []
        for _ in range(calls):
            x = w.ours_input("cpu")
            f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            fn(x)
            seconds.append(time.perf_counter() - t0)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        out[mode] = {"seconds": seconds, "faults": faults}
    out["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run_child(model: str, setting: str, calls: int, threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TSPP_KEEP_FREED_MEMORY" and not k.startswith("MALLOC_")}
    env.update(SETTINGS[setting])
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model, "--calls", str(calls),
           "--threads", str(threads)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{setting} run of {model} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(runs) -> dict:
    out = {}
    for setting, results in runs.items():
        row = {"max_rss_mib": max(r["max_rss_mib"] for r in results),
               "malloc_settings": results[0]["malloc_settings"]}
        for mode in MODES:
            seconds = [s for r in results for s in r[mode]["seconds"]]
            faults = [f for r in results for f in r[mode]["faults"]]
            row[mode] = {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
                         "median_faults": statistics.median(faults), "calls": len(seconds)}
        out[setting] = row
    default = out["glibc default"]
    for setting, row in out.items():
        for mode in MODES:
            row[mode]["speedup_over_glibc_default"] = default[mode]["median_s"] / row[mode]["median_s"]
    return out


def plot(report, path) -> None:
    plt = pyplot()
    if plt is None:
        return
    models = list(report)
    fig, axes = plt.subplots(1, len(MODES), figsize=(5 * len(MODES), 3.5))
    for ax, mode in zip(axes, MODES):
        for i, setting in enumerate(SETTINGS):
            ms = [report[m][setting][mode]["median_s"] * 1e3 for m in models]
            ax.bar([j + 0.27 * i for j in range(len(models))], ms, width=0.27, label=setting)
        ax.set_xticks([j + 0.4 for j in range(len(models))], models)
        ax.set_ylabel("ms per call (median)")
        ax.set_title(mode)
    axes[0].legend()
    fig.tight_layout()
    save_figure(fig, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minkunet0.5", "minkunet1.0", "centerpoint"],
                        choices=["minkunet0.5", "minkunet1.0", "centerpoint"])
    parser.add_argument("--rounds", type=int, default=3, help="processes per setting and model")
    parser.add_argument("--calls", type=int, default=4, help="timed calls per mode in each process")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="MinkUNet 0.5x, 1 round of 2 calls")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_output_arguments(parser, "malloc_cpu")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1 or args.threads < 1:
        parser.error("--rounds, --calls and --threads must be >= 1")
    if args.child is not None:
        print(json.dumps(child(args.child, args.calls, args.threads)))
        return 0
    if args.quick:
        args.models, args.rounds, args.calls = ["minkunet0.5"], 1, 2
    out_dir = output_dir(args, "malloc_cpu")
    data = {"machine": machine_info(), "load_average_before": load_average(), "threads": args.threads,
            "rounds": args.rounds, "calls": args.calls, "models": {}}
    with tqdm(total=len(args.models) * args.rounds * len(SETTINGS), unit="process", file=sys.stderr) as bar:
        for model in args.models:
            runs = {s: [] for s in SETTINGS}
            for _ in range(args.rounds):
                for setting in SETTINGS:
                    bar.set_description(f"{model}: {setting}")
                    runs[setting].append(run_child(model, setting, args.calls, args.threads))
                    bar.update()
            data["models"][model] = summarize(runs)
    data["load_average_after"] = load_average()
    print(f"\nms per call, median over {args.rounds} processes x {args.calls} calls ({args.threads} threads); "
          "minor page faults per call in brackets")
    for model, report in data["models"].items():
        for mode in MODES:
            cells = [f"{s} {r[mode]['median_s'] * 1e3:7.1f} ({r[mode]['median_faults']:6.0f}, "
                     f"{r[mode]['speedup_over_glibc_default']:.3f}x)" for s, r in report.items()]
            print(f"{model:12s} {mode:9s} " + "  ".join(cells))
        print(f"{model:12s} peak RSS MiB: " + ", ".join(f"{s} {r['max_rss_mib']:.0f}" for s, r in report.items()))
    write_json(os.path.join(out_dir, "malloc_cpu.json"), data)
    plot(data["models"], os.path.join(out_dir, "malloc_cpu.png"))
    print(f"wrote {out_dir}/malloc_cpu.json and malloc_cpu.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
