"""Resample ablation (abl_resample): the NLL change when head i outputs what it outputs on another window.

For window w and draw s = 1..K, a source window v_s(w) ≠ w at least as long as w is drawn (seeded), and

    z_i(t) := z_i(t; v_s(w))   at every position t of w          (the unablated model's z on v's first |w| tokens)
    abl_resample_i = 1/K Σ_s Σ_w (NLL_w(ablated by draw s) − NLL_w) / Σ_w n_w     (nats/token)

as in causal scrubbing's resampling: unlike a zero or mean fill, the head's output stays on the distribution
of its real outputs and only the information it carries about this window is removed. A window's first |w|
positions of a longer v are v's prefix (attention is causal), so every window has a source. The sweep is
the ablation family's (:mod:`.ablation`): a batch's cached residual stream, several ablated copies a forward;
the fill is per example and position (the source z), gate 0 for the ablated head.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from headprune.bootstrap import ratio
from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.hooks import Capture
from headprune.perplexity import Batch
from headprune.schema import RESAMPLE_METHODS
from headprune.scoring.ablation import AblationScores, ablate_layer, cache_batch
from headprune.scoring.base import Family, FamilyScores, ScoringContext, Unit

RESAMPLE_DRAWS = 4  # K: source windows drawn per window


def resample_sources(lengths: list[int], draws: int, seed: int) -> list[list[int]]:
    """[draws][W]: the source window of every window (global index, batch order) in each draw: uniform over
    the other windows at least as long, from a generator seeded by (seed, draw)."""
    if len(lengths) < 2:
        raise HeadpruneError("resample ablation needs at least 2 scoring windows; score more tokens or use a "
                             "shorter seq_len")
    out = []
    for s in range(draws):
        rng = np.random.default_rng([seed, s])
        row = []
        for w, n in enumerate(lengths):
            candidates = [v for v, m in enumerate(lengths) if v != w and m >= n]
            row.append(candidates[int(rng.integers(len(candidates)))])
        out.append(row)
    return out


@torch.no_grad()
def source_z(model: HeadModel, tokens: Tensor) -> dict[int, Tensor]:
    """z[l] (b,h,T,d_k) of the unablated model on source tokens (b, T)."""
    capture = Capture()
    model.run_blocks(model.embed(tokens.to(model.device)), capture=capture)
    return capture.z


def resample_layer(model: HeadModel, batch: Batch, resid_pre: Tensor, layer: int, z_source: Tensor,
                   rows: int = 8) -> list[list[float]]:
    """Ablated NLL sum of each window of the batch with each head of ``layer`` resampled from z_source
    (b,h,T,d_k), one head at a time: [h][b] (:func:`~.ablation.ablate_layer` with a per-window fill)."""
    return ablate_layer(model, batch, resid_pre, layer, z_source, rows)


class ResampleScores(Family):
    """abl_resample: per batch a baseline unit and, per draw and layer, a unit for its heads."""

    name = "resample"
    methods = RESAMPLE_METHODS

    def _key(self, ctx: ScoringContext, k: int, s: int, l: int) -> str:
        return f"abl_resample/K{ctx.resample_draws}/s{ctx.resample_seed}/w/b{k}/d{s}/L{l}"

    def units(self, ctx: ScoringContext) -> list[Unit]:
        model, batches = ctx.model, ctx.batches
        lengths = [b.tokens.shape[1] for b in batches for _ in range(len(b.tokens))]
        starts = np.cumsum([0] + [len(b.tokens) for b in batches])
        windows = [(k, j) for k, b in enumerate(batches) for j in range(len(b.tokens))]
        sources = resample_sources(lengths, ctx.resample_draws, ctx.resample_seed)
        memo: dict[Any, Any] = {}

        def cache(k: int) -> tuple[dict[int, Tensor], list[float]]:
            if ("base", k) not in memo:
                memo.clear()  # one batch at a time: its residual stream and its draws' source z
                memo[("base", k)] = cache_batch(model, batches[k])
            return memo[("base", k)]

        def sources_z(k: int, s: int) -> dict[int, Tensor]:
            cache(k)
            if ("z", s) not in memo:
                T = batches[k].tokens.shape[1]
                picked = [windows[v] for v in sources[s][starts[k] : starts[k + 1]]]
                tokens = torch.stack([batches[kk].tokens[j, :T] for kk, j in picked])
                memo[("z", s)] = source_z(model, tokens)
            return memo[("z", s)]

        def base(k: int) -> list[float]:
            return cache(k)[1]

        def ablate(k: int, s: int, l: int) -> list[list[float]]:
            z = sources_z(k, s)[l]
            return resample_layer(model, batches[k], cache(k)[0][l], l, z, ctx.ablation_rows)

        units: list[Unit] = []
        for k in range(len(batches)):
            units.append((f"base/w/b{k}", partial(base, k)))
            units += [(self._key(ctx, k, s, l), partial(ablate, k, s, l))
                      for s in range(ctx.resample_draws) for l in model.active_layers]
        return units

    def costs(self, ctx: ScoringContext, units: list[Unit]) -> list[float]:
        """As the ablation sweep's (:meth:`AblationScores.costs`): a unit reruns layers l..L−1 for its heads."""
        return AblationScores().costs(ctx, units)

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> FamilyScores:
        """ΔNLL per head = 1/K Σ_s Σ_w (ablated_s,w − base_w) / Σ_w n_w, with bootstrap replicates over windows."""
        n_batches, layers = len(ctx.batches), ctx.model.active_layers
        base = torch.tensor([s for k in range(n_batches) for s in results[f"base/w/b{k}"]], dtype=torch.float64)
        n = torch.cat([b.mask.sum(1) for b in ctx.batches]).double()  # [W]
        draws = []
        for s in range(ctx.resample_draws):
            per_batch = [[row for l in layers for row in results[self._key(ctx, k, s, l)]] for k in range(n_batches)]
            draws.append(torch.cat([torch.tensor(rows, dtype=torch.float64).T for rows in per_batch]))  # [W, H]
        delta = torch.stack(draws).mean(0) - base.unsqueeze(1)  # [W, H]: per window, averaged over the draws
        return FamilyScores(scores={"abl_resample": delta.sum(0) / n.sum()},
                            replicates={"abl_resample": ratio(delta, n)})
