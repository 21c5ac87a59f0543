"""``curve --recover``: every pruned point of a curve fine-tuned before it is evaluated."""

from __future__ import annotations


def recovered_curves(model, train_ids, steps: int, show_progress: bool, **curve_args):
    """:func:`headprune.pruning.curves.pruning_curves` with every pruned model fine-tuned ``steps`` steps (the default
    :class:`headprune.pruning.finetune.Recipe`, seeded) before it is evaluated; random is left out (one ranking per
    fraction and method is enough to compare before and after). Training is seeded by ``curve_args["seed"]``."""
    from headprune.pruning.curves import pruning_curves
    from headprune.pruning.finetune import Recipe, finetune
    from headprune.schema import RANDOM

    recipe = Recipe(steps=steps, seed=curve_args.get("seed", 0))
    variants = [v for v in curve_args.pop("variants") if v[0] != RANDOM]
    train = lambda pruned: finetune(pruned, train_ids, recipe, show_progress=False)
    return pruning_curves(model, variants=variants, recover=train, recover_steps=steps, show_progress=show_progress,
                          **curve_args)
