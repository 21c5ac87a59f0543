"""One-shot and iterative pruning to a physically smaller model (Michel et al., 2019, §6).

Iterative with S steps: after step s the model has lost round(k·(s+1)/S) of the k heads to prune
(per layer: round(k_l·(s+1)/S)); before each step after the first the remaining heads are re-scored on
the pruned model (with the same method, on the scoring data), so a head's importance is judged without
the heads already gone. With mean (optimal) compensation each step folds the means (the constants optimal for
ablating that step's heads together) measured on the model of that step.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.interventions import Head
from headprune.pruning.options import ONE_SHOT, PruningOptions, ScoringData
from headprune.pruning.prune import prune_model
from headprune.pruning.selection import rank_heads, select_heads
from headprune.schema import COMPENSATIONS, RANDOM, WEIGHT_METHODS
from headprune.scoring import head_means, joint_constants, score_heads


def needs_score_data(method: str, steps: int, compensate: str) -> bool:
    """Whether pruning needs scoring data: for the fills (compensation) or to re-score by a data method."""
    if compensate not in COMPENSATIONS:
        raise HeadpruneError(f"compensate {compensate!r} must be one of {', '.join(COMPENSATIONS)}")
    return compensate != "none" or (steps > 1 and method not in (*WEIGHT_METHODS, RANDOM))


def prune_iteratively(
    model: HeadModel,
    scores: pd.DataFrame,  # the unpruned model's scores (used for the first step)
    method: str,
    fraction: float | None = None,
    count: int | None = None,
    *,
    options: PruningOptions = ONE_SHOT,
    data: ScoringData | None = None,  # re-scoring and fills: see needs_score_data
    show_progress: bool = True,
) -> tuple[HeadModel, list[Head]]:
    """The pruned model and the removed heads in removal order; ``options.steps == 1`` is one-shot pruning."""
    model.require_heads("pruning by scores")
    steps, selection, compensate = options.steps, options.selection, options.compensate
    if steps < 1:
        raise HeadpruneError(f"steps {steps} must be at least 1", "steps")
    if steps > 1 and method == "gate":  # a learned column, not a scoring method: nothing can re-score it
        raise HeadpruneError("gates cannot be re-scored between iterative steps (--iterative / steps > 1): prune "
                             "by gate in one step (the learned gates), or iterate by a scoring method")
    if needs_score_data(method, steps, compensate) and data is None:
        raise HeadpruneError(f"re-scoring by {method} or compensation needs scoring data")
    score_ids, windowing = (data.ids, data.windowing) if data is not None else (None, None)

    def rescore(m: HeadModel) -> pd.DataFrame:  # the remaining heads, judged without the ones already gone
        if method == RANDOM:
            return pd.DataFrame(m.head_ids, columns=["layer", "head"])
        return score_heads(m, score_ids, [method], windowing=windowing, show_progress=show_progress).table

    target = select_heads(scores, method, fraction, count, selection)  # fixes how many heads go
    per_layer_total = Counter(layer for layer, _ in target)
    removed: list[Head] = []
    for step in range(steps):
        ranked = rank_heads(scores if step == 0 else rescore(model), method, selection)
        if steps == 1:
            now = target
        elif selection.per_layer:
            now = []
            for layer, total in per_layer_total.items():
                done = sum(1 for l, _ in removed if l == layer)
                now += [h for h in ranked if h[0] == layer][: round(total * (step + 1) / steps) - done]
        else:
            now = ranked[: round(len(target) * (step + 1) / steps) - len(removed)]
        fills = None
        if compensate != "none" and now:
            assert score_ids is not None
            if compensate == "mean":
                means = head_means(model, score_ids, windowing, show_progress=show_progress)
                fills = {h: means[h] for h in now}
            else:  # the constants optimal for removing this step's heads together, on the model of this step
                fills = joint_constants(model, score_ids, now, windowing, show_progress=show_progress)
        model = prune_model(model, now, fills)
        removed += now
    return model, removed
