"""Fixtures: random-init GPT-2 checkpoints saved in exact Hugging Face format, and an offline HF cache."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

TINY = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=3, n_head=4, initializer_range=0.2)


def save_hf_gpt2(folder, seed: int = 0, **config) -> GPT2LMHeadModel:
    """A seeded random-init GPT2LMHeadModel saved with save_pretrained into ``folder``."""
    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(GPT2Config(**config)).eval()
    hf.save_pretrained(folder)
    return hf


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """3 layers x 4 heads x d_model 32, GPT-2 vocabulary, weights large enough that heads matter."""
    folder = tmp_path_factory.mktemp("tiny-gpt2")
    save_hf_gpt2(folder, **TINY)
    return folder


@pytest.fixture(scope="session")
def small_dir(tmp_path_factory):
    """The GPT-2 small architecture (12 x 12 x 768, vocab 50257), random weights."""
    folder = tmp_path_factory.mktemp("gpt2-small")
    save_hf_gpt2(folder)
    return folder


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory, tiny_dir):
    """An HF_HOME whose hub cache holds ``testorg/tiny-gpt2`` laid out as huggingface_hub lays it out."""
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / "models--testorg--tiny-gpt2"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in tiny_dir.iterdir():
        blob = repo / "blobs" / f"blob-{file.name}"
        shutil.copy(file, blob)
        (snapshot / file.name).symlink_to(f"../../blobs/{blob.name}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return home


def guide_loop(hf, ids, max_length, stride):
    """"Perplexity of fixed-length models", with the tokens really scored after the label shift counted."""
    encodings = ids.view(1, -1)
    seq_len = encodings.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = encodings[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        num_loss_tokens = (target_ids[:, 1:] != -100).sum().item()
        if num_loss_tokens:  # a one-token last window scores nothing (its loss would be 0/0)
            with torch.no_grad():
                nll_sum += hf(input_ids, labels=target_ids).loss.item() * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return nll_sum / n_tokens, n_tokens
