"""Gradient head scores through the head gates g (all 1), one forward and one backward per batch.

With L_w the mean NLL of window w over its n_w scored tokens and L = Σ_w (n_w/N) L_w the corpus NLL:

    grad   = Σ_w (n_w/N) |∂L_w/∂g_i|      Michel et al. (2019): expected absolute gate sensitivity, per
                                          example (window), so it does not depend on how windows are batched
    taylor = −∂L/∂g_i = −Σ_w (n_w/N) ∂L_w/∂g_i
             first-order estimate of L(g_i=0) − L(g_i=1), the NLL change from zero-ablating the head

Every window of a batch gets its own gate row (gates [b, n_heads] per layer): since window w's loss depends
only on its own row, ∂(Σ_w L_w)/∂g[w] = ∂L_w/∂g[w], so one backward gives every window's gradient. Model
weights need no gradient, so the backward pass costs about one forward (inputs only). A batch runs in
sub-batches of windows sized by :func:`headprune.models.memory.backward_windows` (each window's gradient is its
own, so splitting changes nothing but rounding), with each block checkpointed where one window's activations
exceed the budget; the LM head's NLL is computed in checkpointed chunks (:func:`headprune.models.nll.unembed_nll`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from headprune.bootstrap import ratio
from headprune.models.base import HeadModel
from headprune.models.memory import backward_windows
from headprune.models.nll import model_nll
from headprune.perplexity import Batch, window_sums
from headprune.schema import GRADIENT_METHODS
from headprune.scoring.base import Family, FamilyScores, ScoringContext, Unit


def batch_gate_grad(model: HeadModel, batch: Batch) -> dict:
    """Per window of the batch: n_w, its scored NLL sum n_w·L_w and ∂L_w/∂g for every head (layer-major), as
    lists."""
    batch = batch.to(model.device)
    windows, checkpoint_layers = backward_windows(model.cfg, batch.tokens.shape[1])
    n = batch.mask.sum(1)  # (b,) scored tokens per window (every window scores at least one)
    rows, sums = [], []
    for tokens, mask in zip(batch.tokens.split(windows), batch.mask.split(windows)):
        b = mask.shape[0]
        gates = [torch.ones(b, blk.attn.n_heads, device=model.device, requires_grad=True) for blk in model.h]
        with torch.enable_grad():
            nll = model_nll(model, tokens, gates=gates, checkpoint_layers=checkpoint_layers)  # (b, L-1)
            loss = ((nll * mask).sum(1) / mask.sum(1).clamp_min(1)).sum()  # Σ_w L_w
            grads = torch.autograd.grad(loss, [gates[l] for l in model.active_layers])
        rows.append(torch.cat(grads, dim=1).double())
        sums += window_sums(nll.detach(), mask)
    return {"n": n.tolist(), "nll_sum": sums, "dL_dg": torch.cat(rows).tolist()}  # [b], [b], [b][H]


def combine(units: list[dict]) -> FamilyScores:
    """grad and taylor [H], and their bootstrap replicates over windows."""
    n = torch.tensor([n_w for u in units for n_w in u["n"]], dtype=torch.float64)  # [W]
    d = torch.tensor([row for u in units for row in u["dL_dg"]], dtype=torch.float64)  # [W, H]
    weighted_abs, weighted = n.unsqueeze(1) * d.abs(), -n.unsqueeze(1) * d  # per-window numerators [W, H]
    return FamilyScores({"grad": weighted_abs.sum(0) / n.sum(), "taylor": weighted.sum(0) / n.sum()},
                        {"grad": ratio(weighted_abs, n), "taylor": ratio(weighted, n)})


class GradientScores(Family):
    """grad and taylor from one forward and backward per batch: a unit per batch, results per window."""

    name = "gradients"
    methods = GRADIENT_METHODS

    def units(self, ctx: ScoringContext) -> list[Unit]:
        return [(f"grad/b{k}", partial(batch_gate_grad, ctx.model, b)) for k, b in enumerate(ctx.batches)]

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> FamilyScores:
        return combine(list(results.values()))
