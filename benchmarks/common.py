"""Shared helpers for the benchmarks: workloads, timing, thread control, machine info, and where
results go (a new benchmarks/out/<name>-<time>/ unless --out; the published benchmarks/results/
only with --publish)."""
import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch


def lidar_batch(beams: int, voxel: float, seeds: Sequence[int]) -> Tuple[torch.Tensor, List[int]]:
    """Generated scans (one per seed, one batch entry each), every scan shifted so its points are
    non-negative, voxelised at ``voxel`` metres. Returns (int32 coords [N, 4] sorted by
    (batch, x, y, z), spatial_shape [x, y, z] covering all of them)."""
    from torchsparse_pp.data.synthetic import generate_scan
    from torchsparse_pp.utils.quantize import sparse_quantize

    rows = []
    for b, seed in enumerate(seeds):
        xyz = generate_scan(beams, seed=seed)["points"][:, :3].astype(np.float64)
        xyz -= xyz.min(0)
        voxels = torch.from_numpy(sparse_quantize(xyz, voxel))
        rows.append(torch.cat([torch.full((len(voxels), 1), b, dtype=torch.int32), voxels], 1))
    coords = torch.cat(rows)
    return coords, (coords[:, 1:].amax(0) + 1).tolist()


@contextlib.contextmanager
def num_threads(n: int):
    """Runs the block with torch (ATen/OpenMP/MKL) at ``n`` threads, then restores the count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1,
                setup: Optional[Callable[[], object]] = None) -> Dict[str, float]:
    """Median (and min / max) wall time of ``fn`` over ``repeats`` runs after ``warmup`` runs.

    With ``setup``, ``fn`` receives setup()'s result, and setup is not timed."""
    times = []
    for i in range(warmup + repeats):
        arg = setup() if setup is not None else None
        start = time.perf_counter()
        fn(arg) if setup is not None else fn()
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "repeats": repeats}


def mm_rates(threads: int, n: int = 2048, repeats: int = 5,
             dtypes: Sequence[str] = ("float32", "bfloat16")) -> Dict[str, float]:
    """FLOP/s of torch.mm on n x n matrices (best of ``repeats``), per dtype of ``dtypes``
    ("float32", "bfloat16"; float32 first), at ``threads`` threads. Where
    ATen's bfloat16 GEMM is its reference loop (no oneDNN bf16: AVX2 CPUs, ~1 GFLOP/s), the
    bfloat16 ceiling is the float32 rate: bf16 operands are multiplied in float32 there."""
    operands = mm_operands(n, dtypes)
    out = {}
    with num_threads(threads):
        for name in dtypes:
            if name not in operands:
                out[name] = out["float32"]
                continue
            a, b = operands[name]
            out[name] = 2.0 * n ** 3 / median_time(lambda: a @ b, repeats)["min_s"]
    return out


def mm_operands(n: int, dtypes: Sequence[str]) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """Random n x n operands per dtype that has its own GEMM: bfloat16 only where ATen runs it
    through oneDNN (elsewhere its rate is taken to be float32's, see mm_rates)."""
    from torchsparse_pp.utils import cpu_bf16

    out = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        if dtype == torch.bfloat16 and not cpu_bf16.ONEDNN_BF16:
            continue
        out[name] = (torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype))
    return out


def mm_tasks(threads: int, n: int = 2048, calls: int = 3,
             dtypes: Sequence[str] = ("float32", "bfloat16")) -> Tuple[Dict[str, Tuple[Callable, None]], float]:
    """interleaved_times tasks "torch.mm-<dtype>" that run ``calls`` n x n torch.mm at ``threads``
    threads, and the FLOPs of one task call: timed round-robin with the workloads they are the
    roofline of, so that the machine's drift hits both alike (mm_rates_from turns their times
    into rates). bfloat16 is left out where ATen has no oneDNN bf16 GEMM (see mm_rates)."""
    tasks = {}
    for name, (a, b) in mm_operands(n, dtypes).items():
        def run(a=a, b=b):
            with num_threads(threads):
                for _ in range(calls):
                    a @ b
        tasks[f"torch.mm-{name}"] = (run, None)
    return tasks, calls * 2.0 * n ** 3


def mm_rates_from(times: Dict[str, Dict[str, object]], flops: float,
                  dtypes: Sequence[str] = ("float32", "bfloat16")) -> Dict[str, float]:
    """FLOP/s per dtype from the median times of mm_tasks' tasks (bfloat16 without its own task:
    the float32 rate, as in mm_rates)."""
    out = {}
    for name in dtypes:
        task = times.get(f"torch.mm-{name}")
        out[name] = flops / task["median_s"] if task is not None else out["float32"]
    return out


def interleaved_times(tasks: Dict[str, Tuple[Callable, Optional[Callable[[], object]]]], repeats: int,
                      warmup: int = 1, on_round: Optional[Callable[[], object]] = None
                      ) -> Dict[str, Dict[str, object]]:
    """Times several tasks round-robin: each round runs every task once, in order, so slow drift
    and bursts of other load on the machine hit all of them alike.

    ``tasks`` maps a name to (fn, setup): setup (untimed, may be None) makes fn's argument. When
    fn returns a dict of named sub-times (seconds), their medians are reported as "split_median_s".
    ``on_round`` (optional, untimed) is called after every round, e.g. to advance a progress bar.
    Returns per task the median / min / max wall time over ``repeats`` rounds after ``warmup``."""
    times: Dict[str, List[float]] = {name: [] for name in tasks}
    splits: Dict[str, Dict[str, List[float]]] = {name: {} for name in tasks}
    for i in range(warmup + repeats):
        if i > 0 and on_round is not None:
            on_round()
        for name, (fn, setup) in tasks.items():
            arg = setup() if setup is not None else None
            start = time.perf_counter()
            result = fn(arg) if setup is not None else fn()
            elapsed = time.perf_counter() - start
            if i < warmup:
                continue
            times[name].append(elapsed)
            if isinstance(result, dict):
                for part, seconds in result.items():
                    splits[name].setdefault(part, []).append(seconds)
    if on_round is not None:
        on_round()
    out = {}
    for name, values in times.items():
        out[name] = {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values),
                     "repeats": repeats}
        if splits[name]:
            out[name]["split_median_s"] = {k: statistics.median(v) for k, v in splits[name].items()}
    return out


def cpu_model() -> str:
    from torchsparse_pp.tune.identity import device_name
    return device_name(torch.device("cpu"))


def git_revision(root: str) -> Optional[str]:
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def load_average() -> Optional[List[float]]:
    """1, 5 and 15 minute load averages (other work on the machine skews CPU timings)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def busy_processes(limit: int = 5) -> List[str]:
    """Other processes using CPU right now (by ps), so a noisy run can be recognised."""
    try:
        out = subprocess.run(["ps", "-eo", "pid,pcpu,comm", "--sort=-pcpu", "--no-headers"],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return []
    me = os.getpid()
    rows = [line.split(None, 2) for line in out]
    return [" ".join(r) for r in rows if len(r) == 3 and int(r[0]) != me and float(r[1]) >= 5.0][:limit]


def machine_info() -> Dict[str, object]:
    import torchsparse_pp
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # ATen's vector ISA: AVX2, AVX512, ...
        "torch_default_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_parallel_backend": next((line.split(":", 1)[1].strip()
                                        for line in torch.__config__.parallel_info().splitlines()
                                        if line.startswith("ATen parallel backend")), None),
        "torchsparse_pp": getattr(torchsparse_pp, "__version__", None),
        "loadavg_at_start": load_average(),
        "busy_processes_at_start": busy_processes(),
        "git_revision": git_revision(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    }
    try:
        import spconv
        info["spconv"] = spconv.__version__
    except ImportError:
        info["spconv"] = None
    return info


def gflops(macs: float, seconds: float) -> float:
    return 2.0 * macs / seconds / 1e9


def coord_sort_key(coords: torch.Tensor) -> torch.Tensor:
    """int64 key that orders int32 (batch, x, y, z) rows lexicographically (each field < 2^20)."""
    c = coords.long()
    return ((c[:, 0] * (1 << 20) + c[:, 1]) * (1 << 20) + c[:, 2]) * (1 << 20) + c[:, 3]


def sorted_rows(coords: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """``feats`` with its rows ordered by their coordinates, so outputs of two libraries (which
    may order rows differently) can be compared row by row."""
    return feats[torch.argsort(coord_sort_key(coords))]


def same_coord_set(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(torch.sort(coord_sort_key(a)).values,
                                              torch.sort(coord_sort_key(b)).values)


def rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (in float64)."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


# ---------------------------------------------------------------------------------------------
# Output directories: a run never overwrites the published results unless asked to.
BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
PUBLISHED_DIR = os.path.join(BENCH_DIR, "results")   # what docs/benchmarks.md cites
SCRATCH_DIR = os.path.join(BENCH_DIR, "out")         # git-ignored


def add_round_arguments(parser: argparse.ArgumentParser, repeats: int = 7) -> None:
    """--repeats / --warmup (round-robin rounds) and --threads (default: up to the 2 cores)."""
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))


def check_round_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.repeats < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1, --warmup >= 0")


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (with a note) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return None
    return plt


def grouped_bars(ax, groups: Sequence[str], series: Dict[str, Sequence[float]], ylabel: str, title: str) -> None:
    """One bar per series within each group (x axis: the groups), with a legend."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(groups))], list(values), width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], list(groups))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """--out DIR / --publish, with help that says where the results go by default."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", default=None,
                       help=f"directory for the results (default: a new benchmarks/out/{name}-<time>/, git-ignored)")
    where.add_argument("--publish", action="store_true",
                       help="write the published results in benchmarks/results/ (replacing them; not with --quick)")


def _usage_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def output_dir(args: argparse.Namespace, name: str) -> str:
    """The directory this run writes to, created and checked before any timing starts:
    --out, benchmarks/results/ with --publish, else a new benchmarks/out/<name>-<time>/."""
    if getattr(args, "publish", False) and getattr(args, "quick", False):
        _usage_error("--publish with --quick: quick results are not published (leave one out)")
    if getattr(args, "publish", False):
        path = PUBLISHED_DIR
    elif getattr(args, "out", None):
        path = args.out
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path, n = os.path.join(SCRATCH_DIR, f"{name}-{stamp}"), 1
        while os.path.exists(path):
            n += 1
            path = os.path.join(SCRATCH_DIR, f"{name}-{stamp}-{n}")
    if os.path.exists(path) and not os.path.isdir(path):
        _usage_error(f"output directory {path!r} is a file")
    os.makedirs(path, exist_ok=True)
    if not os.access(path, os.W_OK):
        _usage_error(f"cannot write in {path!r}")
    print(f"results go to {path}", flush=True)
    return path


def write_atomic(path: str, write: Callable[[str], Any]) -> str:
    """``write(tmp)`` then rename to ``path``: a result file is whole or absent, never half."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_json(path: str, data: Any, **kwargs) -> str:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, **kwargs)
    return write_atomic(path, write)


def save_figure(fig, path: str, **kwargs) -> str:
    """fig.savefig through a temp file (the format from ``path``'s extension)."""
    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format=fmt, **kwargs))
