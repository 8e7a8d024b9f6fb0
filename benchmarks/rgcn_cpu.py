"""R-GCN layers on the CPU: torchsparse_pp.graph.RGCNConv vs torch_geometric's RGCNConv and
FastRGCNConv and a plain torch loop, forward and a training step, time and peak memory, JSON + PNG.

Graphs: torchsparse_pp.graph.datasets.generate with the AIFB, MUTAG (and BGS) statistics (nodes,
relations and edges incl. inverses; Zipf relation sizes, power-law degrees). One layer, C input
= C output channels (C = 16 and 64), aggr 'mean', root weight and bias, float32, random node
features; all contenders load one state dict.

Contenders:
- ours: torchsparse_pp.graph.RGCNConv with its default dataflow, the relational map built once
  and cached (as a model reuses it every epoch; its build time is reported beside);
- pyg: torch_geometric.nn.RGCNConv (a masked edge list and a propagate per relation);
- pyg_fast: torch_geometric.nn.FastRGCNConv (one weight matrix per edge: E x C x C floats);
- ours[gather_scatter], ours[implicit_gemm]: ours with the other dataflows (time only), the
  measurement behind the default (fetch_on_demand);
- loop: plain torch over the edges sorted by relation once (the same preprocessing as ours):
  per relation gather x[src], mm with W_r, scale by 1/|N_r(i)|, index_add_ into the output.
Timed round-robin (benchmarks/common.py interleaved_times), median of --repeats after --warmup.
A training step is forward, loss = sum of squares of the output, backward (all parameter and
input gradients). Before timing, every contender's forward is checked against ours (relative
max error < 1e-4).

Peak memory: each contender runs in a subprocess of its own; after its inputs and layer are made
and one warm-up call, the kernel's peak-RSS counter is reset (/proc/self/clear_refs) and the
reported figure is VmHWM minus the RSS before two measured calls (steady state, as in training
epochs). The probes run with glibc's mmap threshold fixed at 64 KiB (PROBE_MALLOC), so freed
buffers leave the process and the RSS follows the live tensors. Ours' relational map is built before, and its build's own peak increase is reported
beside (map_build_peak_increase_mib). Contenders that
would not fit or finish in time are skipped and listed (BGS: pyg ~90 s per forward; pyg_fast
needs E x C x C floats).

--quick: the graphs at 2 % of their size, C = 16, 1 round, no warmup (a test of the script).

Usage: python benchmarks/rgcn_cpu.py [--graphs AIFB,MUTAG,BGS] [--channels 16,64] [--repeats N]
       [--warmup N] [--threads T] [--quick] [--out DIR | --publish]
"""
import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (add_output_arguments, add_round_arguments, check_round_arguments, interleaved_times,  # noqa: E402
                    load_average, machine_info, num_threads, output_dir, pyplot, save_figure, write_json)

from torchsparse_pp.graph import RGCNConv, relational_map  # noqa: E402
from torchsparse_pp.graph.datasets import generate  # noqa: E402

GRAPHS = ("AIFB", "MUTAG", "BGS")
CONTENDERS = ("ours", "pyg", "pyg_fast", "loop")
# Ours with the other dataflows, timed beside the default (the measurement behind it; no memory probe).
OTHER_DATAFLOWS = ("gather_scatter", "implicit_gemm")
MODES = ("forward", "train")
QUICK_SCALE = 0.02
SEED = 0
# The probes' glibc malloc maps every buffer over 64 KiB on its own and unmaps it when freed (a fixed
# mmap threshold; no retained heap, and torchsparse_pp leaves malloc as the environment sets it), so
# the RSS follows the live tensors of each contender rather than what an allocator kept.
PROBE_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
# pyg_fast holds E x C x C float32 weights (and their gradient in training): skip above this.
FAST_BYTES_LIMIT = 2 << 30


class PlainLoop(torch.nn.Module):
    """R-GCN as plain torch ops over edges sorted by relation once (mean aggregation)."""

    def __init__(self, layer: RGCNConv, edge_index, edge_type, num_nodes):
        super().__init__()
        self.weight, self.root, self.bias = layer.weight, layer.root, layer.bias
        order = torch.sort(edge_type, stable=True).indices
        self.src, self.dst = edge_index[0][order], edge_index[1][order]
        rel = edge_type[order]
        key = rel * num_nodes + self.dst
        _, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
        self.scale = (1.0 / counts.float())[inverse][:, None]
        self.bounds = torch.cat([torch.zeros(1, dtype=torch.int64),
                                 torch.bincount(rel, minlength=layer.num_relations).cumsum(0)]).tolist()

    def forward(self, x):
        out = x @ self.root + self.bias
        for r in range(len(self.bounds) - 1):
            a, b = self.bounds[r], self.bounds[r + 1]
            if a == b:
                continue
            rows = x[self.src[a:b]] @ self.weight[r]
            out = out.index_add(0, self.dst[a:b], rows * self.scale[a:b])
        return out


def skipped_contenders(name: str, graph, channels: int) -> Dict[str, str]:
    skip = {}
    if name == "BGS":
        skip["pyg"] = "torch_geometric RGCNConv takes ~90 s per forward on BGS (a masked edge list per relation)"
    if graph.num_edges * channels * channels * 4 * 2 > FAST_BYTES_LIMIT:
        skip["pyg_fast"] = (f"FastRGCNConv would hold {graph.num_edges} x {channels} x {channels} float32 per-edge "
                            f"weights (and their gradient): over {FAST_BYTES_LIMIT >> 30} GiB")
    return skip


class OnGraph(torch.nn.Module):
    """A graph layer called as layer(x) on fixed edges."""

    def __init__(self, layer, edge_index, edge_type):
        super().__init__()
        self.layer, self.edge_index, self.edge_type = layer, edge_index, edge_type

    def forward(self, x):
        return self.layer(x, self.edge_index, self.edge_type)


def make_layers(graph, channels: int, contenders: List[str]):
    """{contender: module(x)} over one state dict, and ours."""
    from torch_geometric.nn import FastRGCNConv
    from torch_geometric.nn import RGCNConv as PygRGCNConv
    torch.manual_seed(SEED)
    ours = RGCNConv(channels, channels, graph.num_relations)
    torch.nn.init.normal_(ours.bias)
    ei, et = graph.edge_index, graph.edge_type
    layers = {}
    for name in contenders:
        if name == "ours":
            layers[name] = OnGraph(ours, ei, et)
        elif name.startswith("ours["):
            m = RGCNConv(channels, channels, graph.num_relations, dataflow=name[5:-1])
            m.load_state_dict(ours.state_dict(), strict=True)
            layers[name] = OnGraph(m, ei, et)
        elif name in ("pyg", "pyg_fast"):
            m = (PygRGCNConv if name == "pyg" else FastRGCNConv)(channels, channels, graph.num_relations)
            m.load_state_dict(ours.state_dict(), strict=True)
            layers[name] = OnGraph(m, ei, et)
        elif name == "loop":
            m = PlainLoop(ours, ei, et, graph.num_nodes)
            layers[name] = m
    return layers, ours


def features(graph, channels: int, requires_grad: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED + channels)
    return torch.randn(graph.num_nodes, channels, generator=g).requires_grad_(requires_grad)


def step(layer, x, mode: str):
    if mode == "forward":
        with torch.no_grad():
            return layer(x)
    # Gradients of the input and every parameter, returned rather than accumulated (as after
    # zero_grad(set_to_none=True)): each step allocates them anew, whatever the contender.
    out = layer(x)
    return torch.autograd.grad((out * out).sum(), [x] + list(layer.parameters()))


def build_graph(name: str, quick: bool):
    return generate(name, seed=SEED, scale=QUICK_SCALE if quick else 1.0)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    """Resets the kernel's peak-RSS counter (VmHWM) to the current RSS; returns that RSS (KiB)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS")


def memory_probe(name: str, channels: int, mode: str, contender: str, quick: bool) -> Dict[str, float]:
    """Run in a subprocess: peak RSS increase (MiB) of two calls of one contender after one
    warm-up call (ours: its relational map built and cached by then; the map's own build is
    measured first, as map_build_peak_increase_mib)."""
    graph = build_graph(name, quick)
    layers, ours = make_layers(graph, channels, [contender])
    layer = layers[contender]
    x = features(graph, channels, mode == "train")
    result = {}
    if contender == "ours":
        before = _reset_peak()
        ours.relational_map(graph.edge_index, graph.edge_type, graph.num_nodes, graph.num_nodes)
        result["map_build_peak_increase_mib"] = (_status_kib("VmHWM") - before) / 1024
    step(layer, x, mode)
    before = _reset_peak()
    for _ in range(2):
        step(layer, x, mode)
    peak = _status_kib("VmHWM")
    result.update(peak_increase_mib=(peak - before) / 1024, peak_rss_mib=peak / 1024, rss_before_mib=before / 1024)
    return result


def measured_memory(name, channels, mode, contender, quick, threads) -> Dict[str, float]:
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-probe", f"{name},{channels},{mode},{contender}",
           "--threads", str(threads)] + (["--quick"] if quick else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, **PROBE_MALLOC})
    if done.returncode != 0:
        raise RuntimeError(f"memory probe {cmd} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_graph(name: str, args) -> Dict[str, object]:
    graph = build_graph(name, args.quick)
    started = time.perf_counter()
    rmap = relational_map(graph.edge_index, graph.edge_type, graph.num_relations, graph.num_nodes)
    map_seconds = time.perf_counter() - started
    result = {"graph": name, "nodes": graph.num_nodes, "relations": graph.num_relations, "edges": graph.num_edges,
              "segments": rmap.num_segments, "map_build_s": map_seconds, "channels": {}}
    for channels in args.channel_list:
        skip = skipped_contenders(name, graph, channels)
        contenders = [c for c in CONTENDERS if c not in skip]
        variants = [f"ours[{d}]" for d in OTHER_DATAFLOWS]
        layers, _ = make_layers(graph, channels, contenders + variants)
        x_eval = features(graph, channels, False)
        with torch.no_grad():
            reference = layers["ours"](x_eval)
            errors = {c: float((layers[c](x_eval) - reference).abs().max() / reference.abs().max())
                      for c in contenders + variants if c != "ours"}
        bad = {c: e for c, e in errors.items() if not e < 1e-4}
        if bad:
            raise RuntimeError(f"{name} C={channels}: outputs differ from ours: {bad}")
        entry = {"skipped": skip, "max_rel_error_vs_ours": errors, "timings": {}, "memory": {}}
        for mode in MODES:
            x = features(graph, channels, mode == "train")
            tasks = {c: (lambda layer=layers[c]: step(layer, x, mode), None) for c in contenders + variants}
            entry["timings"][mode] = interleaved_times(tasks, args.repeats, args.warmup)
            entry["memory"][mode] = {c: measured_memory(name, channels, mode, c, args.quick, args.threads)
                                     for c in contenders}
            times = {c: v["median_s"] for c, v in entry["timings"][mode].items()}
            print(f"{name} C={channels} {mode}: " + ", ".join(f"{c} {t * 1e3:.1f} ms" for c, t in times.items()),
                  flush=True)
        entry["ratios"] = ratios(entry)
        result["channels"][str(channels)] = entry
    return result


def ratios(entry) -> Dict[str, Dict[str, float]]:
    """Per mode: speedup of ours over the faster PyG layer and over the loop; memory of ours
    over the smaller PyG peak increase."""
    out = {}
    for mode in MODES:
        t = {c: v["median_s"] for c, v in entry["timings"][mode].items()}
        mem = {c: v["peak_increase_mib"] for c, v in entry["memory"][mode].items()}
        pyg = [c for c in ("pyg", "pyg_fast") if c in t]
        r = {"vs_loop": t["loop"] / t["ours"]}
        if pyg:
            r["vs_faster_pyg"] = min(t[c] for c in pyg) / t["ours"]
            r["memory_vs_pyg"] = mem["ours"] / max(min(mem[c] for c in pyg), 1e-9)
        out[mode] = r
    return out


def plot(report, path) -> None:
    plt = pyplot()
    if plt is None:
        return
    groups = [(g["graph"], c) for g in report["graphs"] for c in g["channels"]]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = [("forward", "timings", "forward time (ms)"), ("train", "timings", "training step time (ms)"),
              ("train", "memory", "training step peak RSS increase (MiB)")]
    for ax, (mode, kind, label) in zip(axes, panels):
        width = 0.8 / len(CONTENDERS)
        for i, c in enumerate(CONTENDERS):
            values = []
            for g in report["graphs"]:
                for ch, entry in g["channels"].items():
                    v = entry[kind][mode].get(c)
                    values.append(np.nan if v is None else
                                  (v["median_s"] * 1e3 if kind == "timings" else v["peak_increase_mib"]))
            bars = ax.bar(np.arange(len(groups)) + i * width, values, width, label=c)
            ax.bar_label(bars, fmt="%.0f", fontsize=6, padding=1)
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, [f"{g} C={c}" for g, c in groups], fontsize=7)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    m = report["machine"]
    fig.suptitle(f"R-GCN layer on the CPU ({report['threads']} threads): torchsparse_pp vs torch_geometric "
                 f"{report['torch_geometric']} - {m['cpu_model']}, {m['date']}; missing bars: skipped (see JSON)"
                 + (" (--quick)" if report["quick"] else ""), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_round_arguments(parser, repeats=5)
    parser.add_argument("--graphs", default="AIFB,MUTAG", help=f"comma-separated subset of {', '.join(GRAPHS)}")
    parser.add_argument("--channels", default="16,64", help="comma-separated channel counts")
    parser.add_argument("--quick", action="store_true", help=f"graphs at {QUICK_SCALE:.0%} size, C = 16, 1 round")
    parser.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    add_output_arguments(parser, "rgcn_cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_probe:
        name, channels, mode, contender = args.memory_probe.split(",")
        print(json.dumps(memory_probe(name, int(channels), mode, contender, args.quick)))
        return 0
    names = [n for n in args.graphs.split(",") if n]
    if not names or any(n not in GRAPHS for n in names):
        parser.error(f"--graphs: choose from {', '.join(GRAPHS)}")
    try:
        args.channel_list = [int(c) for c in args.channels.split(",") if c]
    except ValueError:
        parser.error("--channels: comma-separated ints")
    if args.quick:
        args.repeats, args.warmup, args.channel_list = 1, 0, [16]
    check_round_arguments(parser, args)
    try:
        import torch_geometric
    except ImportError as err:
        parser.error(f"torch_geometric is required ({err}): pip install torch_geometric==2.8.1")
    out = output_dir(args, "rgcn_cpu")
    started = time.perf_counter()
    report = {"benchmark": "rgcn_cpu", "description": __doc__, "machine": machine_info(), "threads": args.threads,
              "repeats": args.repeats, "warmup": args.warmup, "quick": args.quick, "seed": SEED,
              "torch_geometric": torch_geometric.__version__, "graphs": []}
    with num_threads(args.threads):
        for name in names:
            report["graphs"].append(run_graph(name, args))
            write_json(os.path.join(out, "rgcn_cpu.json"), report)  # a run cut short keeps what it finished
    report["machine"]["loadavg_at_end"] = load_average()
    report["wall_seconds"] = time.perf_counter() - started
    write_json(os.path.join(out, "rgcn_cpu.json"), report)
    for g in report["graphs"]:
        for ch, entry in g["channels"].items():
            print(f"{g['graph']} C={ch}: " + "; ".join(
                f"{mode} " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()) for mode, r in entry["ratios"].items()))
    plot(report, os.path.join(out, "rgcn_cpu.png"))
    print(f"\nwrote {out}/rgcn_cpu.json and .png ({report['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
