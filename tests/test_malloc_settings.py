"""The import-time malloc settings (torchsparse_pp/utils/malloc.py): on glibc, freed heap memory
is kept, so re-allocating and touching buffers that a previous call freed takes no page faults,
where glibc's default trimming hands them back to the kernel and faults them in again. The
oracle is the kernel's own minor-fault count, in fresh processes with and without the setting.
"""
import json
import os
import platform
import subprocess
import sys

import pytest

import torchsparse_pp as tsp

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the thresholds are glibc's")

# Frees 96 MiB in 3 MiB buffers (more than glibc's default trim threshold can keep), then
# allocates and touches them again; prints the faults of the second round and the settings.
ROUNDS = r"""
import json, resource, torch
import torchsparse_pp as tsp
def touch_round():
    bufs = [torch.empty(3 << 20, dtype=torch.uint8) for _ in range(32)]
    for b in bufs:
        b.fill_(7)
    return bufs
bufs = touch_round()
del bufs
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
bufs = touch_round()
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
                  "settings": tsp.utils.malloc_settings()}))
"""


def run(env_update):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("TSPP_KEEP_FREED_MEMORY", "GLIBC_TUNABLES")}
    env.update(env_update)
    done = subprocess.run([sys.executable, "-c", ROUNDS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_memory_is_reused_without_page_faults():
    kept = run({})
    assert kept["settings"] == {"trim_threshold": 1 << 30, "mmap_threshold": 32 << 20}
    trimmed = run({"TSPP_KEEP_FREED_MEMORY": "0"})
    assert trimmed["settings"] is None
    pages = (96 << 20) // 4096
    # Kept: the second round finds its pages mapped (0-3,072 faults seen: a buffer or four may
    # land past the freed ones). glibc's default: nearly all of them fault again (~24,500).
    assert kept["faults"] < pages // 4, kept
    assert trimmed["faults"] > pages // 2, trimmed


@glibc_only
@pytest.mark.parametrize("variable, value", [("MALLOC_TRIM_THRESHOLD_", str(64 << 20)),
                                             ("MALLOC_MMAP_THRESHOLD_", str(64 << 20)),
                                             ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=67108864")])
def test_user_malloc_environment_is_left_alone(variable, value):
    assert run({variable: value})["settings"] is None


@glibc_only
def test_settings_apply_beside_mmap_max():
    """MALLOC_MMAP_MAX_=0 (large buffers kept too) sets neither threshold: both still apply."""
    kept = run({"MALLOC_MMAP_MAX_": "0"})
    assert kept["settings"] == {"trim_threshold": 1 << 30, "mmap_threshold": 32 << 20}
    assert kept["faults"] < (96 << 20) // 4096 // 4, kept


@pytest.mark.parametrize("bad", [0, -1, 2 ** 31, 1.5, True, "1"])
def test_keep_freed_memory_rejects_bad_thresholds(bad):
    with pytest.raises(ValueError, match="trim_threshold"):
        tsp.utils.keep_freed_memory(bad)


def test_import_survives_a_refusing_malloc(monkeypatch):
    """A glibc that refuses the thresholds (a 32-bit one caps them lower) leaves malloc alone:
    the import-time default never raises."""
    from torchsparse_pp.utils import malloc

    def refuse(trim_threshold=malloc.TRIM_THRESHOLD_BYTES):
        raise OSError("glibc mallopt refused the thresholds")
    monkeypatch.setattr(malloc, "keep_freed_memory", refuse)
    monkeypatch.delenv("TSPP_KEEP_FREED_MEMORY", raising=False)
    for variable in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(variable, raising=False)
    malloc.apply_default()
