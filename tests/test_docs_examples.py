"""Every ```python block of README.md and docs/*.md runs as written, outside the repository.

A block's info string says how it runs:

- ```python            starts a program: a fresh Python process;
- ```python continued  is appended to the program before it (the same process, the same names);
- ```python fragment   uses names it does not define (the reader's model, data): compiled only;
- ```python long       starts a program that takes minutes: compiled only, run with TSPP_DOCS_LONG=1.
  docs/compile.md's are long: inductor compiles MinkUNet's inference and training graphs, 2-5
  minutes on 2 cores from a cold cache; tests/test_compile.py covers the same calls on small models.

The programs of one file run in order, in one temporary directory (not the repository root), so a
block may read what an earlier program of its page wrote there (docs/compile.md loads the program
that its export block saved). Each program has PROGRAM_SECONDS; blocks that train use tiny
settings to stay well under it.
"""
import glob
import os
import re
import subprocess
import sys
from typing import List, NamedTuple

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", flags=re.S | re.M)
KINDS = ("", "continued", "fragment", "long")
RUN_LONG = os.environ.get("TSPP_DOCS_LONG") == "1"
PROGRAM_SECONDS = 240
LONG_PROGRAM_SECONDS = 900


class Block(NamedTuple):
    page: str
    line: int
    kind: str
    source: str


def blocks_of(page: str) -> List[Block]:
    with open(os.path.join(ROOT, page)) as f:
        text = f.read()
    found = []
    for match in BLOCK.finditer(text):
        kind = match.group(1).strip()
        line = text.count("\n", 0, match.start()) + 1
        assert kind in KINDS, f"{page}:{line}: unknown python block kind {kind!r}; use one of {KINDS}"
        found.append(Block(page, line, kind, match.group(2)))
    return found


def programs_of(blocks: List[Block]) -> List[List[Block]]:
    """Runnable blocks grouped into programs: a plain or `long` block starts one, `continued`
    extends it."""
    programs: List[List[Block]] = []
    for block in blocks:
        if block.kind == "fragment":
            continue
        if block.kind == "continued":
            assert programs, f"{block.page}:{block.line}: a continued block with no program before it"
            programs[-1].append(block)
        else:
            programs.append([block])
    return programs


def source_of(program: List[Block]) -> str:
    """The program's blocks, each padded with blank lines down to its place in the page, so that a
    traceback's line numbers are the page's."""
    lines: List[str] = []
    for block in program:
        lines += [""] * (block.line - len(lines))
        lines += block.source.split("\n")
    return "\n".join(lines)


def test_every_page_is_found_and_has_python_blocks():
    assert "docs/training.md" in PAGES and "docs/compile.md" in PAGES
    assert sum(len(blocks_of(page)) for page in PAGES) >= 10, "the docs lost their Python examples"


def test_source_keeps_the_page_line_numbers():
    blocks = [Block("p.md", 3, "", "a = 1\n"), Block("p.md", 9, "continued", "b = a\nc = b\n")]
    lines = source_of(blocks).split("\n")
    assert lines[3] == "a = 1" and lines[9] == "b = a" and lines[10] == "c = b"


def is_long(program: List[Block]) -> bool:
    return program[0].kind == "long"


@pytest.mark.parametrize("page", PAGES)
def test_every_block_compiles(page):
    for block in blocks_of(page):
        compile("\n" * block.line + block.source, page, "exec")
    for program in programs_of(blocks_of(page)):
        compile(source_of(program), page, "exec")


def runs_here(program: List[Block]) -> bool:
    return RUN_LONG or not is_long(program)


@pytest.mark.parametrize("page", [p for p in PAGES if any(runs_here(q) for q in programs_of(blocks_of(p)))])
def test_page_programs_run(page, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    programs = programs_of(blocks_of(page))
    # A program after a long one may read its files, so a page runs up to its first long program.
    for program in programs[:next((i for i, q in enumerate(programs) if not runs_here(q)), len(programs))]:
        where = f"{page}:{program[0].line}"
        script = tmp_path / f"{os.path.basename(page)}_{program[0].line}.py"
        limit = LONG_PROGRAM_SECONDS if is_long(program) else PROGRAM_SECONDS
        script.write_text(source_of(program))
        try:
            done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{where}: the example ran past {limit} s")
        assert done.returncode == 0, f"{where} failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
