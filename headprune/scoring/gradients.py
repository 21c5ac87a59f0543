"""Gradient head scores through the head gates g (all 1), one forward and one backward per batch.

With L_b the mean NLL of batch b over its n_b scored tokens and L = Σ_b (n_b/N) L_b the corpus NLL:

    grad   = Σ_b (n_b/N) |∂L_b/∂g_i|      Michel et al. (2019): expected absolute gate sensitivity
    taylor = −∂L/∂g_i = −Σ_b (n_b/N) ∂L_b/∂g_i
             first-order estimate of L(g_i=0) − L(g_i=1), the NLL change from zero-ablating the head

Model weights need no gradient, so the backward pass costs about one forward (inputs only).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor

from ..model import GPT2, token_nll
from ..perplexity import Batch
from ..schema import GRADIENT_METHODS
from .base import Family, ScoringContext, Unit


def batch_gate_grad(model: GPT2, batch: Batch) -> dict:
    """∂L_b/∂g for every head (layer-major list) and n_b for one batch."""
    batch = batch.to(model.device)
    mask = batch.mask
    gates = model.ones_gates(requires_grad=True)
    with torch.enable_grad():
        nll = token_nll(model(batch.tokens, gates=gates), batch.tokens)
        loss = (nll * mask).sum() / mask.sum()
        grads = torch.autograd.grad(loss, [g for g in gates if g.numel()])
    return {"n": int(mask.sum()), "dL_dg": torch.cat(grads).double().tolist()}


def combine(units: list[dict]) -> dict[str, Tensor]:
    n = torch.tensor([u["n"] for u in units], dtype=torch.float64)
    weights = (n / n.sum()).unsqueeze(1)  # [batches, 1]
    d = torch.tensor([u["dL_dg"] for u in units], dtype=torch.float64)  # [batches, H]
    return {"grad": (weights * d.abs()).sum(0), "taylor": -(weights * d).sum(0)}


class GradientScores(Family):
    """grad and taylor from one forward and backward per batch: a unit per batch."""

    name = "gradients"
    methods = GRADIENT_METHODS

    def units(self, ctx: ScoringContext) -> list[Unit]:
        return [(f"grad/b{k}", partial(batch_gate_grad, ctx.model, b)) for k, b in enumerate(ctx.batches)]

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> dict[str, Tensor]:
        return combine(list(results.values()))
