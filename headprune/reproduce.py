"""The three commands that reproduce one point of a run's curves table: score the heads on the scoring data, prune
the lowest fraction by one ranking, evaluate the pruned model on the evaluation data.

Every command reads `run`'s defaults (the token budget, windows, splits), so only what the run was given differs
from a default is spelled out."""

from __future__ import annotations

import shlex

from headprune.schema import DEFAULT_MAX_TOKENS, split_ranking


def reproduce_commands(settings, ranking: str, fraction: float, scores: str = "out/scores.csv",
                       pruned: str = "out/pruned") -> list[str]:
    """``headprune score``, ``prune`` and ``eval`` command lines (shell-quoted) whose perplexity is the curves
    table's (``ranking``, ``fraction``, compensation ``none``) point of a run with ``settings``
    (:class:`headprune.stages.settings.RunSettings`). ``ranking``: a method or ``<method>@layer``. They write under
    ``out/``, as the README's recipes do."""
    model = ["--model", settings.model]
    dtype = ["--dtype", settings.dtype] if settings.dtype != "fp32" else []
    loading = [*dtype, *(["--fold-value-bias"] if settings.fold_value_bias else [])]  # the export holds the fold
    windows = [*(["--seq-len", str(settings.seq_len)] if settings.seq_len else []),
               *(["--stride", str(settings.stride)] if settings.stride else []),
               *(["--max-tokens", str(settings.max_tokens or 0)] if settings.max_tokens != DEFAULT_MAX_TOKENS else [])]
    method, _ = split_ranking(ranking)
    score = ["score", *model, *loading, "--data", settings.score_data, *windows, "--methods", method,
             "--out", scores]
    prune = ["prune", *model, *loading, "--scores", scores, "--method", ranking, "--fraction", f"{fraction:g}",
             "--out", pruned]
    evaluate = ["eval", "--model", pruned, *dtype, "--data", settings.data, *windows]
    return [shlex.join(["headprune", *argv]) for argv in (score, prune, evaluate)]
