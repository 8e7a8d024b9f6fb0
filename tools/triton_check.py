"""Ahead-of-time compile check of every Triton kernel instantiation, for every GPU target.

No GPU needed: triton.compile(ASTSource(...), target=GPUTarget(...)) builds PTX + cubin (NVIDIA)
or AMDGCN + hsaco (AMD) on the host. For every instantiation (torchsparse_pp.ops.triton.aot) and
target it prints one line: registers, shared memory, spill bytes; and fails (exit 1) on a
compile error, shared memory above the target's limit, or any spill on an NVIDIA target
(cuobjdump from the triton wheel reads STACK / LOCAL bytes from the cubin). AMD spills are
reported (VGPR / SGPR spill counts, scratch bytes), not failed.

    python tools/triton_check.py [--targets sm_80,sm_90,...] [--jobs N] [--markdown FILE] [--filter SUBSTR]

--markdown writes the condensed table (worst case per kernel and target over modes and tiles)
that docs/gpu.md carries.
"""
import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict

# Max dynamic shared memory per block (bytes) and warp size per target. sm_120 (consumer Blackwell)
# has the sm_86 / sm_89 limit; tiles that fit it fit every 8.x GPU.
TARGETS = {
    "sm_80": ("cuda", 80, 32, 166912),
    "sm_90": ("cuda", 90, 32, 232448),
    "sm_100": ("cuda", 100, 32, 232448),
    "sm_120": ("cuda", 120, 32, 101376),
    "gfx90a": ("hip", "gfx90a", 64, 65536),
    "gfx942": ("hip", "gfx942", 64, 65536),
}


def _cuobjdump():
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def _nvidia_resources(cubin: bytes):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    found = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text))
    return int(found.get("REG", -1)), int(found.get("STACK", 0)) + int(found.get("LOCAL", 0))


def _amd_resources(amdgcn: str):
    def field(name):
        m = re.search(rf"\.{name}:\s*(\d+)", amdgcn)
        return int(m.group(1)) if m else 0
    spills = field("vgpr_spill_count") + field("sgpr_spill_count")
    return field("vgpr_count"), spills, field("private_segment_fixed_size")


def compile_one(job):
    """(instantiation index, target name) -> result row."""
    index, target_name = job
    warnings.simplefilter("ignore")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from torchsparse_pp.ops.triton import aot
    inst = list(aot.instantiations())[index]
    backend, arch, warp, shared_limit = TARGETS[target_name]
    row = {"name": inst.name, "target": target_name, "ok": False}
    if inst.precision not in _allowed_precisions(backend, arch, warp):
        row.update(ok=True, skipped=f"{inst.precision} dots do not exist on {target_name}")
        return row
    started = time.perf_counter()
    try:
        compiled = triton.compile(ASTSource(inst.fn, inst.signature, inst.constexprs, inst.attrs),
                                  target=GPUTarget(backend, arch, warp),
                                  options={"num_warps": inst.num_warps, "num_stages": inst.num_stages})
    except Exception as err:  # a compile failure is a result to report, not a crash of the check
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return row
    row["seconds"] = time.perf_counter() - started
    row["shared"] = compiled.metadata.shared
    if backend == "cuda":
        row["registers"], row["spill_bytes"] = _nvidia_resources(compiled.asm["cubin"])
        row["spills"] = row["spill_bytes"]
    else:
        row["registers"], row["spills"], row["spill_bytes"] = _amd_resources(compiled.asm["amdgcn"])
    problems = []
    if row["shared"] > shared_limit:
        problems.append(f"shared {row['shared']} > {shared_limit}")
    if backend == "cuda" and row["spill_bytes"]:
        problems.append(f"{row['spill_bytes']} spill bytes")
    row["problems"] = problems
    row["ok"] = not problems
    return row


_PRECISIONS = {}


def _allowed_precisions(backend, arch, warp):
    key = (backend, arch)
    if key not in _PRECISIONS:
        from triton.backends.compiler import GPUTarget
        if backend == "cuda":
            from triton.backends.nvidia.compiler import CUDABackend as Backend
        else:
            from triton.backends.amd.compiler import HIPBackend as Backend
        _PRECISIONS[key] = tuple(Backend(GPUTarget(backend, arch, warp)).parse_options({}).allowed_dot_input_precisions)
    return _PRECISIONS[key]


def _line(row):
    if "skipped" in row:
        return f"{row['name']:<58} {row['target']:<7} skipped: {row['skipped']}"
    if "error" in row:
        return f"{row['name']:<58} {row['target']:<7} COMPILE ERROR: {row['error']}"
    status = "ok" if row["ok"] else "FAIL: " + "; ".join(row["problems"])
    return (f"{row['name']:<58} {row['target']:<7} regs {row['registers']:>3}  shared {row['shared']:>6}  "
            f"spill {row['spill_bytes']:>4}  {status}")


def markdown(rows, targets):
    """Worst case per kernel (variant) and target over modes and tiles: max registers / max
    shared KiB / total spill bytes (AMD: spill count)."""
    worst = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        if "registers" not in r:
            continue
        key = (r["name"].split("/")[0], r["target"])
        w = worst[key]
        w[0], w[1] = max(w[0], r["registers"]), max(w[1], r["shared"])
        w[2] += r["spill_bytes"] if r["target"].startswith("sm_") else r["spills"]
        w[3] += 1
    kernels = sorted({k for k, _ in worst})
    lines = ["| kernel | " + " | ".join(targets) + " |", "|---|" + "---|" * len(targets)]
    for k in kernels:
        cells = []
        for t in targets:
            regs, shared, spills, count = worst.get((k, t), (0, 0, 0, 0))
            cells.append(f"{regs} / {shared / 1024:.0f} / {spills} ({count})" if count else "-")
        lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, from {', '.join(TARGETS)}")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile processes")
    parser.add_argument("--filter", default="", help="only instantiations whose name contains this")
    parser.add_argument("--markdown", help="write the condensed table (worst case per kernel and target) here")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; choose from {list(TARGETS)}")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    warnings.simplefilter("ignore")
    import triton
    from torchsparse_pp.ops.triton import aot
    names = [inst.name for inst in aot.instantiations()]
    jobs = [(i, t) for t in targets for i, n in enumerate(names) if args.filter in n]
    if not jobs:
        parser.error(f"no instantiation matches --filter {args.filter!r}")
    print(f"[triton-check] triton {triton.__version__}: {len(jobs)} compiles ({len(set(i for i, _ in jobs))} "
          f"instantiations x {len(targets)} targets) on {args.jobs} processes", flush=True)
    started = time.perf_counter()
    rows = []
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for row in pool.imap(compile_one, jobs, chunksize=4):
            rows.append(row)
            print(_line(row), flush=True)
    failed = [r for r in rows if not r["ok"]]
    skipped = sum("skipped" in r for r in rows)
    print(f"[triton-check] {len(rows) - len(failed) - skipped} ok, {skipped} skipped, {len(failed)} failed in "
          f"{time.perf_counter() - started:.0f} s")
    for r in failed:
        print("[triton-check] FAILED " + _line(r))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, targets))
        print(f"[triton-check] table written to {args.markdown}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
