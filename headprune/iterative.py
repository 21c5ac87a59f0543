"""One-shot and iterative pruning to a physically smaller model (Michel et al., 2019, §6).

Iterative with S steps: after step s the model has lost round(k·(s+1)/S) of the k heads to prune
(per layer: round(k_l·(s+1)/S)); before each step the remaining heads are re-scored on the pruned model,
so a head's importance is judged without the heads already gone. With mean compensation each step folds
the means measured on the model of that step.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import pandas as pd
import torch

from .errors import HeadpruneError
from .model import GPT2
from .pruning import prune_model
from .selection import rank_heads, select_heads

Head = tuple[int, int]


def prune_iteratively(
    model: GPT2,
    rescore: Callable[[GPT2], pd.DataFrame],  # scores of the current model's heads
    method: str,
    fraction: float | None = None,
    count: int | None = None,
    steps: int = 1,
    per_layer: bool = False,
    normalize: str | None = None,
    standardize: bool = False,
    seed: int = 0,
    means: Callable[[GPT2], dict[Head, torch.Tensor]] | None = None,  # mean outputs, for compensation
) -> tuple[GPT2, list[Head]]:
    """The pruned model and the removed heads in removal order; ``steps == 1`` is one-shot pruning."""
    if steps < 1:
        raise HeadpruneError(f"--iterative {steps} must be at least 1 step")
    rank = dict(normalize=normalize, standardize=standardize, seed=seed)
    scores = rescore(model)
    target = select_heads(scores, method, fraction, count, per_layer, **rank)  # fixes how many heads go
    per_layer_total = Counter(layer for layer, _ in target)
    removed: list[Head] = []
    for step in range(steps):
        if step:
            scores = rescore(model)  # the remaining heads, judged without the ones already gone
        ranked = rank_heads(scores, method, **rank)
        if steps == 1:
            now = target
        elif per_layer:
            now = []
            for layer, total in per_layer_total.items():
                done = sum(1 for l, _ in removed if l == layer)
                now += [h for h in ranked if h[0] == layer][: round(total * (step + 1) / steps) - done]
        else:
            now = ranked[: round(len(target) * (step + 1) / steps) - len(removed)]
        fills = None
        if means is not None and now:
            all_means = means(model)
            fills = {h: all_means[h] for h in now}
        model = prune_model(model, now, fills)
        removed += now
    return model, removed
