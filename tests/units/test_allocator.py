"""The allocator setting of the CLI: applied on glibc Linux, and it changes no number."""

import sys

import torch

from headprune.io.loading import load_model
from headprune.perplexity import evaluate
from headprune.runtime import reuse_freed_memory

from helpers import TINY


def test_reuse_freed_memory_changes_no_number(tiny_dir):
    model = load_model(tiny_dir)
    ids = torch.randint(0, TINY["vocab_size"], (200,), generator=torch.Generator().manual_seed(0))
    before = evaluate(model, ids, 64, 32, progress=False).nll
    applied = reuse_freed_memory()
    assert applied == (sys.platform.startswith("linux") and "glibc" in " ".join(__import__("platform").libc_ver()))
    assert evaluate(model, ids, 64, 32, progress=False).nll == before
