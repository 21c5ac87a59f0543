"""How much of the KV cache can stream: per ranking, the largest share of KV heads streaming at which the model
stays within a tolerance of the full model, with a bootstrap interval; and the pattern chosen on one half of the
windows and prompts and measured on the other (cross-fitting, both ways).

At a point with per-window tail NLLs ℓ_w and per-prompt answers r_p, under window weights c_w and prompt weights
e_p (bootstrap counts, or a half's indicator):

    ΔNLL = Σ_w c_w (ℓ_w − ℓ_w^full) / Σ_w c_w          accuracy = Σ_p e_p r_p / Σ_p e_p

A share is *within* tolerance τ when exp(ΔNLL) ≤ 1 + τ (the long-window perplexity rises by at most τ) and
accuracy ≥ (1 − τ)·accuracy^full: by :data:`MEASURES`, both ("all", what the pattern is chosen by), the perplexity
alone or the accuracy alone. The largest share within τ is the last point of the run of points within τ that starts
at the full model (a share past a point outside τ does not count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from headprune.bootstrap import DEFAULT_REPLICATES, interval

TOLERANCES = (0.01, 0.05)
#: What a share must stay within: "all" (the perplexity and, where prompts were measured, the accuracy), or one alone.
MEASURES = ("all", "perplexity", "accuracy")


def _counts(n: int, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """[replicates, n] multinomial draw counts (all ones for n = 0 columns: nothing to draw)."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=replicates).astype(float) if n else np.ones((replicates, 0))


@dataclass(frozen=True)
class RankingPoints:
    """One ranking's curve: shares [S] ascending from 0, per-window tail NLL [S, W], per-prompt right [S, P]."""

    shares: np.ndarray
    nll: np.ndarray
    right: np.ndarray

    @classmethod
    def of(cls, curve: pd.DataFrame, points: dict[str, dict[str, list]], ranking: str) -> RankingPoints:
        rows = curve[curve.ranking == ranking].sort_values("n_streaming")
        return cls(rows.share.to_numpy(float), np.array([points[k]["tail_nll"] for k in rows.point], float),
                   np.array([points[k]["right"] for k in rows.point], float).reshape(len(rows), -1))

    def draws(self, replicates: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(window counts [B, W], prompt counts [B, P]) of the bootstrap: the same draws for every ranking under
        ``seed``, so the rankings' intervals resample the same windows and prompts."""
        rng = np.random.default_rng(seed)
        return _counts(self.nll.shape[1], replicates, rng), _counts(self.right.shape[1], replicates, rng)

    def measures(self, c: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ΔNLL [B, S], accuracy [B, S]) under window weights c [B, W] and prompt weights e [B, P] (accuracy NaN
        without prompts)."""
        mean = (c @ self.nll.T) / c.sum(1, keepdims=True)
        acc = (e @ self.right.T) / e.sum(1, keepdims=True) if self.right.shape[1] else np.full_like(mean, np.nan)
        return mean - mean[:, :1], acc

    def largest(self, c: np.ndarray, e: np.ndarray, tol: float, measure: str = "all") -> np.ndarray:
        """[B] the largest share within ``tol`` by ``measure`` (one of :data:`MEASURES`) under each row of
        weights."""
        delta, acc = self.measures(c, e)
        ok = np.ones(delta.shape, bool)
        if measure in ("all", "perplexity"):
            ok &= delta <= math.log1p(tol)
        if measure in ("all", "accuracy") and self.right.shape[1]:
            ok &= acc >= (1 - tol) * acc[:, :1] - 1e-12
        run = np.cumprod(ok, axis=1).sum(1)  # points within tol before the first outside it (≥ 1: the full model)
        return self.shares[np.maximum(run, 1) - 1]


def curve_table(curve: pd.DataFrame, points: dict[str, dict[str, list]], replicates: int = DEFAULT_REPLICATES,
                seed: int = 0) -> pd.DataFrame:
    """The curve with each point's tail NLL, ΔNLL against the full model and accuracy, each with its 95% interval
    (``*_lo``, ``*_hi``) from resampled windows and prompts (paired: the same draws for the point and the full
    model)."""
    out = []
    for ranking in curve.ranking.unique():
        pts = RankingPoints.of(curve, points, ranking)
        c, e = pts.draws(replicates, seed)
        delta, acc = pts.measures(np.ones((1, pts.nll.shape[1])), np.ones((1, pts.right.shape[1])))
        replicate_delta, replicate_acc = pts.measures(c, e)
        (d_lo, d_hi), (a_lo, a_hi) = interval(replicate_delta), interval(replicate_acc)
        rows = curve[curve.ranking == ranking].sort_values("n_streaming").assign(
            tail_nll=pts.nll.mean(1), delta_nll=delta[0], delta_nll_lo=d_lo, delta_nll_hi=d_hi,
            accuracy=acc[0], accuracy_lo=a_lo, accuracy_hi=a_hi)
        out.append(rows)
    return pd.concat(out, ignore_index=True)


def largest_shares(curve: pd.DataFrame, points: dict[str, dict[str, list]],
                   tolerances: Sequence[float] = TOLERANCES, replicates: int = DEFAULT_REPLICATES,
                   seed: int = 0) -> pd.DataFrame:
    """One row per (ranking, measure, tolerance): the largest streaming share within it, its 95% interval, and the
    KV heads streaming there. Measures: "all", and where prompts were measured also "perplexity" and "accuracy"
    alone (without prompts "all" is the perplexity)."""
    rows = []
    n_kv = int(curve.n_streaming.max())
    for ranking in curve.ranking.unique():
        pts = RankingPoints.of(curve, points, ranking)
        c, e = pts.draws(replicates, seed)
        ones = np.ones((1, pts.nll.shape[1])), np.ones((1, pts.right.shape[1]))
        for measure in MEASURES if pts.right.shape[1] else MEASURES[:1]:
            for tol in tolerances:
                share = float(pts.largest(*ones, tol, measure)[0])
                lo, hi = interval(pts.largest(c, e, tol, measure))
                rows.append({"ranking": ranking, "measure": measure, "tolerance": tol, "share": share,
                             "share_lo": float(lo), "share_hi": float(hi), "n_streaming": round(share * n_kv)})
    return pd.DataFrame(rows)


def with_measure(shares: pd.DataFrame) -> pd.DataFrame:
    """A shares table as :func:`largest_shares` writes it now: one written before the measures were told apart
    judged every measure together ("all")."""
    return shares if "measure" in shares else shares.assign(measure="all")


def _pick(curve: pd.DataFrame, points: dict, rankings: Sequence[str], c: np.ndarray, e: np.ndarray,
          tol: float) -> tuple[str, float]:
    """(ranking, share) with the largest share within ``tol`` under weights (c, e); ties: the smaller ΔNLL there,
    then the ranking's name; ("none", 0.0) where no ranking streams anything within ``tol``."""
    best: tuple[float, float, str] | None = None
    for ranking in rankings:
        pts = RankingPoints.of(curve, points, ranking)
        share = float(pts.largest(c, e, tol)[0])
        delta = float(pts.measures(c, e)[0][0, list(pts.shares).index(share)])
        key = (-share, delta, ranking)
        best = key if best is None or key < best else best
    assert best is not None
    return ("none", 0.0) if best[0] == 0 else (best[2], -best[0])


def cross_fit(curve: pd.DataFrame, points: dict[str, dict[str, list]], rankings: Sequence[str],
              tol: float) -> pd.DataFrame:
    """The choice of (ranking, share) made on one half of the windows and prompts (even or odd positions) and
    measured on the other, both ways: one row per fold with the choice and its held-out ΔNLL and accuracy drop."""
    pts0 = RankingPoints.of(curve, points, rankings[0])
    n_w, n_p = pts0.nll.shape[1], pts0.right.shape[1]
    halves = [(np.arange(n_w) % 2 == k, np.arange(n_p) % 2 == k) for k in (0, 1)]
    rows = []
    for fold, ((cw, ep), (hw, hp)) in enumerate([(halves[0], halves[1]), (halves[1], halves[0])]):
        ranking, share = _pick(curve, points, rankings, cw[None].astype(float), ep[None].astype(float), tol)
        pts = RankingPoints.of(curve, points, rankings[0] if ranking == "none" else ranking)
        delta, acc = pts.measures(hw[None].astype(float), hp[None].astype(float))
        s = list(pts.shares).index(share)
        rows.append({"fold": fold, "tolerance": tol, "ranking": ranking, "share": share,
                     "chosen_on": f"{int(cw.sum())} windows, {int(ep.sum())} prompts",
                     "held_out_delta_nll": float(delta[0, s]),
                     "held_out_accuracy_drop": float(acc[0, 0] - acc[0, s]) if n_p else math.nan})
    return pd.DataFrame(rows)


def choose(curve: pd.DataFrame, points: dict[str, dict[str, list]], rankings: Sequence[str],
           tol: float) -> tuple[str, float]:
    """The exported pattern's (ranking, share): :func:`cross_fit`'s rule on every window and prompt."""
    pts = RankingPoints.of(curve, points, rankings[0])
    return _pick(curve, points, rankings, np.ones((1, pts.nll.shape[1])), np.ones((1, pts.right.shape[1])), tol)
