"""The LM head's NLL computed a few windows at a time equals transformers' per-token cross-entropy."""

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

from headprune.io.loading import load_model
from headprune.models.nll import token_nll, unembed_nll

from helpers import TINY


@pytest.mark.parametrize("chunk_tokens", [1, 16, 40, 4096])  # one window per chunk, two, five, all at once
def test_unembed_nll_in_chunks_equals_hf_cross_entropy(tiny_dir, chunk_tokens):
    ours, hf = load_model(tiny_dir), GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    tokens = torch.randint(0, TINY["vocab_size"], (5, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = hf(tokens).logits  # (5, 16, V)
        expected = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1),
                                   reduction="none").view(5, 15)
        resid = ours.run_blocks(ours.embed(tokens))
        got = unembed_nll(ours, resid, tokens, chunk_tokens)
        whole = token_nll(ours.unembed(resid), tokens)
    assert got.shape == (5, 15)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
    torch.testing.assert_close(got, whole, rtol=0, atol=1e-6)
