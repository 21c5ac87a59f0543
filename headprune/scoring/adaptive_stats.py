"""The statistics of an adaptive exact ranking (:mod:`.adaptive`), numpy only: each head's ΔL and its
simultaneous interval from per-window paired differences, and which heads an interval set certifies in or out of
a top K, with each head's rank interval.

With d_w the ablated − unablated NLL sum of window w and t_w its scored tokens (paired: the same window with and
without the head, so the text's own difficulty cancels), over the W windows a head was measured on:

    ΔL = Σ_w d_w / Σ_w t_w,        se = sqrt(W/(W−1) · Σ_w (d_w − ΔL·t_w)²) / Σ_w t_w

(the ratio estimator and its linearised standard error: windows are the sampled units). The interval is
ΔL ± t_{1−α/2, W−1}·se with α = (1 − level)/tests: Bonferroni over every head and every round, so that all the
intervals an adaptive ranking ever computes hold together at ``level`` (normal approximation of the window mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t

from headprune.errors import HeadpruneError
from headprune.schema import ADAPTIVE_TARGETS

TARGETS = ADAPTIVE_TARGETS  # the sets of K heads a ranking certifies


def window_estimate(deltas: np.ndarray, tokens: np.ndarray) -> tuple[float, float]:
    """(ΔL, se) of one head from its per-window NLL changes ``deltas`` [W] (sums) over ``tokens`` [W] scored
    tokens (the module docstring's ratio estimator; se is inf for fewer than 2 windows)."""
    total = float(tokens.sum())
    change = float(deltas.sum()) / total
    w = len(deltas)
    if w < 2:
        return change, float("inf")
    residual = deltas - change * tokens
    return change, float(np.sqrt(w / (w - 1) * np.sum(residual**2)) / total)


def half_width(se: np.ndarray, windows: np.ndarray, level: float, tests: int) -> np.ndarray:
    """t_{1−α/2, W−1}·se per head with α = (1 − level)/tests (``windows``: each head's W)."""
    alpha = (1 - level) / tests
    quantile = student_t.ppf(1 - alpha / 2, np.maximum(windows - 1, 1))
    return quantile * se


def key_interval(lo: np.ndarray, hi: np.ndarray, target: str) -> tuple[np.ndarray, np.ndarray]:
    """The interval of each head's ranking key from its ΔL interval [lo, hi]: |ΔL| for ``top`` (0 where the
    interval holds 0), −ΔL for ``prune`` (the smallest ΔL ranks first)."""
    if target == "top":
        key_lo = np.where(lo > 0, lo, np.where(hi < 0, -hi, 0.0))
        return key_lo, np.maximum(np.abs(lo), np.abs(hi))
    if target == "prune":
        return -hi, -lo
    raise HeadpruneError(f"unknown target {target!r}: give one of {', '.join(TARGETS)}", "target")


@dataclass(frozen=True)
class Decision:
    """Which heads a set of simultaneous intervals places in the top K by a key (each array [N])."""

    rank_lo: np.ndarray  # 1 + the heads whose key is surely larger
    rank_hi: np.ndarray  # 1 + the heads whose key may be larger
    status: np.ndarray  # "in" (rank_hi ≤ K), "out" (rank_lo > K) or "contested"


def decide(key_lo: np.ndarray, key_hi: np.ndarray, k: int, point: np.ndarray | None = None,
           margin: float = 0.0) -> Decision:
    """Rank intervals and top-K membership from key intervals [key_lo, key_hi] that hold together. Head n ranks at
    least 1 + #{m: key_lo_m > key_hi_n} and at most 1 + #{m ≠ n: key_hi_m ≥ key_lo_n}. With S the K largest
    ``point`` keys (default: the intervals' midpoints) and μ_K the K-th largest true key, a head of S is **in** when
    fewer than K others may exceed it by ``margin`` (1 + #{m ≠ n: key_hi_m ≥ key_lo_n + margin} ≤ K: its key is at
    least μ_K − margin), a head outside S is **out** when at least K others surely exceed it less the margin
    (#{m ≠ n: key_lo_m > key_hi_n − margin} ≥ K: its key is at most μ_K + margin), any other head **contested**.
    With margin 0: in = its worst rank is within K, out = its best rank is beyond K."""
    n_heads = len(key_lo)
    if not 0 < k < n_heads:
        raise HeadpruneError(f"top {k} of {n_heads} heads: give 1 to {n_heads - 1}", "top")
    if margin < 0:
        raise HeadpruneError(f"margin {margin} must be at least 0", "margin")
    others = ~np.eye(n_heads, dtype=bool)  # [n, m]: m ≠ n
    rank_lo = 1 + ((key_lo[None, :] > key_hi[:, None]) & others).sum(1)  # heads surely above n
    rank_hi = 1 + ((key_hi[None, :] >= key_lo[:, None]) & others).sum(1)  # heads that may reach n
    point = (key_lo + key_hi) / 2 if point is None else point
    in_s = np.zeros(n_heads, dtype=bool)
    in_s[np.argsort(-point, kind="stable")[:k]] = True
    surely_in = 1 + ((key_hi[None, :] >= key_lo[:, None] + margin) & others).sum(1) <= k
    surely_out = ((key_lo[None, :] > key_hi[:, None] - margin) & others).sum(1) >= k
    status = np.where(in_s & surely_in, "in", np.where(~in_s & surely_out, "out", "contested"))
    return Decision(rank_lo, rank_hi, status)


def window_schedule(first: int, pool: int, growth: float) -> list[int]:
    """Cumulative windows per round: ``first``, then ×``growth`` (rounded up) until the ``pool`` of windows."""
    if first < 2:
        raise HeadpruneError(f"first_windows {first}: give at least 2 (a spread needs two windows)", "first_windows")
    if growth <= 1:
        raise HeadpruneError(f"growth {growth} must exceed 1", "growth")
    if pool < first:
        raise HeadpruneError(f"first_windows {first}: the corpus holds only {pool} windows (give more tokens or "
                             "fewer first windows)", "first_windows")
    schedule = [first]
    while schedule[-1] < pool:
        schedule.append(min(pool, int(np.ceil(schedule[-1] * growth))))
    return schedule
