"""Next-token negative log-likelihood from logits or from the final residual stream, for every family.

The LM head over a large vocabulary is the biggest tensor of a forward: B·T × V floats (1 GiB for one window of
1024 tokens at Gemma 3's 262,144). :func:`unembed_nll` never builds it: it applies the final norm, the LM head and
the log-softmax to a few rows (positions) at a time, :func:`nll_rows` of them, and keeps only each row's NLL. Under
autograd each chunk is checkpointed, so the backward recomputes a chunk's logits when it reaches it and holds one
chunk's logits and their gradient at a time, never the whole T × V."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from headprune.models.base import HeadModel


def token_nll(logits: Tensor, tokens: Tensor) -> Tensor:
    """Per-position next-token NLL: logits (B,T,V), tokens (B,T) -> (B,T-1), in fp32 or wider.

    The last position (no next token) gets target -100 (ignored) instead of being sliced off, so fp32 logits
    are used in place rather than copied (a batch's logits are tens of MB)."""
    B, T, V = logits.shape
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    targets = F.pad(tokens[:, 1:], (0, 1), value=-100)  # (B,T)
    return F.cross_entropy(logits.reshape(B * T, V), targets.reshape(-1), reduction="none").view(B, T)[:, :-1]


# fp32 logits unembed_nll holds at once (a chunk's softmax temporaries are as many again). At Gemma 3's vocabulary the
# LM head is most of a forward, and chunks of 64 rows took 1.42x the time of chunks of 256, 512 rows 0.93x (two
# single-threaded processes at once, 8 windows of 128: benchmarks/bench_lm_head.py, reports/bench_lm_head.json)
NLL_LOGITS_BYTES = 256 << 20


def nll_rows(vocab: int, budget_bytes: int = NLL_LOGITS_BYTES) -> int:
    """Positions whose fp32 logits fit in ``budget_bytes`` (at least one): 256 at Gemma 3's vocabulary of 262,144,
    1,365 at SmolLM2's 49,152."""
    return max(1, budget_bytes // (4 * vocab))


def _rows_nll(model: HeadModel, resid: Tensor, targets: Tensor) -> Tensor:
    """NLL (n,) of the rows resid (n,d) predicting targets (n,), in fp32 or wider."""
    logits = model.unembed(resid)
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets, reduction="none")


def unembed_nll(model: HeadModel, resid: Tensor, tokens: Tensor, budget_bytes: int = NLL_LOGITS_BYTES) -> Tensor:
    """``token_nll(model.unembed(resid), tokens)`` (B,T-1) from the final residual stream (B,T,d), the final norm,
    LM head and log-softmax applied to :func:`nll_rows` positions at a time.

    Each acts per position, so the NLLs are those of the whole batch (to the rounding of the LM head's matmul,
    whose blocking may differ with the number of rows); the logits held at once take budget_bytes, not B·T × V
    floats. With autograd on and resid requiring grad, each chunk is checkpointed: its logits are freed after the
    forward and recomputed in the backward, one chunk at a time."""
    B, T, d = resid.shape
    rows = nll_rows(model.cfg.vocab_size, budget_bytes)
    flat = resid[:, :-1].reshape(B * (T - 1), d)  # the last position predicts nothing
    targets = tokens[:, 1:].reshape(-1)
    grad = torch.is_grad_enabled() and resid.requires_grad
    parts = []
    for r, t in zip(flat.split(rows), targets.split(rows)):
        if grad:
            parts.append(cast(Tensor, checkpoint(_rows_nll, model, r, t, use_reentrant=False)))
        else:
            parts.append(_rows_nll(model, r, t))
    return torch.cat(parts).view(B, T - 1) if parts else resid.new_zeros(B, 0)


def model_nll(model: HeadModel, tokens: Tensor, **forward_kwargs) -> Tensor:
    """``token_nll(model(tokens, **forward_kwargs), tokens)`` (B,T-1) without the (B,T,V) logits: the blocks
    (``run_blocks`` takes the forward's gates, fills, capture and need_weights), then :func:`unembed_nll`."""
    return unembed_nll(model, model.run_blocks(model.embed(tokens), **forward_kwargs), tokens)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
