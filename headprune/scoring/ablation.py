"""Ablation scores: the NLL change (nats/token, ablated − baseline) from removing one head.

    abl_zero: z_i := 0        (the value-bias share goes too, as transformers 4.x's head_mask did)
    abl_mean: z_i := z̄_i      (z̄_i: the head's mean output over the scoring windows' scored tokens)

Fast exact sweep: per batch, one forward caches the residual stream entering every layer. A head of
layer l only changes layers l..L−1, so its ablated loss is computed from the cached resid_pre[l], and
several ablated copies (one per head, each with its own gate row) run as one batched forward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model import GPT2, token_nll
from ..perplexity import Batch

ABLATION_METHODS = ("abl_zero", "abl_mean")


@torch.no_grad()
def cache_batch(model: GPT2, batch: Batch) -> tuple[dict, float]:
    """resid_pre of every layer and the batch's baseline NLL sum."""
    tokens, mask = batch.tokens.to(model.device), batch.mask.to(model.device)
    capture: dict = {}
    logits = model.unembed(model.run_blocks(model.embed(tokens), capture=capture))
    return capture, (token_nll(logits, tokens).double() * mask).sum().item()


@torch.no_grad()
def ablate_layer(
    model: GPT2,
    batch: Batch,
    resid_pre: Tensor,  # (b, T, d) entering `layer`
    layer: int,
    fill: Tensor | None = None,  # [n_heads_l, d_head] for mean ablation, None for zero
    rows: int = 8,
) -> list[float]:
    """Ablated NLL sum of the batch for each head of ``layer`` (one head at a time)."""
    tokens, mask = batch.tokens.to(model.device), batch.mask.to(model.device)
    b = tokens.shape[0]
    n_heads = model.h[layer].attn.n_heads
    copies = max(1, min(n_heads, rows // b))
    gates: list[Tensor | None] = [None] * model.cfg.n_layers
    fills: list[Tensor | None] = [None] * model.cfg.n_layers
    fills[layer] = fill
    sums: list[float] = []
    for first in range(0, n_heads, copies):
        heads = torch.arange(first, min(first + copies, n_heads), device=model.device)
        c = len(heads)
        gate = torch.ones(c, n_heads, device=model.device)
        gate[torch.arange(c), heads] = 0
        gates[layer] = gate.repeat_interleave(b, dim=0)  # (c·b, h): copy j ablates head first+j
        resid = model.run_blocks(resid_pre.repeat(c, 1, 1), start=layer, gates=gates, fills=fills)  # (c·b, T, d)
        for copy in resid.split(b):  # the LM head one copy at a time: logits stay (b, T, vocab)
            sums.append((token_nll(model.unembed(copy), tokens).double() * mask).sum().item())
    return sums
