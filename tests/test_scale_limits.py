"""Inputs past the memory or int32 limits fail fast, with a clear error, before allocating.

The kernel-map builders check the memory their large temporaries need (the candidate lists of
strided / generative maps, the submanifold table, the pair lists) against the memory available:
MemAvailable capped by the cgroup limit, and by TSPP_MEMORY_LIMIT_BYTES when that is set. The
native CPU ops (csrc/cpu/checks_cpu.cpp) and the torch builders (kmap/torch_ops.py) read the
same variable, so the refusal is tested exactly, on both, by setting it just below and at what a
call needs (the need is the documented bytes per candidate / table cell / pair). A refusal with
the machine's real memory is tested too, on a map that would need far more than the machine has.
"""
import math
import re
import resource
import time

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import backends, ops
from torchsparse_pp import nn as spnn
from torchsparse_pp.kmap import torch_ops
from conftest import random_coords

VAR = "TSPP_MEMORY_LIMIT_BYTES"
NATIVE_CANDIDATE_BYTES = 32  # kmap_strided_cpu.cpp kCandidateBytes
BUILDERS = {"native": ops, "torch": torch_ops}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def mem_total_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def refusal(needed: int, limit: int, what: str) -> str:
    """The message of a refusal under TSPP_MEMORY_LIMIT_BYTES=limit, as a regex."""
    return (rf"^{what} needs {needed / 2 ** 30:.2f} GiB \({needed} bytes\), but only {limit / 2 ** 30:.2f} GiB "
            rf"\({limit} bytes\) are available \(TSPP_MEMORY_LIMIT_BYTES\): refused before allocating$")


def bracket(monkeypatch, needed: int, what: str, call):
    """Refused, with the message naming ``what``, the need and the limit, one byte short of
    ``needed``; built at ``needed``, equal to the build without any limit."""
    monkeypatch.setenv(VAR, str(needed - 1))
    with pytest.raises(RuntimeError) as err:
        call()
    assert re.search(refusal(needed, needed - 1, what), str(err.value)), str(err.value)
    monkeypatch.setenv(VAR, str(needed))
    at_limit = call()
    monkeypatch.delenv(VAR)
    free = call()
    at_limit, free = (v if isinstance(v, tuple) else (v,) for v in (at_limit, free))
    assert len(at_limit) == len(free)
    for a, b in zip(at_limit, free):
        assert torch.equal(a, b)


@pytest.fixture(autouse=True)
def no_limit(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)


@pytest.mark.parametrize("backend", ["native", "torch"])
@pytest.mark.parametrize("kernel", [3, 5, (2, 7, 4)])
def test_generative_candidate_list_is_refused_past_the_limit(monkeypatch, gen, backend, kernel):
    coords = random_coords(gen, 700, batch=3, low=-40, high=40)
    k = (kernel,) * 3 if isinstance(kernel, int) else kernel
    K, n = math.prod(k), len(coords)
    per = NATIVE_CANDIDATE_BYTES if backend == "native" else torch_ops.CANDIDATE_BYTES
    needed = n * K * per  # every input writes to all K taps (no range)
    what = re.escape(f"the kernel map's candidate list ({n * K} ") + ".*"

    bracket(monkeypatch, needed, what, lambda: BUILDERS[backend].kmap_generative(
        coords, list(k), [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128))


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_downsample_candidate_list_names_inputs_and_offsets(monkeypatch, gen, backend):
    """Strided maps: the native need counts the (input, offset) pairs that land on an output
    (stride 3, kernel 4: some taps reach none), the torch need every (input, tap) pair."""
    coords = random_coords(gen, 500, batch=2, low=-30, high=30)
    n = len(coords)
    args = (coords, [4, 4, 4], [3, 3, 3], [1, 1, 1], [1, 1, 1], "spconv", None, 128)
    if backend == "native":
        reached = 1
        for a in range(3):  # taps t with (p + 1 - t) % 3 == 0, per axis and input
            p = coords[:, 1 + a].long() + 1
            reached = reached * sum(((p - t) % 3 == 0).long() for t in range(4))
        needed = int(reached.sum()) * NATIVE_CANDIDATE_BYTES
        what = re.escape(f"the kernel map's candidate list ({int(reached.sum())} coordinates that {n} inputs "
                         "reach through 64 kernel offsets)")
    else:
        needed = n * 64 * torch_ops.CANDIDATE_BYTES
        what = re.escape(f"the kernel map's candidate list ({n * 64} (input, kernel offset) pairs of {n} inputs "
                         "and 64 offsets)")
    bracket(monkeypatch, needed, what, lambda: BUILDERS[backend].kmap_downsample(*args))


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_submanifold_table_and_pairs_are_refused_past_the_limit(monkeypatch, gen, backend):
    coords = random_coords(gen, 900, batch=2, low=-6, high=6)
    n, K = len(coords), 125
    padded = -(-n // 128) * 128
    table_need = padded * K * 4 + n * 24 + ((n * K + 1) * 4 if backend == "torch" else 0)
    what = re.escape(f"the submanifold kernel map ({n} rows x {K} kernel offsets, int32)")
    build = BUILDERS[backend]

    bracket(monkeypatch, table_need, what, lambda: build.kmap_submanifold(coords, [5, 5, 5], [1, 1, 1], [2, 2, 2], 128))
    out_in = build.kmap_submanifold(coords, [5, 5, 5], [1, 1, 1], [2, 2, 2], 128)

    pairs = int((out_in[:n] >= 0).sum())
    assert pairs > n * 10  # a non-trivial neighbourhood
    pair_need = pairs * (8 if backend == "native" else torch_ops.PAIR_BYTES)
    what = re.escape(f"the kernel map's pair lists ({pairs} (input, output) pairs over {K} kernel offsets, int32)")
    bracket(monkeypatch, pair_need, what, lambda: build.kmap_pairs(out_in, n, n))


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_conv_module_refuses_through_the_map_it_builds(monkeypatch, gen, backend):
    """The refusal reaches the user as the RuntimeError of the conv call, with either kmap
    backend, and nothing of the failed build stays cached: the same call works without the cap."""
    coords = random_coords(gen, 600, batch=2, low=-20, high=20)
    x = tsp.SparseTensor(torch.randn(len(coords), 3, generator=gen), coords, stride=2)
    conv = spnn.Conv3d(3, 4, kernel_size=6, stride=2, transposed=True, generative=True)
    monkeypatch.setattr(backends, "kmap_backend", backend)
    monkeypatch.setenv(VAR, str(1 << 20))
    taps = len(coords) * 6 ** 3  # every input writes to all 216 taps
    with pytest.raises(RuntimeError, match=rf"^the kernel map's candidate list \({taps} .* needs .* but only "
                                           r"0\.00 GiB \(1048576 bytes\) are available \(TSPP_MEMORY_LIMIT_BYTES\): "
                                           "refused before allocating$"):
        conv(x)
    monkeypatch.delenv(VAR)
    y = conv(x)
    assert y.F.shape[1] == 4 and len(y) > len(x)


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_a_map_larger_than_the_machine_is_refused_quickly(gen, backend):
    """No hook: a 32^3 generative kernel on enough points to need 4x the machine's memory is
    refused by the real check (MemAvailable / cgroup), in well under a second per call, and the
    process's peak memory does not move."""
    K = 32 ** 3
    per = NATIVE_CANDIDATE_BYTES if backend == "native" else torch_ops.CANDIDATE_BYTES
    n = -(-4 * mem_total_bytes() // (K * per))
    coords = random_coords(gen, n + n // 10, batch=64, low=-200, high=200)[:n]
    assert len(coords) == n
    before, started = peak_rss_mib(), time.perf_counter()
    with pytest.raises(RuntimeError, match=r"^the kernel map's candidate list .* needs .* GiB \(\d+ bytes\), but only "
                                           r".* are available \(MemAvailable and the cgroup limit\): refused before "
                                           "allocating$"):
        BUILDERS[backend].kmap_generative(coords, [32, 32, 32], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128)
    assert time.perf_counter() - started < 5
    assert peak_rss_mib() - before < 256, "the refusal allocated"


@pytest.mark.parametrize("backend", ["native", "torch"])
@pytest.mark.parametrize("value", ["2GB", "-5", "1e9", " 100", "1234567890123456789"])
def test_a_malformed_limit_is_an_error_naming_the_variable(monkeypatch, gen, backend, value):
    """The hook is never ignored: a value that is not a byte count is an error of every checked
    call (native and torch alike), not a silent 'no limit'."""
    coords = random_coords(gen, 50, batch=1, low=-5, high=5)
    monkeypatch.setenv(VAR, value)
    with pytest.raises(RuntimeError, match=re.escape(f"TSPP_MEMORY_LIMIT_BYTES must be a number of bytes (digits "
                                                     f"only, at most 18), got '{value}'")):
        BUILDERS[backend].kmap_generative(coords, [3, 3, 3], [2, 2, 2], [1, 1, 1], [0, 0, 0], None, 128)


def test_small_builds_do_not_read_the_limit_unless_it_is_set(monkeypatch, gen):
    """Below 64 MiB nothing is checked without the variable (no /proc read per map build); with
    it, even a small build is checked: a limit of 0 bytes refuses every map."""
    coords = random_coords(gen, 80, batch=1, low=-6, high=6)
    for build in BUILDERS.values():
        build.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    monkeypatch.setenv(VAR, "0")
    for build in BUILDERS.values():
        with pytest.raises(RuntimeError, match=r"the submanifold kernel map \(\d+ rows x 27 kernel offsets, int32\) "
                                               r"needs .* but only 0\.00 GiB \(0 bytes\) are available"):
            build.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)


# --- int32 row limits of the other large allocations ----------------------------------------------
BIG = 1 << 31
ROWS = r"has 2147483648 rows; at most 2\^31 - 1 = 2147483647 are supported \(rows are indexed with int32\)"


def test_row_counts_past_int32_fail_before_allocating_in_the_map_builders(gen):
    """test_int32_row_limits.py covers downsample / generative / pairs / transpose and the dataflows;
    these are the builders whose outputs are [N, K] tables or hash tables: submanifold (native and
    torch builders), out_in and hash_build / hash_query. Expanded views stand for 2^31 rows
    without memory; the check comes before the copy to contiguous memory (32 GiB)."""
    huge_coords = torch.zeros(1, 4, dtype=torch.int32).expand(BIG, 4)
    small = random_coords(gen, 100, batch=1, low=-4, high=4)
    table = ops.hash_build(small)
    before, started = peak_rss_mib(), time.perf_counter()
    for build in BUILDERS.values():
        with pytest.raises(RuntimeError, match=rf"^coords {ROWS}$"):
            build.kmap_submanifold(huge_coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
    with pytest.raises(RuntimeError, match=rf"^coords {ROWS}$"):
        ops.hash_build(huge_coords)
    with pytest.raises(RuntimeError, match=rf"^query {ROWS}$"):
        ops.hash_query(table, huge_coords)
    with pytest.raises(RuntimeError, match=rf"^out_coords {ROWS}$"):
        ops.kmap_out_in(table, huge_coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], 128, True)
    assert time.perf_counter() - started < 10, "a refusal should not touch 2^31 rows"
    assert peak_rss_mib() - before < 256, "a refusal allocated"
