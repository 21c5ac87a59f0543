"""``curve --recover``: every pruned point of a curve fine-tuned before it is evaluated."""

from __future__ import annotations

import pandas as pd
import torch

from headprune.io.progress import NoProgress, Progress
from headprune.models.gpt2 import GPT2
from headprune.pruning.options import NO_COMPENSATION, Compensation, CurveOptions, Recovery


def recovered_curves(
    model: GPT2,
    ids: torch.Tensor,
    scores: pd.DataFrame,
    variants: list[tuple[str, str]],
    options: CurveOptions,
    compensation: Compensation = NO_COMPENSATION,
    train_ids: torch.Tensor | None = None,
    steps: int = 0,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> pd.DataFrame:
    """:func:`headprune.pruning.curves.pruning_curves` with the same ``options`` and ``compensation`` (intervals,
    fills, learned head sets, selection), every pruned model fine-tuned ``steps`` steps on ``train_ids`` (the default
    :class:`headprune.pruning.finetune.Recipe`, seeded by ``options.selection.seed``) before it is evaluated; random
    is left out (one ranking per fraction and method is enough to compare before and after)."""
    from headprune.pruning.curves import pruning_curves
    from headprune.pruning.finetune import Recipe, finetune
    from headprune.schema import RANDOM

    assert train_ids is not None and steps > 0
    recipe = Recipe(steps=steps, seed=options.selection.seed)
    recovery = Recovery(steps, lambda pruned: finetune(pruned, train_ids, recipe, show_progress=False))
    kept = [v for v in variants if v[0] != RANDOM]
    return pruning_curves(model, ids, scores, kept, options, compensation, progress, show_progress, recovery)
