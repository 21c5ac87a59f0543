"""The statistics of a verified ranking (:mod:`.verified`), numpy only: the random subsets of the unverified heads,
each head's corrected estimate and upper bound from them, and the recall of the top K that a bound certifies or a
reference sweep measures."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from headprune.errors import HeadpruneError
from headprune.patching.missed import subsample_estimates

DEFAULT_LEVEL = 0.95


def draw_subsets(n_heads: int, subsets: int, inclusion: float, seed: int) -> np.ndarray:
    """[R, N] bool: each head in exactly m = round(inclusion·R) of the R subsets (clipped to 2..R−2), the m drawn
    uniformly for each head alone. The columns are independent and every subset holds a given head with
    probability m/R whatever the other heads, so mean_in − mean_out stays unbiased under additive effects, and no
    head rests on fewer than min(m, R − m) samples on either side (Welch's degrees of freedom at least
    min(m, R − m) − 1)."""
    if subsets < 4:
        raise HeadpruneError(f"{subsets} subsets cannot hold every head in two and leave it out of two (give at least "
                             "4)", "subsets")
    m = min(max(2, round(inclusion * subsets)), subsets - 2)
    rng = np.random.default_rng(seed)
    order = np.argsort(rng.random((subsets, n_heads)), axis=0)  # a random permutation of the subsets per head
    return order < m


def corrected_estimates(masks: np.ndarray, changes: np.ndarray, estimate: np.ndarray, level: float = DEFAULT_LEVEL
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ĉ, se and u (each [N]) of the N heads in ``masks`` [R, N] from the subsets' changes [R], with ``estimate``
    [N] as the control variate: d_r = c_r − Σ_{n∈S_r} e(n), ĉ(n) = e(n) + (mean of d_r over the subsets holding n
    − mean over the others), u(n) = |ĉ(n)| + t_{1−δ/(2N), ν(n)}·se(n) (Welch's t: a head sits in few subsets)."""
    residual = changes - masks.astype(float) @ estimate
    correction, se, upper = subsample_estimates(masks, residual, level, welch=True)
    corrected = estimate + correction
    return corrected, se, np.abs(corrected) + (upper - np.abs(correction))


def certified_recall(exact: np.ndarray, upper: np.ndarray, k: int | None = None) -> float:
    """Lower bound on the recall of the true top K by |ΔL| (default K = len(``exact``)) by the K verified heads with
    the largest |ΔL| (``exact``: every verified head's), given the unverified heads' upper bounds ``upper``: with t
    the K-th largest |exact|, at most m = #{u ≥ t} unverified heads can outrank a claimed one, so at least K − m of
    the true top K are claimed."""
    k = len(exact) if k is None else k
    threshold = np.sort(np.abs(exact))[::-1][k - 1]
    return max(0, k - int((upper >= threshold).sum())) / k


def recall_at_k(exact_all: Iterable[float], verified: Iterable[bool]) -> float:
    """The share of the true top K heads by |ΔL| (``exact_all``: every head's exact ΔL, e.g. the exact sweep's
    abl_zero column) that the verified set (K = its size) contains."""
    values, chosen = np.abs(np.asarray(list(exact_all), dtype=float)), np.asarray(list(verified), dtype=bool)
    k = int(chosen.sum())
    if not 0 < k <= len(values):
        raise HeadpruneError(f"{k} verified heads of {len(values)}: nothing to compare")
    true_top = np.argsort(-values, kind="stable")[:k]
    return float(chosen[true_top].sum() / k)
