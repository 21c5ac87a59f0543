"""Next-token negative log-likelihood from logits or from the final residual stream, for every family."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def token_nll(logits: Tensor, tokens: Tensor) -> Tensor:
    """Per-position next-token NLL: logits (B,T,V), tokens (B,T) -> (B,T-1), in fp32 or wider.

    The last position (no next token) gets target -100 (ignored) instead of being sliced off, so fp32 logits
    are used in place rather than copied (a batch's logits are tens of MB)."""
    B, T, V = logits.shape
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    targets = F.pad(tokens[:, 1:], (0, 1), value=-100)  # (B,T)
    return F.cross_entropy(logits.reshape(B * T, V), targets.reshape(-1), reduction="none").view(B, T)[:, :-1]


NLL_CHUNK_TOKENS = 1024  # positions whose logits unembed_nll holds at once


def unembed_nll(model: nn.Module, resid: Tensor, tokens: Tensor, chunk_tokens: int = NLL_CHUNK_TOKENS) -> Tensor:
    """``token_nll(model.unembed(resid), tokens)`` (B,T-1) from the final residual stream (B,T,d), the LM head
    applied to ⌊chunk_tokens / T⌋ windows (at least one) at a time.

    The LM head and the softmax act per position, so each window's NLLs are those of the whole batch (bit for bit
    on the CPUs measured); the logits held at once are chunk × vocab floats instead of B·T × vocab (10% faster
    here at vocab 8192, and 0.5 instead of 1 GiB per batch of 8 × 256 at Llama-3's 128,256)."""
    rows = max(1, chunk_tokens // resid.shape[1])
    unembed = cast(Callable[[Tensor], Tensor], model.unembed)
    return torch.cat([token_nll(unembed(r), t) for r, t in zip(resid.split(rows), tokens.split(rows))])


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
