"""``curve --recover``: every pruned point of a curve fine-tuned before it is evaluated."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.pruning.options import NO_COMPENSATION, Compensation, CurveOptions, Recovery, RecoveryData


def recovered_curves(
    model: HeadModel,
    data: RecoveryData,
    scores: pd.DataFrame,
    variants: list[tuple[str, str]],
    options: CurveOptions,
    compensation: Compensation = NO_COMPENSATION,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> pd.DataFrame:
    """:func:`headprune.pruning.curves.pruning_curves` on ``data.ids`` with the same ``options`` and ``compensation``
    (intervals, fills, learned head sets, selection), every pruned model fine-tuned ``data.steps`` steps on
    ``data.train_ids`` (the default :class:`headprune.pruning.finetune.Recipe`, seeded by ``options.selection.seed``)
    before it is evaluated; random is left out (one ranking per fraction and method is enough to compare before and
    after)."""
    from headprune.pruning.curves import pruning_curves
    from headprune.pruning.finetune import Recipe, finetune
    from headprune.schema import RANDOM

    assert data.steps > 0
    recipe = Recipe(steps=data.steps, seed=options.selection.seed)
    recovery = Recovery(data.steps, lambda pruned: finetune(pruned, data.train_ids, recipe, show_progress=False))
    kept = [v for v in variants if v[0] != RANDOM]
    return pruning_curves(model, data.ids, scores, variants=kept, options=replace(options, recovery=recovery),
                          compensation=compensation, progress=progress, show_progress=show_progress)
