"""Data-driven head scores from one pass over the scoring windows.

Over the scored tokens (positions whose next-token prediction the perplexity scores, so every corpus
position counts once), with z_i ∈ R^{d_k} the output of head i before W_O:

    out_norm = mean_t ‖z_i(t) W_O^(i)‖₂ = mean_t √(z_i(t) G_i z_i(t)ᵀ),   G_i = W_O^(i) W_O^(i)ᵀ  (d_k×d_k)
    fluct    = Σ_j Var_t[z_ij(t)] · ‖W_O^(i)[j,:]‖²       (FLAP's fluctuation over the d_k input channels of W_O,
                                                          sample variance, denominator n−1)
    entropy  = mean_t −Σ_s A_i(t,s) log A_i(t,s)          (attention entropy in nats: a description)
    mean_z   = mean_t z_i(t)                               (the fill of mean ablation and compensation)

Each batch yields sums (float64) that are recorded as one unit, so a killed pass resumes where it stopped.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor

from ..model import GPT2, Capture
from ..perplexity import Batch
from ..schema import ACTIVATION_METHODS
from .base import Family, ScoringContext, Unit


def _scored(t: Tensor, mask: Tensor) -> Tensor:
    """(b,h,L,...) -> (n,h,...) at the scored input positions; mask (b,L-1)."""
    return t[:, :, : mask.shape[1]].transpose(1, 2)[mask]


@torch.no_grad()
def batch_sums(model: GPT2, batch: Batch, entropy: bool = True) -> dict:
    """Per-head sums over one batch's scored tokens: n, Σz, Σz², Σ‖z W_O‖, Σ entropy (lists, layer-major)."""
    batch = batch.to(model.device)
    mask = batch.mask
    capture = Capture()
    model(batch.tokens, capture=capture, need_weights=entropy)
    out: dict[str, Any] = {"n": int(mask.sum()), "sum_z": [], "sum_z2": [], "sum_norm": [], "sum_entropy": []}
    for layer in model.active_layers:
        z = _scored(capture.z[layer], mask).double()  # (n, h, d_k)
        W_O = model.h[layer].attn.W_O.double()  # [h, d_k, d]
        G = W_O @ W_O.transpose(1, 2)  # [h, d_k, d_k]
        sq_norm = torch.einsum("nhk,hkl,nhl->nh", z, G, z).clamp_min(0)
        out["sum_z"] += z.sum(0).tolist()
        out["sum_z2"] += (z * z).sum(0).tolist()
        out["sum_norm"] += sq_norm.sqrt().sum(0).tolist()
        if entropy:
            probs = capture.attn[layer].double()  # (b, h, L, L)
            ent = -torch.special.xlogy(probs, probs).sum(-1)  # (b, h, L), 0·log 0 = 0
            out["sum_entropy"] += _scored(ent.unsqueeze(-1), mask).squeeze(-1).sum(0).tolist()
    return out


def combine(model: GPT2, units: list[dict]) -> dict[str, Tensor]:
    """Scores from the per-batch sums: out_norm, fluct, entropy [H] and mean_z [H, d_k], H = all heads."""
    n = sum(u["n"] for u in units)
    total = lambda key: torch.tensor([u[key] for u in units], dtype=torch.float64).sum(0)
    sum_z, sum_z2 = total("sum_z"), total("sum_z2")  # [H, d_k]
    row_sq = torch.cat([(model.h[l].attn.W_O.double() ** 2).sum(-1) for l in model.active_layers])  # [H, d_k]
    var = (sum_z2 - sum_z**2 / n) / max(n - 1, 1)
    scores = {"out_norm": total("sum_norm") / n, "fluct": (var.clamp_min(0) * row_sq.cpu()).sum(-1), "mean_z": sum_z / n}
    if units[0]["sum_entropy"]:
        scores["entropy"] = total("sum_entropy") / n
    return scores


class ActivationScores(Family):
    """out_norm, fluct, entropy and the heads' mean outputs (``mean_z``) from one pass: a unit per batch."""

    name = "activations"
    methods = ACTIVATION_METHODS

    def wanted(self, methods: list[str]) -> bool:
        return super().wanted(methods) or bool({"abl_mean", "abl_opt"} & set(methods))  # fill / start: mean_z

    def units(self, ctx: ScoringContext) -> list[Unit]:
        entropy = "entropy" in ctx.methods
        return [(f"act/{entropy}/b{k}", partial(batch_sums, ctx.model, b, entropy)) for k, b in enumerate(ctx.batches)]

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> dict[str, Tensor]:
        return combine(ctx.model, list(results.values()))
