"""Data-driven head scores from one pass over the scoring windows.

Over the scored tokens (positions whose next-token prediction the perplexity scores, so every corpus
position counts once), with z_i ∈ R^{d_k} the output of head i before W_O:

    out_norm = mean_t ‖z_i(t) W_O^(i)‖₂ = mean_t √(z_i(t) G_i z_i(t)ᵀ),   G_i = W_O^(i) W_O^(i)ᵀ  (d_k×d_k)
    fluct    = Σ_j Var_t[z_ij(t)] · ‖W_O^(i)[j,:]‖²       (FLAP's fluctuation over the d_k input channels of W_O,
                                                          sample variance, denominator n−1)
    entropy  = mean_t −Σ_s A_i(t,s) log A_i(t,s)          (attention entropy in nats: a description)
    mean_z   = mean_t z_i(t)                               (the fill of mean ablation and compensation)

Each batch yields per-window sums (float64), recorded as one unit, so a killed pass resumes where it stopped;
per-window sums also give every score's bootstrap interval over windows (:mod:`headprune.bootstrap`). A batch
runs in sub-batches of :func:`headprune.models.memory.capture_windows` windows (every layer's z is held until the
forward ends), fewer (:func:`~headprune.models.memory.pattern_windows`) when the entropy needs the attention
probabilities, and each layer's probabilities become their entropy per position inside the forward
(``Capture.reduce_attn``), so one layer's (b,h,T,T) is held at a time.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor

from headprune.bootstrap import ratio
from headprune.models.base import HeadModel
from headprune.models.hooks import Capture
from headprune.models.memory import capture_windows, pattern_windows
from headprune.perplexity import Batch
from headprune.schema import ACTIVATION_METHODS
from headprune.scoring.base import Family, FamilyScores, ScoringContext, SideOutputs, Unit


def _per_window(t: Tensor, mask: Tensor) -> Tensor:
    """(b,h,L,...) summed over each window's scored input positions -> (b,h,...); mask (b,L-1)."""
    t = t[:, :, : mask.shape[1]]
    m = mask.to(t.dtype).view(*mask.shape[:1], 1, mask.shape[1], *([1] * (t.dim() - 3)))
    return (t * m).sum(2)


def attention_entropy(layer: int, probs: Tensor) -> Tensor:
    """−Σ_s A(t,s) log A(t,s) (b,h,T) in float64 of probabilities (b,h,T,T), a window at a time (0·log 0 = 0)."""
    return torch.cat([-torch.special.xlogy(p.double(), p.double()).sum(-1) for p in probs.split(1)])


@torch.no_grad()
def batch_sums(model: HeadModel, batch: Batch, entropy: bool = True) -> dict:
    """Per window of the batch and head: n, Σz, Σz², Σ‖z W_O‖, Σ entropy over its scored tokens (lists [b][H...])."""
    batch = batch.to(model.device)
    seq_len = batch.tokens.shape[1]
    windows = capture_windows(model.cfg, seq_len)
    windows = min(windows, pattern_windows(model.cfg, seq_len)) if entropy else windows
    parts = [_sums(model, Batch(t, m), entropy) for t, m in zip(batch.tokens.split(windows), batch.mask.split(windows))]
    return {key: [row for p in parts for row in p[key]] for key in parts[0]}


def _sums(model: HeadModel, batch: Batch, entropy: bool) -> dict:
    """:func:`batch_sums` of windows that run as one forward."""
    mask = batch.mask
    capture = Capture(reduce_attn=attention_entropy)
    model.run_blocks(model.embed(batch.tokens), capture=capture, need_weights=entropy)  # no LM head: not needed
    sums: dict[str, list[Tensor]] = {"sum_z": [], "sum_z2": [], "sum_norm": [], "sum_entropy": []}
    for layer in model.active_layers:
        z = capture.z[layer].double()  # (b, h, L, d_k)
        W_O = model.h[layer].attn.W_O.double()  # [h, d_k, d]
        G = W_O @ W_O.transpose(1, 2)  # [h, d_k, d_k]
        norm = torch.einsum("bhtk,hkl,bhtl->bht", z, G, z).clamp_min(0).sqrt()
        sums["sum_z"].append(_per_window(z, mask))  # (b, h, d_k)
        sums["sum_z2"].append(_per_window(z * z, mask))
        sums["sum_norm"].append(_per_window(norm, mask))  # (b, h)
        if entropy:
            sums["sum_entropy"].append(_per_window(capture.attn[layer], mask))  # entropy (b, h, L) -> (b, h)
    out: dict[str, Any] = {"n": mask.sum(1).tolist()}
    out |= {key: torch.cat(parts, dim=1).tolist() if parts else [] for key, parts in sums.items()}
    return out


def combine(model: HeadModel, units: list[dict]) -> FamilyScores:
    """Scores from the per-window sums: out_norm, fluct, entropy [H], mean_z [H, d_k] and their bootstrap replicates.

    Over windows w with n_w scored tokens, S1 = Σ_w Σz, S2 = Σ_w Σz², N = Σ_w n_w:
    Var = (S2 − S1²/N)/(N − 1) per channel, fluct = Σ_j Var_j ‖W_O^(i)[j,:]‖².
    """
    windows = lambda key: torch.tensor([row for u in units for row in u[key]], dtype=torch.float64)  # [W, ...]
    n, sum_z, sum_z2 = windows("n"), windows("sum_z"), windows("sum_z2")  # [W], [W, H, d_k] x2
    row_sq = torch.cat([(model.h[l].attn.W_O.double() ** 2).sum(-1) for l in model.active_layers]).cpu()  # [H, d_k]

    def fluct(counts: Tensor) -> Tensor:  # counts [B, W] -> [B, H]
        N = (counts @ n).view(-1, 1, 1)
        S1, S2 = (torch.einsum("bw,whk->bhk", counts, s) for s in (sum_z, sum_z2))
        var = (S2 - S1**2 / N) / (N - 1).clamp_min(1)
        return (var.clamp_min(0) * row_sq).sum(-1)

    ones = torch.ones(1, len(n), dtype=torch.float64)
    out = FamilyScores({"out_norm": windows("sum_norm").sum(0) / n.sum(), "fluct": fluct(ones)[0]},
                       {"out_norm": ratio(windows("sum_norm"), n), "fluct": fluct},
                       SideOutputs(mean_z=sum_z.sum(0) / n.sum()))
    if units[0]["sum_entropy"]:
        out.scores["entropy"] = windows("sum_entropy").sum(0) / n.sum()
        out.replicates["entropy"] = ratio(windows("sum_entropy"), n)
    return out


class ActivationScores(Family):
    """out_norm, fluct, entropy and the heads' mean outputs (``mean_z``) from one pass: a unit per batch."""

    name = "activations"
    methods = ACTIVATION_METHODS

    def wanted(self, methods: list[str]) -> bool:
        return super().wanted(methods) or bool({"abl_mean", "abl_opt"} & set(methods))  # fill / start: mean_z

    def units(self, ctx: ScoringContext) -> list[Unit]:
        entropy = "entropy" in ctx.methods
        return [(f"act/w/{entropy}/b{k}", partial(batch_sums, ctx.model, b, entropy))
                for k, b in enumerate(ctx.batches)]

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> FamilyScores:
        return combine(ctx.model, list(results.values()))
