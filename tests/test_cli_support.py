"""Helpers of the CLI tests (test_cli_*.py): tiny generated data, a tiny config, the real CLI in
a subprocess, and snapshots of the files on disk; plus the checks of the small pieces they rely on."""
import hashlib
import re
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

import yaml

REPO = Path(__file__).resolve().parent.parent


def tiny_data(root: Path, fmt: str = "semantickitti", scans: int = 2) -> Path:
    from torchsparse_pp.data.synth import write_synthetic

    write_synthetic(root, format=fmt, scans=scans, seed=3, progress=False)
    return root


def tiny_config(path: Path, data: Path, run_dir: Path, **train) -> Path:
    """MinkUNet cr 0.125 on 0.4 m voxels within 8 m: a step takes a fraction of a second."""
    values = {"data": {"format": "semantickitti", "root": str(data), "voxel_size": 0.4, "crop": 8.0,
                       "batch_size": 1, "augment": True},
              "model": {"name": "minkunet", "cr": 0.125},
              "optim": {"name": "adamw", "lr": 0.004, "schedule": "cosine"},
              "train": dict({"epochs": 1, "threads": 1, "deterministic": True, "progress": False,
                             "conv_dataflow": "fetch_on_demand", "run_dir": str(run_dir), "log_every": 1,
                             "eval_every_epoch": False}, **train)}
    path.write_text(yaml.safe_dump(values))
    return path


def cli_env(**extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("TORCHSPARSE_PP_DEBUG", None)  # tracebacks only where a test asks for them
    env.update(PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), **extra)
    return env


def cli_command(*args) -> list:
    return [sys.executable, "-m", "torchsparse_pp", *map(str, args)]


def cli(*args, timeout: float = 240, cwd: Path = REPO, **env) -> subprocess.CompletedProcess:
    """``python -m torchsparse_pp ARGS`` (this checkout), output captured."""
    return subprocess.run(cli_command(*args), cwd=cwd, env=cli_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def cli_many(*commands, timeout: float = 240, cwd: Path = REPO):
    """Several CLI runs at once (each a tuple of arguments): independent checks share the startup
    time. Returns their CompletedProcess objects in order."""
    procs = [subprocess.Popen(cli_command(*args), cwd=cwd, env=cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for args in commands]
    done = []
    for args, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def snapshot(directory: Path) -> Dict[str, Tuple[str, int]]:
    """Every file under ``directory``: relative path -> (sha256, mtime_ns)."""
    out = {}
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file():
            out[str(path.relative_to(directory))] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                                                      path.stat().st_mtime_ns)
    return out


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The only stderr line of a failed command (no traceback)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    return lines[0]


def test_override_tokens_are_recognised():
    from torchsparse_pp.train.cliargs import OVERRIDE

    assert all(OVERRIDE.match(t) for t in ("train.epochs=2", "optim.betas=[0.9,0.99]", "a.b.c=", "data.root=/x=y"))
    assert not any(OVERRIDE.match(t) for t in ("--force", "epochs=2", "x.yaml", "-x.y=1", "train.=1"))


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    from torchsparse_pp.train.files import atomic_write, atomic_write_text

    target = atomic_write_text(tmp_path / "r.json", "old")

    def broken(tmp):
        tmp.write_text("half")
        raise OSError("disk full")
    try:
        atomic_write(target, broken)
    except OSError:
        pass
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_docs_do_not_point_outside_the_repository():
    pages = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
    for page in pages:
        text = page.read_text()
        for target in re.findall(r"(?:\]\(|`)(\.\./[^)`\s]*)", text):
            resolved = (page.parent / target).resolve()
            assert REPO in resolved.parents or resolved == REPO, f"{page.name} points outside: {target}"
