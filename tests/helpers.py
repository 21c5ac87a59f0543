"""Test helpers shared by several test modules: checkpoint builders, corpora, and the HF perplexity loop."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

TINY = {"vocab_size": 50257, "n_positions": 64, "n_embd": 32, "n_layer": 3, "n_head": 4, "initializer_range": 0.2}


def save_hf_gpt2(folder, seed: int = 0, **config) -> GPT2LMHeadModel:
    """A seeded random-init GPT2LMHeadModel saved with save_pretrained into ``folder``."""
    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(GPT2Config(**config)).eval()
    hf.save_pretrained(folder)
    return hf


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


def write_corpus(path: Path, topics: int = 30, chars: int = 12000) -> Path:
    """A small English text file: the first ``topics`` pydoc topics joined, cut to ``chars`` characters."""
    import pydoc_data.topics

    path.write_text(" ".join(list(pydoc_data.topics.topics.values())[:topics])[:chars])
    return path


def random_tokens(vocab: int = 50257, B: int = 2, T: int = 24, seed: int = 0) -> torch.Tensor:
    """(B, T) token ids, seeded."""
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))
