"""Process-wide allocator settings that make the CPU path cheaper, in time or in memory, without changing a number.

glibc serves a block from its heap below the mmap threshold and maps a fresh zero-filled one above it (the
threshold adapts up to 32 MiB by default). Two settings, measured on this project's 2-core machines with the
real models (8,192-token windows of 1024, peak resident memory; ``benchmarks/bench_memory.py``):

* forward passes (:func:`reuse_freed_memory`, what the CLI sets): blocks below 64 MiB come from the heap and are
  reused, so each forward's large temporaries (a batch's activations, the LM head's 64 MiB chunks of logits)
  are not mapped and zero-filled page by page every time. A higher threshold kept more of the freed memory
  than it reused: one Gemma 3 270M evaluation peaked at 5.5 GiB with 256 MiB and 1.7 GiB with 64 MiB, equally fast.
* backward passes (:func:`lean_allocator`, around every gradient computation): a backward frees tensors of many
  sizes in an order unlike the forward's, and the heap keeps the holes: SmolLM2's gradient scores peaked at
  4.1 GiB with 64 MiB and 1.45 GiB with a 4 MiB threshold, within 5% of the time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 64 << 20  # forward passes: blocks below this come from the heap and are reused
TRIM_THRESHOLD = 512 << 20  # free heap kept before memory is given back
LEAN_MMAP_THRESHOLD = 4 << 20  # backward passes
LEAN_TRIM_THRESHOLD = 64 << 20
GLIBC_DEFAULTS = (128 << 10, 128 << 10)  # glibc's initial thresholds (mmap, trim)

_settings = GLIBC_DEFAULTS  # (mmap, trim) thresholds this process last set


def _libc() -> Any | None:
    """glibc on Linux (None elsewhere, and for a libc without mallopt such as musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - both exist on glibc only
    except (OSError, AttributeError):
        return None
    return libc


def _set(mmap_threshold: int, trim_threshold: int) -> bool:
    """Set both thresholds; True if applied."""
    global _settings
    libc = _libc()
    if libc is None:
        return False
    if not (libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold) and libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)):
        return False
    _settings = (mmap_threshold, trim_threshold)
    return True


def reuse_freed_memory() -> bool:
    """Keep freed blocks below 64 MiB for reuse (glibc on Linux; elsewhere nothing changes). True if applied."""
    return _set(MMAP_THRESHOLD, TRIM_THRESHOLD)


@contextmanager
def lean_allocator() -> Iterator[None]:
    """Inside: blocks of 4 MiB and more are mapped and unmapped, and free heap above 64 MiB is returned, so a
    backward pass holds what it uses and not the heap's holes; after: the previous settings, and the free heap
    returned (``malloc_trim``). Nothing changes where glibc is absent."""
    before = _settings
    applied = _set(LEAN_MMAP_THRESHOLD, LEAN_TRIM_THRESHOLD)
    try:
        yield
    finally:
        if applied:
            _set(*before)
            libc = _libc()
            if libc is not None:
                libc.malloc_trim(0)
