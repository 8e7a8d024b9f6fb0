"""Benchmarks write to a new git-ignored benchmarks/out/<name>-<time>/ unless --out; the published
results (benchmarks/results/, configs/tuned/) change only with --publish."""
import re
import shutil
import subprocess
import sys

import pytest

from test_cli_support import REPO, cli_env, snapshot

SCRIPTS = ("conv_cpu", "deterministic_cpu", "models", "autotune", "bf16_cpu", "malloc_cpu", "pointwise_cpu", "cpu_kernels")


def bench(script, *args, timeout=300):
    return subprocess.Popen([sys.executable, str(REPO / "benchmarks" / f"{script}.py"), *map(str, args)], cwd=REPO,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_help_says_where_results_go_and_quick_is_never_published():
    helps = [bench(name, "--help") for name in SCRIPTS]
    refused = bench("conv_cpu", "--quick", "--publish")
    for name, proc in zip(SCRIPTS, helps):
        code, out, _ = finish(proc)
        assert code == 0 and f"benchmarks/out/{name}-<time>/" in out
        assert "--publish" in out
    code, out, err = finish(refused)
    assert code == 2 and err.strip() == "error: --publish with --quick: quick results are not published (leave one out)"
    assert subprocess.run(["git", "check-ignore", "-q", "benchmarks/out/x.json"], cwd=REPO).returncode == 0


def test_a_run_writes_a_new_scratch_directory_and_leaves_published_results(tmp_path):
    pytest.importorskip("matplotlib")
    published = {d: snapshot(REPO / d) for d in ("benchmarks/results", "configs/tuned")}
    code, out, err = finish(bench("autotune", "--models", "minkunet0.5", "--modes", "inference", "--repeats", 1,
                                  "--warmup", 0, "--final-rounds", 1, "--minkunet-voxel", 1.0, "--no-progress",
                                  "--threads", 1))
    assert code == 0, err[-3000:]
    out_dir = REPO / re.search(r"^results go to (.+)$", out, re.M).group(1)
    try:
        assert out_dir.parent == REPO / "benchmarks" / "out" and out_dir.name.startswith("autotune-")
        assert sorted(p.name for p in out_dir.iterdir()) == ["autotune_cpu.json", "autotune_cpu.png",
                                                              "minkunet_0.5x_inference_cpu.yaml"]
        assert {d: snapshot(REPO / d) for d in published} == published
    finally:
        shutil.rmtree(out_dir)  # only the directory this run made
