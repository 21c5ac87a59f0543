"""Process-wide allocator settings that make the CPU path cheaper, in time or in memory, without changing a number.

glibc serves a block from its heap below the mmap threshold and maps a fresh zero-filled one above it (the
threshold adapts up to 32 MiB by default); freed heap blocks are kept for reuse, and what is kept but never fits a
later request stays resident. Which setting wins depends on the size of a pass's temporaries, hence of the model
(:func:`configure_allocator`, what the CLI and ``run`` call once the model is loaded):

* ``reuse``, a model of up to 128 MiB of weights: blocks below 256 MiB come from the heap and are reused, so each
  forward's large temporaries (the shipped model's 64 MiB chunks of logits) are not mapped and zero-filled page by
  page every time: one 8,192-token evaluation of the shipped model took 1.18 s with glibc's defaults and 0.88 s
  this way (``benchmarks/bench_curves.py``); its temporaries are small, so what the heap keeps is too.
* ``lean``, a larger model: blocks of 4 MiB and more are mapped afresh, and free heap above 64 MiB is returned.
  Its temporaries run to tens of MiB in many sizes (a layer's attention probabilities, the backward's saved
  tensors), and a heap that keeps them grows with every window: on SmolLM2-135M the head-role pass over 4 windows
  of 1024 peaked at 2.9 GiB with 64 MiB blocks kept and 1.2 GiB lean, the gradient scores over 8 windows at 4.7 GiB
  (256 MiB kept) and 1.5 GiB lean, and one Gemma 3 270M evaluation at 5.5 GiB (256 MiB kept) and 1.5 GiB lean.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
SMALL_MODEL_BYTES = 128 << 20  # weights up to this size: reuse; above: lean
SETTINGS = {  # (mmap threshold, trim threshold) in bytes
    "reuse": (256 << 20, 512 << 20),
    "lean": (4 << 20, 64 << 20),
}


def _libc() -> Any | None:
    """glibc on Linux (None elsewhere, and for a libc without mallopt such as musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


def set_allocator(setting: str) -> bool:
    """Apply ``reuse`` or ``lean`` (:data:`SETTINGS`) to this process; True if applied (glibc only)."""
    mmap_threshold, trim_threshold = SETTINGS[setting]
    libc = _libc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) \
        and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))


def allocator_for(param_bytes: int) -> str:
    """``reuse`` for a model of up to :data:`SMALL_MODEL_BYTES` of weights, else ``lean``."""
    return "reuse" if param_bytes <= SMALL_MODEL_BYTES else "lean"


def configure_allocator(model: Any) -> str | None:
    """Apply the setting for ``model`` (an ``nn.Module``); the setting's name, or None where glibc is absent."""
    setting = allocator_for(sum(p.numel() * p.element_size() for p in model.parameters()))
    return setting if set_allocator(setting) else None


def reuse_freed_memory() -> bool:
    """The ``reuse`` setting (``benchmarks/bench_curves.py`` times it against glibc's defaults). True if applied."""
    return set_allocator("reuse")


def return_freed_memory() -> bool:
    """Return the heap's free blocks to the system (glibc's ``malloc_trim``): after a large release, such as a
    model's weights, whose smaller tensors the heap would otherwise keep. True if memory was returned."""
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))
