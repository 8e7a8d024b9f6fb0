"""Unmodified upstream client code of spconv (OpenPCDet, Pointcept, spconv's own tests) run in a
subprocess, on real spconv 2.3.8 or on torchsparse_pp after ``alias("spconv")`` (the alias
refuses once the real package is imported, so each side gets a process of its own).

The upstream files are read from ``../shared/upstream`` (tests skip when it is absent); only
imports unrelated to sparse convolution (registries, box utilities, image libraries) are stubbed.

    python tests/spconv_upstream.py spconv-test NAME OUT.json        # under the alias
    python tests/spconv_upstream.py model NAME real|ours IN.pt OUT.pt
"""
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Dict, Iterable, List, Optional

UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "upstream"
HERE = Path(__file__).resolve().parent


def upstream_file(*parts: str) -> Path:
    """An upstream file; the calling test skips when the shared folder (or the file) is absent."""
    import pytest

    path = UPSTREAM.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"upstream client code not found at {path} (../shared/upstream is absent in this checkout)")
    return path


def run_here(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """This file as a script in a fresh interpreter (the repository root on the path)."""
    env_path = str(HERE.parent)
    code = f"import sys; sys.path[:0] = [{env_path!r}, {str(HERE)!r}]; import spconv_upstream; spconv_upstream.main()"
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return done


# --- stubs for imports unrelated to sparse convolution ---------------------------------------------
class _Stub(types.ModuleType):
    """A module whose names import, and say they were left out when called."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        qualified = f"{self.__name__}.{name}"

        def left_out(*args, **kwargs):
            raise NotImplementedError(f"{qualified} is a stub in torchsparse_pp's upstream tests: the code that "
                                      "uses it is not run here")
        return left_out


def stub_missing(names: Iterable[str], attributes: Optional[Dict[str, dict]] = None) -> None:
    """Stub the modules of ``names`` that cannot be imported here (``attributes[name]`` set on the stub)."""
    for name in names:
        if name in sys.modules or _importable(name):
            continue
        module = _Stub(name)
        for key, value in (attributes or {}).get(name, {}).items():
            setattr(module, key, value)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def use_upstream(project: str) -> None:
    sys.path.insert(0, str(UPSTREAM / project))


# --- spconv's own tests ---------------------------------------------------------------------------
class _Cases(list):
    """The parameter grid, reporting which case the test's loop is on."""

    def __init__(self, cases, start: int, tracker: dict):
        super().__init__(cases)
        self.start, self.tracker = start, tracker

    def __iter__(self):
        for i, case in enumerate(list.__iter__(self)):
            self.tracker["case"] = self.start + i
            yield case


def _first_line(error: BaseException) -> str:
    """A failure's first non-empty line (never empty: an empty entry means a passed check)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:300]


def load_spconv_test_conv(device: str = "cpu:0") -> types.ModuleType:
    """spconv's test/test_conv.py with only its device changed (its text otherwise as shipped)."""
    path = UPSTREAM / "spconv" / "test" / "test_conv.py"
    module = types.ModuleType("spconv_test_conv")
    module.__file__ = str(path)
    source = path.read_text().replace('"cuda:0"', f'"{device}"')
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def run_spconv_test(name: str) -> dict:
    """Runs one test function of spconv's test_conv.py case by case: every comparison is recorded
    (a failed one does not stop the loop); a case that raises is recorded and the loop resumes at
    the next case. Returns the number of cases, the passed count and the failures."""
    import torch

    torch.set_num_threads(1)
    module = load_spconv_test_conv()
    grid, base = module.params_grid, module.TestCase
    tracker: Dict[str, int] = {"case": -1}
    checks: Dict[int, List[Optional[str]]] = {}

    class RecordingTestCase(base):
        def assertAllClose(self, *args, **kwargs):
            try:
                super().assertAllClose(*args, **kwargs)
                checks.setdefault(tracker["case"], []).append(None)
            except AssertionError as failure:
                checks.setdefault(tracker["case"], []).append(_first_line(failure))

    module.TestCase = RecordingTestCase
    all_cases = [None]
    start = 0
    while True:
        def from_start(*params, _start=start):
            cases = grid(*params)
            all_cases[0] = cases
            return _Cases(cases[_start:], _start, tracker)
        module.params_grid = from_start
        try:
            getattr(module, name)()
            break
        except Exception as error:  # noqa: BLE001  (recorded per case, then the loop goes on)
            checks.setdefault(tracker["case"], []).append(f"{type(error).__name__}: {_first_line(error)}")
            start = tracker["case"] + 1
            if start >= len(all_cases[0]):
                break
    cases = all_cases[0]
    ran = [i for i in range(len(cases)) if i in checks]
    failed = {i: [m for m in checks[i] if m] for i in ran if any(checks[i])}
    return {"cases": len(cases), "ran": len(ran), "passed": len(ran) - len(failed),
            "failed": {str(cases[i]): failed[i] for i in failed}}


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[0] == "spconv-test":
        from torchsparse_pp.compat import alias

        alias("spconv")
        sys.path.insert(0, str(UPSTREAM / "spconv" / "test"))
        Path(argv[2]).write_text(json.dumps(run_spconv_test(argv[1])))
    elif argv[0] == "model":
        from spconv_upstream_models import run_model

        run_model(*argv[1:])
    else:
        raise SystemExit(f"unknown command {argv[0]!r}")


if __name__ == "__main__":
    main()
