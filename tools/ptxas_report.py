#!/usr/bin/env python3
"""Reads ptxas' resource reports (nvcc -Xptxas -v) and checks every compiled kernel.

    python tools/ptxas_report.py REPORT... [--group tile|none] [--markdown FILE]

Each REPORT holds the stderr of one nvcc -Xptxas -v compile (any number of -gencode targets);
its file name, minus a trailing ".ptxas", names the source in the table. For every kernel and
device function on every architecture it reads registers, static shared memory, stack frame and
spill bytes, prints one table, and exits 1 when any of them
- spills (spill stores or loads above 0 bytes),
- keeps a stack frame (local memory: a spill by another name, or a register array indexed at run
  time), or
- uses more static shared memory than a block may have (48 KiB on every architecture; the
  kernels use no dynamic shared memory),
or when a report holds no kernel at all (a compile that reported nothing checks nothing).

Rows: one per kernel template and variant (for the generated kernels the tile-table tag, e.g.
f16_mma_m128n128k32), the worst case over its instantiations (vector or element loads, output
type), `--group none` one per instantiation. Cells: registers / shared KiB / spill bytes.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

# Static shared memory per block: 48 KiB on every architecture (more needs dynamic shared memory
# and an opt-in attribute, which these kernels do not use).
STATIC_SHARED_LIMIT = 48 * 1024

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
PROPERTIES = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")

CTYPES = {"__half": "f16", "__nv_bfloat16": "bf16", "float": "f32", "double": "f64"}
MATHS = {"MmaHalf": "mma", "MmaTF32": "tf32", "Simt": "simt"}


@dataclass
class Resources:
    source: str
    arch: str
    mangled: str
    entry: bool = False
    registers: int = 0
    shared: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    label: Tuple[str, str, str] = ("", "", "")  # kernel, variant, instantiation details

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    def problems(self) -> List[str]:
        found = []
        if self.spills:
            found.append(f"spills {self.spill_stores} bytes stored / {self.spill_loads} loaded")
        if self.stack:
            found.append(f"keeps a {self.stack}-byte stack frame (local memory)")
        if self.shared > STATIC_SHARED_LIMIT:
            found.append(f"uses {self.shared} bytes of static shared memory (limit {STATIC_SHARED_LIMIT})")
        return found


def parse_report(text: str, source: str) -> List[Resources]:
    """Every function of one compile's report, per architecture, in report order."""
    records: Dict[Tuple[str, str], Resources] = {}
    arch: Optional[str] = None
    current: Optional[Resources] = None  # the function the next figures belong to

    def record(name: str) -> Resources:
        key = (name, arch or "?")
        if key not in records:
            records[key] = Resources(source, arch or "?", name)
        return records[key]

    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            arch = m.group(2)
            current = record(m.group(1))
            current.entry = True
            continue
        m = PROPERTIES.search(line)
        if m:
            current = record(m.group(1))
            continue
        m = FRAME.search(line)
        if m and current is not None:
            current.stack, current.spill_stores, current.spill_loads = (int(g) for g in m.groups())
            continue
        m = USED.search(line)
        if m and current is not None:
            current.registers = int(m.group(1))
            s = SMEM.search(line)
            current.shared = int(s.group(1)) if s else 0
    return list(records.values())


def demangle(names: Iterable[str]) -> Dict[str, str]:
    """Mangled -> demangled names through c++filt when it is installed (else unchanged)."""
    names = sorted(set(names))
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not names or tool is None:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def split_top_level(args: str) -> List[str]:
    """Template arguments split at the commas outside nested <...>."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(args):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(args[start:i].strip())
            start = i + 1
    parts.append(args[start:].strip())
    return [p for p in parts if p]


def label_of(demangled: str) -> Tuple[str, str, str]:
    """(kernel, variant, details): for a kernel over a tile config, e.g. ("igemm::forward_kernel",
    "f16_mma_m128n128k32", "vector loads, out f16"); for others the template arguments."""
    name = demangled
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i in range(len(name) - 1, -1, -1):  # drop the parameter list: the last top-level "(...)"
        if name[i] == ")":
            depth += 1
        elif name[i] == "(":
            depth -= 1
            if depth == 0:
                name = name[:i]
                break
    name = name.replace("torchsparse_pp::", "").replace("(anonymous namespace)::", "")
    if "<" not in name:
        return name, "", ""
    kernel, args = name[:name.index("<")], name[name.index("<") + 1:name.rindex(">")]
    config = re.search(r"Config<(.*)>", args)
    if config is None:
        return kernel, "<" + ", ".join(split_top_level(args)) + ">", ""
    parts = split_top_level(config.group(1))
    math = next((MATHS[m] for p in parts for m in MATHS if re.search(rf"\b{m}<", p)), "?")
    plain = [p for p in parts if "<" not in p]  # T, M, N, K, WIDE[, Out]
    ctype, m, n, k, wide = plain[:5]
    variant = f"{CTYPES.get(ctype, ctype)}_{math}_m{m}n{n}k{k}"
    details = ["vector loads" if wide == "true" else "element loads"]
    if len(plain) > 5:
        details.append(f"out {CTYPES.get(plain[5], plain[5])}")
    return kernel, variant, ", ".join(details)


def cell(rows: List[Resources]) -> str:
    if not rows:
        return "-"
    regs = max(r.registers for r in rows)
    shared = max(r.shared for r in rows)
    spills = sum(r.spills for r in rows)
    text = f"{regs} / {shared / 1024:.1f} / {spills}"
    return text + (" (stack)" if any(r.stack for r in rows) else "")


def table(records: List[Resources], group: str) -> List[List[str]]:
    archs = sorted({r.arch for r in records})
    rows: Dict[Tuple[str, ...], Dict[str, List[Resources]]] = {}
    for r in records:
        kernel, variant, details = r.label
        key = (kernel, variant) if group == "tile" else (kernel, variant, details)
        rows.setdefault(key, {}).setdefault(r.arch, []).append(r)
    head = ["kernel", "variant"] + (["instantiation"] if group == "none" else ["count"]) + archs
    body = []
    for key in sorted(rows):
        per_arch = rows[key]
        count = max(len(v) for v in per_arch.values())
        body.append(list(key[:2]) + ([key[2]] if group == "none" else [str(count)]) +
                    [cell(per_arch.get(a, [])) for a in archs])
    return [head] + body


def render_text(rows: List[List[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def render_markdown(rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    for r in rows[1:]:
        lines.append("| " + " | ".join(f"`{c}`" if i == 0 else c for i, c in enumerate(r)) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", help="files holding nvcc -Xptxas -v output, one per source")
    parser.add_argument("--group", choices=("tile", "none"), default="tile",
                        help="one row per kernel and tile (worst case over its instantiations), or per instantiation")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as markdown")
    args = parser.parse_args(argv)

    records, empty = [], []
    for path in args.reports:
        source = os.path.basename(path)
        source = source[:-len(".ptxas")] if source.endswith(".ptxas") else source
        with open(path) as f:
            found = parse_report(f.read(), source)
        if not any(r.entry for r in found):
            empty.append(source)
        records.extend(found)
    names = demangle(r.mangled for r in records)
    for r in records:
        r.label = label_of(names[r.mangled])

    rows = table(records, args.group)
    print("registers / static shared KiB / spill bytes, worst case per row:")
    print(render_text(rows))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(render_markdown(rows))

    failures = [(r, p) for r in records for p in r.problems()]
    for r, problem in failures:
        kernel, variant, details = r.label
        print(f"FAIL {r.arch} {kernel} {variant} {details} ({r.source}): {problem}", file=sys.stderr)
    for source in empty:
        print(f"FAIL {source}: the report lists no kernel (was it compiled with -Xptxas -v?)", file=sys.stderr)
    kernels = sum(r.entry for r in records)
    print(f"{kernels} kernels over {len({r.arch for r in records})} architectures: "
          f"{len(failures)} problems, {len(empty)} empty reports")
    return 1 if failures or empty else 0


if __name__ == "__main__":
    sys.exit(main())
