"""The LM head's NLL computed a few positions at a time equals transformers' per-token cross-entropy and the
unchunked NLL of the whole (B,T,V) logits, and so do its gradients (checkpointed chunks under autograd)."""

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

from headprune.io.read.loading import load_model
from headprune.models.nll import model_nll, nll_rows, token_nll, unembed_nll

from helpers import TINY

V = TINY["vocab_size"]


@pytest.mark.parametrize("rows", [1, 7, 40, 4096])  # one position per chunk, several, a few, all at once
def test_unembed_nll_in_chunks_equals_hf_cross_entropy(tiny_dir, rows):
    ours, hf = load_model(tiny_dir), GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    tokens = torch.randint(0, V, (5, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = hf(tokens).logits  # (5, 16, V)
        expected = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1),
                                   reduction="none").view(5, 15)
        resid = ours.run_blocks(ours.embed(tokens))
        got = unembed_nll(ours, resid, tokens, budget_bytes=4 * V * rows)
        whole = token_nll(ours.unembed(resid), tokens)
    assert nll_rows(V, 4 * V * rows) == rows
    assert got.shape == (5, 15)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
    torch.testing.assert_close(got, whole, rtol=1e-6, atol=0)


def test_default_budget_chunks_a_large_vocabulary():
    assert nll_rows(262_144) == 256 and nll_rows(49_152) == 1365 and nll_rows(10**9) == 1


@pytest.mark.parametrize("rows", [3, 50])
def test_chunked_nll_gradient_equals_the_full_logits_gradient(tiny_dir, rows):
    """∂(Σ mask·NLL)/∂gates through checkpointed chunks of ``rows`` positions = through the whole logits. In float64,
    so that fp32's rounding of the backward's sums (a few 1e-6 relative here) does not hide a real difference."""
    model = load_model(tiny_dir).double()
    tokens = torch.randint(0, V, (3, 24), generator=torch.Generator().manual_seed(7))
    mask = torch.rand(3, 23, generator=torch.Generator().manual_seed(8)) > 0.3

    def grads(nll_of) -> tuple[torch.Tensor, torch.Tensor]:
        gates = [torch.ones(3, blk.attn.n_heads, dtype=torch.float64, requires_grad=True) for blk in model.h]
        with torch.enable_grad():
            nll = nll_of(gates)
            loss = (nll.double() * mask).sum()
            return loss.detach(), torch.cat(torch.autograd.grad(loss, gates), dim=1)

    full_loss, full = grads(lambda g: token_nll(model(tokens, gates=g), tokens))
    chunk_loss, chunked = grads(lambda g: unembed_nll(model, model.run_blocks(model.embed(tokens), gates=g), tokens,
                                                      budget_bytes=4 * V * rows))
    _, default = grads(lambda g: model_nll(model, tokens, gates=g))
    assert full.abs().max() > 1e-3  # the heads matter: the comparison is not between zeros
    torch.testing.assert_close(chunk_loss, full_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(chunked, full, rtol=1e-10, atol=1e-10 * float(full.abs().max()))
    torch.testing.assert_close(default, full, rtol=1e-10, atol=1e-10 * float(full.abs().max()))
