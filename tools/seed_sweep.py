#!/usr/bin/env python3
"""Runs randomized tests for many seeds in parallel and prints every failing seed with the one
command that replays it.

    python tools/seed_sweep.py                            # every test that draws a seed, 200 seeds
    python tools/seed_sweep.py tests/test_amp.py --seeds 500 --jobs 2
    python tools/seed_sweep.py tests/test_models.py -k bf16 --out sweep.json
    python tools/seed_sweep.py tests/test_norm.py --all   # also tests that draw no seed of their own
    python tools/seed_sweep.py tests/test_kmap.py -- -x   # options after -- go to pytest

Two passes of pytest (with pytest-xdist when --jobs > 1):
1. discovery: the chosen tests once, with the first seed; a test "draws a seed" when it calls
   conftest.fresh_seed() (the `seed` / `generator` / `gen` fixtures do) or is a hypothesis test;
2. the sweep: every test that drew a seed (every test that ran, with --all) parametrized over
   the remaining seeds; the suite's conftest gives each case its seed through TSPP_TEST_SEED.

Seeds are 32-bit values from a master seed (--master, printed), like the suite's own draws.
Module-scoped fixtures are set up once per pytest worker, so data they draw varies per worker
and per run, not per seed.

The same file is the pytest plugin of both passes (`-p seed_sweep`, configured by environment).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SWEEP_ID = re.compile(r"-SWEEP\d+(?=\])|SWEEP\d+-|\[SWEEP\d+\]")


def original_nodeid(nodeid: str) -> str:
    """tests/f.py::test[a-SWEEP12] -> tests/f.py::test[a]"""
    return SWEEP_ID.sub("", nodeid, count=1)


def replay_command(nodeid: str, seed: int) -> str:
    return f"TSPP_TEST_SEED={seed} python -m pytest -q '{nodeid}'"


# ------------------------------------------------------------------------------------------------
# The pytest plugin
# ------------------------------------------------------------------------------------------------
def _load(variable: str):
    path = os.environ.get(variable)
    return json.loads(Path(path).read_text()) if path else None


_SEEDS = _load("TSPP_SWEEP_SEEDS_FILE")
_SELECTED = set(_load("TSPP_SWEEP_SELECT_FILE") or ())
_SELECTED_FUNCTIONS = {n.split("[")[0] for n in _SELECTED}
_RESULTS = defaultdict(lambda: {"outcome": "passed", "seconds": 0.0, "drew_seed": False, "seed": None})

try:
    import pytest

    @pytest.fixture
    def tspp_sweep_seed(request):
        return request.param
except ImportError:  # the driver alone needs no pytest
    pytest = None


def pytest_generate_tests(metafunc):
    if _SEEDS is None or metafunc.definition.nodeid not in _SELECTED_FUNCTIONS:
        return
    metafunc.fixturenames.append("tspp_sweep_seed")
    metafunc.parametrize("tspp_sweep_seed", _SEEDS, ids=[f"SWEEP{s}" for s in _SEEDS])


def pytest_collection_modifyitems(config, items):
    if _SEEDS is None:
        return
    keep = [i for i in items if "tspp_sweep_seed" in getattr(getattr(i, "callspec", None), "params", {})
            and original_nodeid(i.nodeid) in _SELECTED]
    dropped = [i for i in items if i not in set(keep)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def _item_seed(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("tspp_sweep_seed")


if pytest is not None:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """The case's seed in TSPP_TEST_SEED for its setup, call and teardown."""
        seed = _item_seed(item)
        before = os.environ.get("TSPP_TEST_SEED")
        if seed is not None:
            os.environ["TSPP_TEST_SEED"] = str(seed)
        try:
            yield
        finally:
            if seed is not None:
                if before is None:
                    os.environ.pop("TSPP_TEST_SEED", None)
                else:
                    os.environ["TSPP_TEST_SEED"] = before


def pytest_runtest_logreport(report):
    result = _RESULTS[report.nodeid]
    result["seconds"] += report.duration
    properties = dict(report.user_properties)
    result["drew_seed"] |= bool(properties.get("tspp_seed_used"))
    result["seed"] = properties.get("tspp_seed", result["seed"])
    if report.failed:
        result["outcome"] = "failed"
        result.setdefault("message", str(report.longrepr)[-1500:])
    elif report.skipped and result["outcome"] == "passed":
        result["outcome"] = "skipped"


def pytest_sessionfinish(session):
    out = os.environ.get("TSPP_SWEEP_RESULTS_FILE")
    if out and not hasattr(session.config, "workerinput"):  # the controller writes, not xdist workers
        Path(out).write_text(json.dumps(_RESULTS))


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------
def run_pytest(paths, extra, jobs, variables, results_file) -> int:
    env = dict(os.environ)
    env.pop("TSPP_TEST_SEED", None)
    env.update(variables)
    env["TSPP_SWEEP_RESULTS_FILE"] = str(results_file)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tools"), str(REPO), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pytest", "-q", "-p", "seed_sweep", "-p", "no:cacheprovider", *paths, *extra]
    if jobs > 1:
        cores = os.cpu_count() or 1
        env.setdefault("OMP_NUM_THREADS", str(max(2, cores // jobs)))
        command += ["-n", str(jobs), "--dist", "worksteal"]
    else:
        command += ["-p", "no:xdist"]
    return subprocess.run(command, cwd=REPO, env=env).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", default=["tests"], help="test files or node ids (default: tests)")
    parser.add_argument("--seeds", type=int, default=200, help="seeds per test, the discovery run included")
    parser.add_argument("--jobs", "-j", type=int, default=min(os.cpu_count() or 1, 8), help="pytest-xdist workers")
    parser.add_argument("--master", type=int, default=None, help="master seed of the seed list (default: random)")
    parser.add_argument("--all", action="store_true", help="sweep every test that ran, not only those drawing a seed")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    parser.add_argument("--out", default=None, help="write the per-test results as JSON here")
    args, unknown = parser.parse_known_args(argv)  # options it does not know go to pytest
    extra = [a for a in unknown if a != "--"] + (["-k", args.keyword] if args.keyword else [])
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    master = args.master if args.master is not None else int.from_bytes(os.urandom(4), "little")
    rng = random.Random(master)
    seeds = [rng.getrandbits(32) for _ in range(args.seeds)]
    print(f"[sweep] master seed {master}: {args.seeds} seeds per test, {args.jobs} workers", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.time()
        print(f"[sweep] discovery run (seed {seeds[0]})", flush=True)
        discovery = tmp / "discovery.json"
        run_pytest(args.paths, extra, args.jobs, {"TSPP_TEST_SEED": str(seeds[0])}, discovery)
        found = json.loads(discovery.read_text()) if discovery.exists() else {}
        if not found:
            print("[sweep] no tests ran", file=sys.stderr)
            return 2
        chosen = sorted(n for n, r in found.items() if r["outcome"] != "skipped" and (args.all or r["drew_seed"]))
        seconds = sum(found[n]["seconds"] for n in chosen)
        print(f"[sweep] {len(chosen)} of {len(found)} tests to sweep; one seed of them takes {seconds:.0f} s "
              f"(about {seconds * (args.seeds - 1) / max(args.jobs, 1) / 60:.0f} min for the rest)", flush=True)
        swept = {}
        if chosen and args.seeds > 1:
            (tmp / "seeds.json").write_text(json.dumps(seeds[1:]))
            (tmp / "select.json").write_text(json.dumps(chosen))
            run_pytest(args.paths, extra, args.jobs, {"TSPP_SWEEP_SEEDS_FILE": str(tmp / "seeds.json"),
                                                      "TSPP_SWEEP_SELECT_FILE": str(tmp / "select.json")},
                       tmp / "sweep.json")
            if (tmp / "sweep.json").exists():
                swept = json.loads((tmp / "sweep.json").read_text())

    # One record per test: the seeds it ran with and those that failed.
    tests = {n: {"seeds_run": 0, "failed_seeds": [], "seconds": 0.0, "messages": {}} for n in chosen}
    for name, result in list(found.items()) + list(swept.items()):
        test = tests.get(original_nodeid(name))
        if test is None or result["outcome"] == "skipped" or result["seed"] is None:
            continue
        test["seeds_run"] += 1
        test["seconds"] += result["seconds"]
        if result["outcome"] == "failed":
            test["failed_seeds"].append(result["seed"])
            test["messages"][str(result["seed"])] = result.get("message", "")
    unswept_failures = [n for n, r in found.items() if r["outcome"] == "failed" and n not in tests]

    per_file = defaultdict(lambda: [0, 0, 0])  # tests, seeds run, failures
    for name, test in tests.items():
        entry = per_file[name.split("::")[0]]
        entry[0] += 1
        entry[1] += test["seeds_run"]
        entry[2] += len(test["failed_seeds"])
    print(f"\n[sweep] master seed {master}, {time.time() - start:.0f} s")
    print(f"{'file':50s} {'tests':>6s} {'runs':>7s} {'failed':>7s}")
    for name, (count, runs, failed) in sorted(per_file.items()):
        print(f"{name:50s} {count:6d} {runs:7d} {failed:7d}")
    failing = {n: t for n, t in tests.items() if t["failed_seeds"]}
    for name in unswept_failures:
        print(f"[sweep] failed in discovery (draws no seed of its own): {name}")
    if failing:
        print("\n[sweep] failing seeds, each with the command that replays it:")
        for name, test in sorted(failing.items()):
            print(f"{name}: {len(test['failed_seeds'])} of {test['seeds_run']} seeds")
            for seed in test["failed_seeds"]:
                print("  " + replay_command(name, seed))
    else:
        print("\n[sweep] no failing seed")
    if args.out:
        Path(args.out).write_text(json.dumps({"master": master, "seeds": seeds, "tests": tests,
                                              "failed_without_seed": unswept_failures}, indent=1))
    return 1 if failing or unswept_failures else 0


if __name__ == "__main__":
    sys.exit(main())
