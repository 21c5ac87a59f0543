"""Percentile bootstrap over evaluation windows (Efron & Tibshirani 1993, ch. 13), seeded and deterministic.

A replicate b draws the W windows with replacement: counts C[b, w] ~ Multinomial(W, 1/W). Every score the
toolkit computes is a function of per-window sums, so a replicate's score is that function of the
count-weighted sums, e.g. for a token-weighted mean with per-window numerators s_w and token counts n_w:

    score_b = Σ_w C[b,w] s_w / Σ_w C[b,w] n_w.

The 95% interval is the 2.5th and 97.5th percentiles of the replicates. Paired comparisons (pruned minus
unpruned NLL of the same windows) use the same counts for both terms, so window difficulty cancels.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from numbers import Integral
from typing import TYPE_CHECKING

import numpy as np

from headprune.errors import HeadpruneError

if TYPE_CHECKING:  # torch-free at import: ``headprune report`` uses :func:`interval` without torch
    from torch import Tensor

DEFAULT_REPLICATES = 200
LEVEL = 0.95

Replicate = Callable[["Tensor"], "Tensor"]  # counts [B, W] (float64) -> replicate scores [B, ...]


def check_replicates(replicates: object) -> None:
    """HeadpruneError (about ``bootstrap``) unless ``replicates`` is 0 (no intervals) or a whole number ≥ 2."""
    whole = isinstance(replicates, Integral) and not isinstance(replicates, bool)
    if not whole or replicates == 1 or replicates < 0:  # type: ignore[operator]
        raise HeadpruneError(f"bootstrap {replicates!r}: give 0 (no intervals) or at least 2 replicates", "bootstrap")


def window_counts(n_windows: int, replicates: int = DEFAULT_REPLICATES, seed: int = 0) -> Tensor:
    """[replicates, n_windows] float64: how often each window is drawn in each replicate."""
    import torch

    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n_windows, np.full(n_windows, 1.0 / n_windows), size=replicates)
    return torch.from_numpy(counts).double()


def interval(replicates: Tensor | np.ndarray | list, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over the first axis (NaN replicates ignored): (lo, hi), each of the remaining shape."""
    x = np.asarray(replicates, dtype=np.float64)
    tail = (1 - level) / 2 * 100
    with warnings.catch_warnings():  # an all-NaN column (a statistic undefined in every replicate) gives NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanpercentile(x, [tail, 100 - tail], axis=0)
    return np.asarray(lo), np.asarray(hi)


def rank_interval(replicates: Tensor | np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Each column's rank within its replicate row (1 = the largest; ties share the best rank) and its percentile
    interval over the rows, in whole ranks: (lo [H], hi [H]), the lower end rounded down and the upper up
    ("L18H6: rank 3, 95% interval 2–9"). ``replicates`` [B, H]: replicate scores, e.g. of :func:`ratio`."""
    from scipy.stats import rankdata

    ranks = rankdata(-np.asarray(replicates, dtype=np.float64), axis=1, method="min")  # [B, H]
    tail = (1 - level) / 2 * 100
    return (np.percentile(ranks, tail, axis=0, method="lower").astype(int),
            np.percentile(ranks, 100 - tail, axis=0, method="higher").astype(int))


def ratio(numerator: Tensor, denominator: Tensor) -> Replicate:
    """Replicates of Σ_w C s_w / Σ_w C n_w: numerator [W, ...] (per-window sums), denominator [W] (tokens)."""
    num = numerator.double().reshape(numerator.shape[0], -1)

    def replicate(counts: Tensor) -> Tensor:
        return ((counts @ num) / (counts @ denominator.double()).unsqueeze(1)).reshape(-1, *numerator.shape[1:])

    return replicate
