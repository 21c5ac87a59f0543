"""Process-wide settings that make the CPU path cheaper without changing a single number.

glibc returns every freed block above its mmap threshold (at most 32 MiB by default) to the kernel at once,
so each forward's large temporaries (a batch's logits are 8 × 256 × 8,192 floats = 64 MiB on the shipped
model) are mapped, zero-filled page by page and unmapped again: measured on the shipped model, one 8,192-token
evaluation takes 1.18 s that way and 0.88 s when freed memory is kept for reuse (`benchmarks/bench_curves.py`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 256 << 20  # blocks below this come from the heap and are reused
TRIM_THRESHOLD = 512 << 20  # free heap kept before memory is given back


def reuse_freed_memory() -> bool:
    """Keep freed blocks up to 256 MiB for reuse (glibc on Linux; elsewhere nothing changes). True if applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
