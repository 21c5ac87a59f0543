"""Percentile intervals of rank agreement over resamplings of the heads, all replicates at once.

For B resamplings (with replacement) of n paired scores (x, y), each row of X, Y [B, n] is one replicate:

    Spearman ρ  = Pearson correlation of the rows' average ranks (scipy's ``spearmanr``)
    Kendall τ-b = Σ_{i<j} s_x s_y / sqrt(Σ_{i<j} |s_x| · Σ_{i<j} |s_y|),  s_x = sign(x_i − x_j)  (``kendalltau``)
    ROC-AUC     = (Σ ranks of positives − n₊(n₊+1)/2) / (n₊ n₋)                               (Mann-Whitney)

A replicate where x or y takes one value only (or n < 3) leaves ρ and τ undefined (NaN), as does a replicate
without positives or negatives for the ROC-AUC; :func:`headprune.bootstrap.interval` leaves NaNs out.

Within-layer ρ compares heads of one layer only: each score is ranked within its layer and the layer's mean rank
subtracted, ã_i = rank_l(x_i) − mean_l rank, and ρ_within = Σ ã b̃ / sqrt(Σ ã² Σ b̃²) over all heads (the pooled
Spearman ρ of within-layer ranks: for layers of equal size without ties, the mean of the per-layer ρ). A score
whose global ρ and within-layer ρ differ in sign ranks layers, not heads. Its interval resamples heads within each
layer (the layers' sizes kept).

Where the scores' values on resampled *windows* are given (``windows``, [B_w, n] each: row r the scores of every
head on the r-th resample of the scoring windows, the same resample for both; :func:`~headprune.scoring.
score_heads` keeps them), replicate b draws heads from window replicate b mod B_w instead of the point values, and
the ROC-AUC's positives are that window replicate's own top 10%: the interval then holds the data noise and the
choice of heads together (:class:`WindowReplicates`). A score that reads no data (weights) keeps its values.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats

from headprune.bootstrap import interval

HEAD_REPLICATES, HEAD_SEED = 200, 0
PAIR_CHUNK = 1 << 23  # replicate x pair elements per step of the τ-b sums (64 MiB of float64)
MAX_PAIRS = 20_000  # above n(n−1)/2 = this (n ≈ 200 heads), scipy's O(n log n) τ-b per replicate is faster


def spearman_rows(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Row-wise Spearman ρ of X, Y [B, n]: the Pearson correlation of the rows' average ranks (NaN where a row
    takes one value)."""
    a, b = stats.rankdata(X, axis=1), stats.rankdata(Y, axis=1)
    a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))


def _tau_b(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Row-wise Kendall τ-b of X, Y [B, n] over the n(n−1)/2 pairs i < j, in chunks of replicates (scipy's
    ``kendalltau`` row by row for more than :data:`MAX_PAIRS` pairs)."""
    n = X.shape[1]
    if n * (n - 1) // 2 > MAX_PAIRS:
        return np.array([stats.kendalltau(x, y).statistic for x, y in zip(X, Y, strict=True)])
    i, j = np.triu_indices(n, 1)
    out = np.empty(len(X))
    step = max(1, PAIR_CHUNK // max(1, len(i)))
    for s in range(0, len(X), step):
        sx = np.sign(X[s : s + step, i] - X[s : s + step, j])  # [b, pairs]
        sy = np.sign(Y[s : s + step, i] - Y[s : s + step, j])
        out[s : s + step] = (sx * sy).sum(1) / np.sqrt(np.abs(sx).sum(1) * np.abs(sy).sum(1))
    return out


def rank_replicates(X: np.ndarray, Y: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """[B, 3]: Spearman ρ, Kendall τ-b and ROC-AUC of each replicate row of X, Y [B, n] (finite values),
    ``positive`` [B, n] marking the ROC-AUC's positive heads."""
    varies = (np.ptp(X, axis=1) > 0) & (np.ptp(Y, axis=1) > 0) & (X.shape[1] >= 3)
    with np.errstate(invalid="ignore", divide="ignore"):
        rank_x = stats.rankdata(X, axis=1)
        rho = np.where(varies, spearman_rows(X, Y), np.nan)
        tau = np.where(varies, _tau_b(X, Y), np.nan)
        n_pos = positive.sum(1)
        n_neg = positive.shape[1] - n_pos
        auc = ((rank_x * positive).sum(1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    auc = np.where((n_pos > 0) & (n_neg > 0), auc, np.nan)
    return np.stack([rho, tau, auc], axis=1)


class WindowReplicates(NamedTuple):
    """Two scores' values on the same resamples of the scoring windows, [B_w, n] each (finite heads only): ``x``
    (None where x reads no data), the truth ``y`` and its top-10% ``positive`` per resample."""

    x: np.ndarray | None
    y: np.ndarray
    positive: np.ndarray


def drawn(values: np.ndarray, windows: np.ndarray | None, draws: np.ndarray) -> np.ndarray:
    """[B, n]: replicate b's heads ``draws[b]`` read from ``values`` [n], or from window replicate b mod B_w of
    ``windows`` [B_w, n] where given."""
    if windows is None:
        return values[draws]
    rows = windows[np.arange(len(draws)) % len(windows)]  # [B, n]
    return np.take_along_axis(rows, draws, axis=1)


def head_bootstrap(x: np.ndarray, y: np.ndarray, positive: np.ndarray, replicates: int = HEAD_REPLICATES,
                   seed: int = HEAD_SEED, windows: WindowReplicates | None = None) -> dict[str, float]:
    """95% percentile intervals of Spearman ρ, Kendall τ-b and ROC-AUC over ``replicates`` resamplings of the
    heads with replacement (finite x, y; a replicate where a statistic is undefined is left out), jointly with the
    scoring windows where ``windows`` is given (module docstring)."""
    rng = np.random.default_rng(seed)
    draws = np.stack([rng.integers(len(x), size=len(x)) for _ in range(replicates)])  # [B, n] head indices
    if windows is None:
        X, Y, P = x[draws], y[draws], positive[draws]
    else:  # each replicate's positives: its own top 10% by the resampled truth
        X, Y, P = drawn(x, windows.x, draws), drawn(y, windows.y, draws), drawn(positive, windows.positive, draws)
    lo, hi = interval(rank_replicates(X, Y, P))
    return {"spearman_ci_lo": lo[0], "spearman_ci_hi": hi[0], "kendall_ci_lo": lo[1], "kendall_ci_hi": hi[1],
            "roc_auc_ci_lo": lo[2], "roc_auc_ci_hi": hi[2]}


def within_layer_rows(X: np.ndarray, Y: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """Row-wise within-layer ρ of X, Y [B, n] (see the module docstring); ``layers`` [n] each column's layer
    (NaN where no layer varies in both)."""
    a, b = np.empty_like(X, dtype=float), np.empty_like(Y, dtype=float)
    for layer in np.unique(layers):
        cols = layers == layer
        ra, rb = stats.rankdata(X[:, cols], axis=1), stats.rankdata(Y[:, cols], axis=1)
        a[:, cols], b[:, cols] = ra - ra.mean(1, keepdims=True), rb - rb.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))
    return np.where(np.isfinite(rho), rho, np.nan)


def within_layer(x: np.ndarray, y: np.ndarray, layers: np.ndarray, replicates: int = HEAD_REPLICATES,
                 seed: int = HEAD_SEED, windows: WindowReplicates | None = None) -> tuple[float, float, float]:
    """(within-layer ρ, 95% interval lo, hi) of x, y [n] (finite), heads resampled with replacement within each
    layer, jointly with the scoring windows where their replicates are given (module docstring)."""
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(layers == layer) for layer in np.unique(layers)]
    draws = np.stack([np.concatenate([rng.choice(m, size=len(m)) for m in members]) for _ in range(replicates)])
    order = np.concatenate(members)  # draws keep each layer's block of columns in this order
    point = float(within_layer_rows(x[None, :], y[None, :], layers)[0])
    if windows is None:
        X, Y = x[draws], y[draws]
    else:
        X, Y = drawn(x, windows.x, draws), drawn(y, windows.y, draws)
    lo, hi = interval(within_layer_rows(X, Y, layers[order]))
    return point, float(lo), float(hi)
