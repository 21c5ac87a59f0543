"""Attention-role detectors: previous-token, duplicate-token and induction heads.

TransformerLens's ``detect_head`` definitions (error measure "mul", BOS and current token not excluded): for a
sequence of T tokens t_0..t_{T-1}, head attention A ∈ R^{T×T} (rows: queries, each summing to 1) and a 0/1
lower-triangular detection pattern P, the score is Σ(A ⊙ P) / ΣA, averaged over the sequences of the batch.

    previous_token   P[i, j] = 1  iff  j = i − 1
    duplicate_token  P[i, j] = 1  iff  j < i and t_j = t_i                (an earlier copy of the current token)
    induction        P[i, j] = 1  iff  1 ≤ j ≤ i and t_{j−1} = t_i, j−1 < i (the token after an earlier copy)

Olsson et al. (2022), "In-context Learning and Induction Heads"; Elhage et al. (2021), "A Mathematical
Framework for Transformer Circuits". The standard induction probe is a random token sequence repeated twice
(:func:`repeated_random_tokens`): on its second half an induction head attends to the token after the current
token's first occurrence.
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.heads import head_id
from headprune.models.hooks import Capture
from headprune.models.memory import pattern_windows

ROLES = ("previous_token", "duplicate_token", "induction")


def previous_token_pattern(tokens: Tensor) -> Tensor:
    """tokens (B,T) -> (B,T,T) float: 1 at [i, i−1]."""
    B, T = tokens.shape
    return torch.ones(T - 1, device=tokens.device).diag(-1).expand(B, T, T).float()


def duplicate_token_pattern(tokens: Tensor) -> Tensor:
    """tokens (B,T) -> (B,T,T) float: 1 at [i, j] for j < i with t_j = t_i."""
    T = tokens.shape[1]
    strictly_lower = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril(-1)
    return ((tokens[:, :, None] == tokens[:, None, :]) & strictly_lower).float()


def induction_pattern(tokens: Tensor) -> Tensor:
    """tokens (B,T) -> (B,T,T) float: the duplicate pattern shifted one key to the right (column 0 empty)."""
    dup = duplicate_token_pattern(tokens)
    return torch.cat([torch.zeros_like(dup[:, :, :1]), dup[:, :, :-1]], dim=2)  # [i, j] = dup[i, j−1]


PATTERNS = {"previous_token": previous_token_pattern, "duplicate_token": duplicate_token_pattern,
            "induction": induction_pattern}


def repeated_random_tokens(vocab_size: int, length: int, count: int, seed: int = 0, bos: int | None = None) -> Tensor:
    """``count`` sequences of ``length`` uniform random token ids, each repeated twice: (count, 2·length), after
    a column of ``bos`` where one is given (the model's BOS token: (count, 1 + 2·length))."""
    if length < 2 or count < 1:
        raise HeadpruneError("the induction probe needs length >= 2 and count >= 1, "
                             f"got length {length}, count {count}")
    first = torch.randint(0, vocab_size, (count, length), generator=torch.Generator().manual_seed(seed))
    return torch.cat([first.new_full((count, 1), bos), first, first] if bos is not None else [first, first], dim=1)


@torch.no_grad()
def attention_probs(model: HeadModel, tokens: Tensor) -> dict[int, Tensor]:
    """tokens (B,T) -> {layer: (B,h_l,T,T) attention probabilities in fp32} of the layers that hold heads."""
    if tokens.dim() != 2 or tokens.shape[1] > model.cfg.n_positions:
        raise HeadpruneError(f"probe tokens must be (batch, T) with T <= n_positions {model.cfg.n_positions}; "
                             f"got shape {tuple(tokens.shape)}")
    capture = Capture()
    model.run_blocks(model.embed(tokens.to(model.device)), capture=capture, need_weights=True)
    return {layer: capture.attn[layer].float() for layer in model.active_layers}


@torch.no_grad()
def detect_heads(model: HeadModel, tokens: Tensor, batch_size: int = 8, roles: tuple[str, ...] = ROLES) -> pd.DataFrame:
    """Role scores of every head on ``tokens`` (B,T): columns layer, head, head_id and one per role.

    Each sequence's score is Σ(A ⊙ P)/ΣA over its T×T pattern (TransformerLens ``detect_head``, "mul"); the
    batch mean is reported. At most :func:`~headprune.models.memory.pattern_windows` sequences run at once, and
    each layer's pattern is reduced to its role scores inside the forward, so one layer's (b,h,T,T) is held at a
    time.
    """
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise HeadpruneError(f"detect_heads needs (batch, T) tokens with T >= 2, got shape {tuple(tokens.shape)}")
    model.require_heads("detecting head roles")
    sums = {role: {layer: torch.zeros(len(k), dtype=torch.float64) for layer, k in enumerate(model.cfg.kept_heads)}
            for role in roles}
    step = min(batch_size, pattern_windows(model.cfg, tokens.shape[1]))
    for start in range(0, len(tokens), step):
        chunk = tokens[start:start + step].to(model.device)
        patterns = [PATTERNS[role](chunk) for role in roles]  # (b,T,T) each

        def scores(layer: int, probs: Tensor, patterns: list[Tensor] = patterns) -> Tensor:  # (b,h,T,T) -> (b,h,roles)
            A = probs.float()
            total = A.sum((2, 3))
            return torch.stack([torch.einsum("bhqk,bqk->bh", A, P) / total for P in patterns], -1)  # Σ(A ⊙ P)/ΣA

        capture = Capture(reduce_attn=scores)
        model.run_blocks(model.embed(chunk), capture=capture, need_weights=True)
        for layer in model.active_layers:
            for i, role in enumerate(roles):
                sums[role][layer] += capture.attn[layer][..., i].sum(0).double().cpu()
    rows = []
    for layer, head in model.head_ids:
        i = model.cfg.kept_heads[layer].index(head)
        rows.append({"layer": layer, "head": head, "head_id": head_id(layer, head)}
                    | {role: float(sums[role][layer][i]) / len(tokens) for role in roles})
    return pd.DataFrame(rows)


@torch.no_grad()
def head_patterns(model: HeadModel, tokens: Tensor, heads: list[tuple[int, int]]) -> dict[tuple[int, int], Tensor]:
    """tokens (T,) -> {(layer, head): (T,T) attention probabilities} of the listed heads (original indices)."""
    probs = attention_probs(model, tokens.view(1, -1))
    return {(layer, head): probs[layer][0, model.cfg.kept_heads[layer].index(head)].cpu() for layer, head in heads}
