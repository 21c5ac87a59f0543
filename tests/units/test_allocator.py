"""The allocator settings: chosen by the model's size, applied on glibc Linux, and they change no number."""

import platform
import sys

import pytest
import torch

from headprune import runtime
from headprune.io.read.loading import load_model
from headprune.perplexity import Windowing, evaluate

from helpers import TINY

GLIBC = sys.platform.startswith("linux") and "glibc" in " ".join(platform.libc_ver())


def test_the_setting_follows_the_weights_size(tiny_dir):
    assert runtime.allocator_for(runtime.SMALL_MODEL_BYTES) == "reuse"
    assert runtime.allocator_for(runtime.SMALL_MODEL_BYTES + 1) == "lean"
    assert runtime.allocator_for(538_129_152) == "lean"  # SmolLM2-135M: 134,532,288 fp32 parameters, 0.50 GiB
    assert runtime.configure_allocator(load_model(tiny_dir)) == ("reuse" if GLIBC else None)


@pytest.mark.parametrize("setting", list(runtime.SETTINGS))
def test_either_setting_changes_no_number(tiny_dir, setting):
    model = load_model(tiny_dir)
    ids = torch.randint(0, TINY["vocab_size"], (200,), generator=torch.Generator().manual_seed(0))
    before = evaluate(model, ids, Windowing(64, 32), progress=False).nll
    assert runtime.set_allocator(setting) == GLIBC
    assert evaluate(model, ids, Windowing(64, 32), progress=False).nll == before
    runtime.reuse_freed_memory()
