"""Shared fixtures and input generators for the test suite."""
import os
import random
import sys

import hypothesis
import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # so tests can `import oracle`

# Without a GPU the Triton kernels run under the Triton interpreter on CPU tensors. Triton reads
# the variable when a kernel is defined, so it is set here, before any test imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from triton_interpreter import round_bfloat16_to_nearest
        round_bfloat16_to_nearest()  # as GPUs round (tests/triton_interpreter.py)
    except ImportError:  # no triton: its tests skip
        pass


def random_coords(generator: torch.Generator, num: int, batch: int = 1, low: int = -4, high: int = 8) -> torch.Tensor:
    """Unique int32 (batch, x, y, z) rows drawn uniformly from a small box (negatives included)."""
    b = torch.randint(0, batch, (num, 1), generator=generator)
    xyz = torch.randint(low, high, (num, 3), generator=generator)
    return torch.unique(torch.cat([b, xyz], 1), dim=0).int()


def shuffled_coords(generator: torch.Generator, per_batch=(150, 110), low: int = -5, high: int = 7) -> torch.Tensor:
    """Exactly per_batch[b] distinct points in sample b (x/y/z in [low, high)), rows shuffled so
    that samples interleave: layers must use the batch column, not contiguity."""
    side = high - low
    rows = []
    for b, n in enumerate(per_batch):
        flat = torch.randperm(side ** 3, generator=generator)[:n]
        xyz = torch.stack([flat // side ** 2, (flat // side) % side, flat % side], 1) + low
        rows.append(torch.cat([torch.full((n, 1), b, dtype=torch.long), xyz], 1))
    coords = torch.cat(rows)
    return coords[torch.randperm(len(coords), generator=generator)].int()


def triple(v):
    """An int or 3-sequence as a 3-tuple."""
    return (v, v, v) if isinstance(v, int) else tuple(v)


def lidar_coords(seed: int, batch: int = 1, voxel: float = 0.2, box: int = 14, beams: int = 32) -> torch.Tensor:
    """A small LiDAR-like crop: voxelised generated scans, a box-sized window around the
    densest region near the sensor, one scan per batch entry."""
    from torchsparse_pp.data import generate_scan
    from torchsparse_pp.utils import sparse_quantize

    rows = []
    for b in range(batch):
        points = generate_scan(beams, seed=seed + b)["points"][:, :3]
        voxels = sparse_quantize(points, voxel)
        # Window around a point a few metres away, where the scan has surfaces.
        near = voxels[(np.abs(voxels[:, :2]) * voxel < 8).all(1)]
        centre = near[len(near) // 2]
        keep = (np.abs(voxels - centre) < box // 2).all(1)
        crop = torch.from_numpy(voxels[keep] - centre)
        rows.append(torch.cat([torch.full((len(crop), 1), b, dtype=torch.int32), crop], 1))
    return torch.cat(rows)


# Every test gets one seed, drawn afresh (or TSPP_TEST_SEED to replay one): the global torch /
# numpy / random generators and hypothesis start from it, and fresh_seed() returns it. A fixture
# of wider scope that calls fresh_seed() draws its own (TSPP_FIXTURE_SEEDS=name:seed,... replays
# it), since it is shared by tests with other seeds. A failure prints the command that replays it.
_TEST = {"item": None, "seed": None, "fixture": None}
_FIXTURE_SEEDS = {}


def _draw(replay=None) -> int:
    if replay is None:
        replay = os.environ.get("TSPP_TEST_SEED")
    return int(replay) if replay is not None else int.from_bytes(os.urandom(4), "little")


def _replayed_fixture_seeds() -> dict:
    pairs = [p.split(":") for p in os.environ.get("TSPP_FIXTURE_SEEDS", "").split(",") if p]
    return {name: value for name, value in pairs}


def fresh_seed() -> int:
    """This test's seed (the same value on every call within a test, so a replay is exact); in a
    fixture of module or session scope, that fixture's own seed. Printed, so a failure shows it."""
    fixture = _TEST["fixture"]
    if fixture is not None:
        if fixture not in _FIXTURE_SEEDS:
            _FIXTURE_SEEDS[fixture] = _draw(_replayed_fixture_seeds().get(fixture))
        value = _FIXTURE_SEEDS[fixture]
        print(f"fixture {fixture}: TSPP_TEST_SEED={value}")
        return value
    if _TEST["seed"] is None:  # outside a test (module import, collection)
        return _draw()
    item = _TEST["item"]
    if item is not None and ("tspp_seed_used", True) not in item.user_properties:
        item.user_properties.append(("tspp_seed_used", True))
    print(f"TSPP_TEST_SEED={_TEST['seed']}")
    return _TEST["seed"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    seed = _draw()
    _TEST.update(item=item, seed=seed)
    item.user_properties.append(("tspp_seed", seed))
    torch.manual_seed(seed)
    np.random.seed(seed % 2 ** 32)
    random.seed(seed)
    function = getattr(item, "function", None)
    if getattr(function, "is_hypothesis_test", False):
        hypothesis.seed(seed)(function)
        item.user_properties.append(("tspp_seed_used", True))


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """fresh_seed() inside a module- or session-scoped fixture gives that fixture's own seed."""
    outer = _TEST["fixture"]
    if fixturedef.scope != "function":
        _TEST["fixture"] = fixturedef.argname
        _FIXTURE_SEEDS.pop(fixturedef.argname, None)  # a new instance (or another module's namesake)
    try:
        yield
    finally:
        _TEST["fixture"] = outer


def rerun_command(nodeid: str, properties: dict) -> str:
    """The one line that replays a test with the seeds it ran with."""
    env = f"TSPP_TEST_SEED={properties['tspp_seed']}"
    if properties.get("tspp_fixture_seeds"):
        env += f" TSPP_FIXTURE_SEEDS={properties['tspp_fixture_seeds']}"
    return f"{env} python -m pytest -q '{nodeid}'"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "setup":
        shared = [f"{name}:{_FIXTURE_SEEDS[name]}" for name in item.fixturenames if name in _FIXTURE_SEEDS]
        if shared:
            item.user_properties.append(("tspp_fixture_seeds", ",".join(shared)))
    report = (yield).get_result()
    properties = dict(report.user_properties)
    if report.failed and "tspp_seed" in properties:
        report.sections.append(("rerun with the same seeds", rerun_command(report.nodeid, properties)))


def pytest_terminal_summary(terminalreporter):
    lines = []
    for report in terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", []):
        properties = dict(getattr(report, "user_properties", ()))
        if "tspp_seed" in properties:
            lines.append(rerun_command(report.nodeid, properties))
    if lines:
        terminalreporter.section("rerun each failure with its seeds")
        for line in dict.fromkeys(lines):
            terminalreporter.write_line(line)


@pytest.fixture
def seed() -> int:
    return fresh_seed()


@pytest.fixture
def generator(seed) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def gen(generator) -> torch.Generator:
    """Short alias of ``generator``."""
    return generator


def _needs_native_cuda(item) -> bool:
    """Marked native_cuda, or a case of a native-backend parameter ('native', '<config>[native]')."""
    if "native_cuda" in item.keywords:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, str) and (v == "native" or v.endswith("[native]")) for v in params.values())


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` are skipped without a GPU; those that need the native CUDA kernels
    also without a CUDA build of torchsparse_pp (the Triton and torch-ops paths need only a GPU)."""
    gpu = torch.cuda.is_available()
    native = gpu and torch.ops.torchsparse_pp.cuda_built()
    no_gpu = pytest.mark.skip(reason="needs a GPU")
    no_native = pytest.mark.skip(reason="needs the native CUDA kernels (a CUDA build of torchsparse_pp)")
    for item in items:
        if "cuda" not in item.keywords:
            continue
        if not gpu:
            item.add_marker(no_gpu)
        elif not native and _needs_native_cuda(item):
            item.add_marker(no_native)
