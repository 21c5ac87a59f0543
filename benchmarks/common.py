"""Shared helpers for the benchmarks: a random-weight GPT-2-small checkpoint and a fair interleaved timer."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch


def gpt2_small_checkpoint(folder: str | None = None, seed: int = 0, **overrides) -> Path:
    """Save a random-init GPT-2-small (12 x 12 x 768, vocab 50257) in Hugging Face format; return its folder."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = Path(folder or tempfile.mkdtemp(prefix="gpt2-small-"))
    if not (folder / "config.json").exists():
        torch.manual_seed(seed)
        GPT2LMHeadModel(GPT2Config(**overrides)).save_pretrained(folder)
    return folder


def time_interleaved(fns: dict, repeats: int = 5, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, calls interleaved so machine noise hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}
