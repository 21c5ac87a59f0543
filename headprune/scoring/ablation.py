"""Ablation scores: the NLL change (nats/token, ablated − baseline) from removing one head.

    abl_zero:        z_i := 0        (the value-bias share goes too, as transformers 4.x's head_mask did)
    abl_zero_folded: z_i := b_V^(i)  (zero ablation after value-bias folding, see :mod:`headprune.models.folding`:
                                     only what the head computes goes, its constant b_V^(i) W_O^(i) stays)
    abl_mean:        z_i := z̄_i      (z̄_i: the head's mean output over the scoring windows' scored tokens)
    abl_opt:         z_i := c_i*     (the loss-minimising constant, Li & Janson 2024; fitted in :mod:`.optimal`)

Fast exact sweep: per batch, one forward caches the residual stream entering every layer. A head of
layer l only changes layers l..L−1, so its ablated loss is computed from the cached resid_pre[l], and
several ablated copies (one per head, each with its own gate row) run as one batched forward.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from headprune.bootstrap import ratio
from headprune.models.base import HeadModel
from headprune.models.hooks import Capture
from headprune.models.interventions import fill_tensors
from headprune.models.nll import unembed_nll
from headprune.perplexity import Batch, window_sums
from headprune.schema import ABLATION_METHODS
from headprune.scoring.base import Family, FamilyScores, ScoringContext, SideOutputs, Unit, by_head


@torch.no_grad()
def cache_batch(model: HeadModel, batch: Batch) -> tuple[dict[int, Tensor], list[float]]:
    """resid_pre of every layer and the baseline NLL sum of each window of the batch."""
    batch = batch.to(model.device)
    capture = Capture()
    resid = model.run_blocks(model.embed(batch.tokens), capture=capture)
    return capture.resid_pre, window_sums(unembed_nll(model, resid, batch.tokens), batch.mask)


def batch_caches(model: HeadModel, batches: list[Batch]) -> Callable[[int], tuple[dict[int, Tensor], list[float]]]:
    """``cache(k)``: :func:`cache_batch` of ``batches[k]``, computed when first asked for and kept until another batch
    is (units run batch by batch, so each batch's residual streams are computed once and one batch's are held)."""
    memo: dict[int, tuple[dict[int, Tensor], list[float]]] = {}

    def cache(k: int) -> tuple[dict[int, Tensor], list[float]]:
        if k not in memo:
            memo.clear()
            memo[k] = cache_batch(model, batches[k])
        return memo[k]

    return cache


@torch.no_grad()
def ablate_layer(
    model: HeadModel,
    batch: Batch,
    resid_pre: Tensor,  # (b, T, d) entering `layer`
    layer: int,
    fill: Tensor | None = None,  # [n_heads_l, d_head] for mean ablation, (b, h, T, d_head) per window, None for zero
    rows: int = 8,
) -> list[list[float]]:
    """Ablated NLL sum of each window of the batch, for each head of ``layer`` (one head at a time): [h][b].

    The ablated head's z is ``fill`` (a constant per head, or per window and position: resample ablation)."""
    batch = batch.to(model.device)
    tokens, mask = batch.tokens, batch.mask
    b = tokens.shape[0]
    n_heads = model.h[layer].attn.n_heads
    copies = max(1, min(n_heads, rows // b))
    gates: list[Tensor | None] = [None] * model.cfg.n_layers
    fills: list[Tensor | None] = [None] * model.cfg.n_layers
    per_window = fill is not None and fill.dim() == 4
    fills[layer] = fill
    sums: list[list[float]] = []
    for first in range(0, n_heads, copies):
        heads = torch.arange(first, min(first + copies, n_heads), device=model.device)
        c = len(heads)
        gate = torch.ones(c, n_heads, device=model.device)
        gate[torch.arange(c), heads] = 0
        gates[layer] = gate.repeat_interleave(b, dim=0)  # (c·b, h): copy j ablates head first+j
        if per_window and fill is not None:
            fills[layer] = fill.repeat(c, 1, 1, 1)  # (c·b, h, T, d_head)
        resid = model.run_blocks(resid_pre.repeat(c, 1, 1), start=layer, gates=gates, fills=fills)  # (c·b, T, d)
        for copy in resid.split(b):  # the LM head one copy at a time
            sums.append(window_sums(unembed_nll(model, copy, tokens), mask))
    return sums


class AblationScores(Family):
    """abl_zero, abl_zero_folded, abl_mean, abl_opt: per batch a baseline unit and, per method and layer, a unit
    for its heads."""

    name = "ablation"
    methods = ABLATION_METHODS

    def units(self, ctx: ScoringContext) -> list[Unit]:
        """A batch's residual-stream cache is computed once, when its first unit runs, and kept until the next."""
        model, batches = ctx.model, ctx.batches
        cache = batch_caches(model, batches)
        fills: dict[str, list[Tensor | None]] = {
            "abl_zero": [None] * model.cfg.n_layers,
            "abl_zero_folded": [blk.attn.b_V.detach() if blk.attn.n_heads else None for blk in model.h],  # [h, d_k]
        }
        if "abl_mean" in ctx.methods:
            assert ctx.side.mean_z is not None, "the activations family measures mean_z first"
            fills["abl_mean"] = list(fill_tensors(model, by_head(model, ctx.side.mean_z)))
        if "abl_opt" in ctx.methods:
            assert ctx.side.opt_c is not None, "the optimal fit measures opt_c first"
            fills["abl_opt"] = list(fill_tensors(model, by_head(model, ctx.side.opt_c)))
        methods = [m for m in self.methods if m in ctx.methods]

        def base(k: int) -> list[float]:
            return cache(k)[1]

        def ablate(k: int, m: str, l: int) -> list[list[float]]:
            return ablate_layer(model, batches[k], cache(k)[0][l], l, fills[m][l], ctx.ablation_rows)

        units: list[Unit] = []
        for k in range(len(batches)):
            units.append((f"base/w/b{k}", partial(base, k)))
            units += [(f"{m}/w/b{k}/L{l}", partial(ablate, k, m, l)) for m in methods for l in model.active_layers]
        return units

    def costs(self, ctx: ScoringContext, units: list[Unit]) -> list[float]:
        """FLOPs of each unit. A head of layer l reruns layers l..L−1 and the LM head on the batch's b·T tokens:
        h_l·b·T·((L − l)·c + u), with c = 8·d² + 4·d·d_mlp + 4·T·d per token and block (Q/K/V/O and MLP weights,
        then QKᵀ and A·V: 24·d² + 4·T·d for GPT-2's d_mlp = 4d) and
        u = 2·d·V per token for the LM head; the baseline unit is one forward, b·T·(L·c + u). Early layers cost up
        to (L·c + u)/(c + u) times the last one's, so equal unit counts per process would not balance."""
        cfg = ctx.model.cfg
        out = []
        for key, _ in units:
            parts = key.split("/")  # base/w/b{k} or {method}/w/b{k}/L{l}
            kind, k = parts[0], int(next(p[1:] for p in parts[1:] if p[:1] == "b"))
            tokens = ctx.batches[k].tokens
            b, T = tokens.shape
            c = 8 * cfg.d_model**2 + 4 * cfg.d_model * cfg.d_mlp + 4 * T * cfg.d_model
            u = 2 * cfg.d_model * cfg.vocab_size
            if kind == "base":
                out.append(float(b * T * (cfg.n_layers * c + u)))
            else:
                l = int(parts[-1][1:])
                out.append(float(ctx.model.h[l].attn.n_heads * b * T * ((cfg.n_layers - l) * c + u)))
        return out

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> FamilyScores:
        """ΔNLL per head = Σ_w (ablated NLL sum_w − baseline NLL sum_w) / Σ_w n_w, and its bootstrap replicates."""
        n_batches = len(ctx.batches)
        base = torch.tensor([s for k in range(n_batches) for s in results[f"base/w/b{k}"]], dtype=torch.float64)  # [W]
        n = torch.cat([b.mask.sum(1) for b in ctx.batches]).double()  # [W] scored tokens
        out = FamilyScores(side=SideOutputs(baseline_nll=float(base.sum() / n.sum()), baseline_tokens=int(n.sum())))
        for m in self.methods:
            if m in ctx.methods:
                per_batch = [[row for l in ctx.model.active_layers for row in results[f"{m}/w/b{k}/L{l}"]]
                             for k in range(n_batches)]  # [batches][H][b]
                ablated = torch.cat([torch.tensor(rows, dtype=torch.float64).T for rows in per_batch])  # [W, H]
                delta = ablated - base.unsqueeze(1)  # [W, H] per-window NLL change (sums)
                out.scores[m] = delta.sum(0) / n.sum()
                out.replicates[m] = ratio(delta, n)
        return out
