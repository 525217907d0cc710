"""Host (CPU) memory allocator policy for a training process.

A training step frees and re-allocates the same activation sizes every step. glibc's malloc
serves blocks above its mmap threshold with fresh `mmap`s and trims free memory at the top of
the heap, so on CPU every step pays page faults to get zeroed pages back from the kernel:
measured on the tiny GPT-2 (see docs/benchmarks.md), about 10,000 minor faults per step and
10-15 % of the step time. `retain` keeps freed memory in the process for the next step, the
host-side counterpart of PyTorch's CUDA caching allocator. The peak RSS does not grow; the
memory stays with the process until it exits.

`training.host_malloc=default` leaves glibc's adaptive thresholds alone. Other C libraries
(musl, macOS) are left as they are. With jemalloc or tcmalloc LD_PRELOADed, malloc is theirs
and mallopt only tunes glibc's, which then goes unused.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sys

HOST_MALLOC_POLICIES = ("retain", "default")  # training.host_malloc

log = logging.getLogger(__name__)

# mallopt(3) parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks up to 1 GiB come from the heap and are reused; larger ones are still mmapped, where
# the page-fault cost is small next to the compute on a tensor that size. Free memory at the top
# of the heap is kept up to INT_MAX, the largest value mallopt takes.
RETAIN_MMAP_THRESHOLD = 1 << 30
RETAIN_TRIM_THRESHOLD = 2**31 - 1

_applied: str | None = None


def apply_host_malloc(policy: str) -> bool:
    """Apply `policy` to this process (and the workers it forks); True when mallopt took it.

    Idempotent; `default` after `retain` is not undone (glibc has no way back to adaptive
    thresholds), which only matters to a process that runs several trainings in a row.
    """
    global _applied
    if policy not in HOST_MALLOC_POLICIES:
        raise ValueError(f"host_malloc={policy!r}; choose one of {HOST_MALLOC_POLICIES}")
    if policy == "default" or _applied == policy:
        return _applied == policy
    mallopt = _glibc_mallopt()
    if mallopt is None:
        log.debug("host_malloc=retain: not glibc, left as it is")
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, RETAIN_MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, RETAIN_TRIM_THRESHOLD)
    )
    if ok:
        _applied = policy
    else:
        log.warning("host_malloc=retain: glibc refused mallopt; using its defaults")
    return ok


def _glibc_mallopt():
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt
