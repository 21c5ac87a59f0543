"""The allocator settings: applied on glibc Linux, restored after a backward pass, and they change no number."""

import platform
import sys

import torch

from headprune import runtime
from headprune.io.loading import load_model
from headprune.perplexity import Batch, evaluate
from headprune.runtime import lean_allocator, reuse_freed_memory
from headprune.scoring.gradients import batch_gate_grad

from helpers import TINY

GLIBC = sys.platform.startswith("linux") and "glibc" in " ".join(platform.libc_ver())


def test_reuse_freed_memory_changes_no_number(tiny_dir):
    model = load_model(tiny_dir)
    ids = torch.randint(0, TINY["vocab_size"], (200,), generator=torch.Generator().manual_seed(0))
    before = evaluate(model, ids, 64, 32, progress=False).nll
    assert reuse_freed_memory() == GLIBC
    assert evaluate(model, ids, 64, 32, progress=False).nll == before


def test_lean_allocator_inside_a_backward_changes_no_number_and_restores_the_settings(tiny_dir, monkeypatch):
    model = load_model(tiny_dir)
    tokens = torch.randint(0, TINY["vocab_size"], (3, 40), generator=torch.Generator().manual_seed(1))
    batch = Batch(tokens, torch.ones(3, 39, dtype=torch.bool))
    reuse_freed_memory()
    forward = runtime._settings
    seen = []
    monkeypatch.setattr(runtime, "_set", lambda *t: seen.append(t) or True)  # record what the pass sets
    lean = batch_gate_grad(model, batch)  # decorated with lean_allocator
    assert seen == [(runtime.LEAN_MMAP_THRESHOLD, runtime.LEAN_TRIM_THRESHOLD), forward]
    monkeypatch.undo()
    with lean_allocator():
        assert runtime._settings == ((runtime.LEAN_MMAP_THRESHOLD, runtime.LEAN_TRIM_THRESHOLD) if GLIBC else forward)
    assert runtime._settings == forward
    assert runtime._settings == ((runtime.MMAP_THRESHOLD, runtime.TRIM_THRESHOLD) if GLIBC else runtime.GLIBC_DEFAULTS)
    assert batch_gate_grad.__wrapped__(model, batch) == lean  # the undecorated pass: the same gradients
