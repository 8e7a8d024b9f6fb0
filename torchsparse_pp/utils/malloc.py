"""glibc malloc settings that keep freed memory for the next call (CPU speed).

A sparse network allocates and frees the same large buffers on every call (features of tens of
MB per layer). glibc hands memory at the top of its heap back to the kernel once more than its
trim threshold (64 MB at most by default) is free, which the end of every forward pass exceeds,
so the next call takes a page fault for every 4 KiB page it touches again: about 24,000 faults
per MinkUNet 0.5x inference, which then runs 5-7 % slower on a 2-core VM (0-1.5 % for a training
step; benchmarks/malloc_cpu.py, results in benchmarks/results/malloc_cpu.json).

On import (glibc Linux only) torchsparse_pp raises the trim threshold to 1 GiB and pins the mmap
threshold at glibc's largest dynamic value (32 MiB; setting one fixes both). The process then
keeps up to 1 GiB of freed heap for reuse instead of returning it; its peak memory is unchanged.
Skipped when the environment already sets either threshold (MALLOC_TRIM_THRESHOLD_,
MALLOC_MMAP_THRESHOLD_, or glibc.malloc.trim_threshold / mmap_threshold in GLIBC_TUNABLES), and
switched off by TSPP_KEEP_FREED_MEMORY=0. Buffers above 32 MiB are still mapped and unmapped by
glibc on every call; MALLOC_MMAP_MAX_=0 in the environment keeps those too (MinkUNet 1.0x
inference about 7 % faster, benchmarks/malloc_cpu.py), at the price that a large freed block
stays in the process (for reuse) unless it sits at the top of the heap.
"""
import ctypes
import logging
import os
import platform
from typing import Dict, Optional

_LOG = logging.getLogger("torchsparse_pp")

# mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD_BYTES = 1 << 30
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's cap for the dynamic threshold on 64-bit
_USER_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
_USER_TUNABLES = ("glibc.malloc.trim_threshold", "glibc.malloc.mmap_threshold")

_applied: Optional[Dict[str, int]] = None


def _is_glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory(trim_threshold: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Sets glibc's trim threshold to ``trim_threshold`` bytes and its mmap threshold to 32 MiB.
    Returns True when set; False where the C library is not glibc."""
    global _applied
    if not isinstance(trim_threshold, int) or isinstance(trim_threshold, bool) or not 0 < trim_threshold < 2 ** 31:
        raise ValueError(f"trim_threshold must be an int in (0, 2^31) bytes, got {trim_threshold!r}")
    if not _is_glibc():
        return False
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)):
        raise OSError("glibc mallopt refused the thresholds")
    _applied = {"trim_threshold": trim_threshold, "mmap_threshold": MMAP_THRESHOLD_BYTES}
    return True


def malloc_settings() -> Optional[Dict[str, int]]:
    """The thresholds torchsparse_pp set (``{"trim_threshold": .., "mmap_threshold": ..}``), or
    None where it left malloc alone."""
    return None if _applied is None else dict(_applied)


def apply_default() -> None:
    """The import-time default (see the module docstring)."""
    if os.environ.get("TSPP_KEEP_FREED_MEMORY", "1") == "0":
        return
    user = [v for v in _USER_VARIABLES if v in os.environ]
    if any(t in os.environ.get("GLIBC_TUNABLES", "") for t in _USER_TUNABLES):
        user.append("GLIBC_TUNABLES")
    if user:
        _LOG.debug("malloc left as set by %s", ", ".join(user))
        return
    try:
        applied = keep_freed_memory()
    except (OSError, AttributeError) as error:  # a glibc that refuses (32-bit caps), no mallopt symbol
        _LOG.debug("malloc left as it is: %s", error)
        return
    if applied:
        _LOG.debug("glibc malloc: trim threshold %d, mmap threshold %d bytes", TRIM_THRESHOLD_BYTES,
                   MMAP_THRESHOLD_BYTES)
