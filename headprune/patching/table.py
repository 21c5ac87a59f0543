"""Patching results as tidy tables: one row per head (like ``score``), and how well each approximation agrees.

Per head and method, the normalised effect (m − m_corrupt)/(m_clean − m_corrupt) of :class:`~.exact.Patching`
with its 95% percentile interval over bootstrap resamples of the pairs (:mod:`headprune.bootstrap`).

Agreement of an approximation a with exact patching e, on what each head moves, |change| (the normalised
effect minus the unpatched run's: AtP* estimates a magnitude only):

    spearman    Spearman ρ of |change_a| and |change_e| over heads, with its interval from the same pair
                resamples for both methods
    recall@k    |top_k(a) ∩ top_k(e)| / k, the share of the k heads exact patching ranks first that a finds
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr

from headprune.bootstrap import DEFAULT_REPLICATES, interval, window_counts
from headprune.io.fingerprint import model_fingerprint
from headprune.models.gpt2 import GPT2
from headprune.models.heads import head_id
from headprune.patching.exact import Patching


def _counts(n_pairs: int, bootstrap: int, seed: int) -> torch.Tensor:
    return window_counts(n_pairs, bootstrap, seed)


def patch_table(model: GPT2, results: list[Patching], bootstrap: int = DEFAULT_REPLICATES, seed: int = 0
                ) -> pd.DataFrame:
    """layer, head, head_id, model_fingerprint, then per result its method's normalised effect [and interval]."""
    heads = model.head_ids
    table = pd.DataFrame({"layer": [l for l, _ in heads], "head": [h for _, h in heads],
                          "head_id": [head_id(l, h) for l, h in heads], "model_fingerprint": model_fingerprint(model)})
    for r in results:
        if r.values.dim() != 2:
            raise ValueError(f"{r.method} is by position; use position_table")
        table[r.method] = r.effect.tolist()
        if bootstrap:
            table[f"{r.method}_ci_lo"], table[f"{r.method}_ci_hi"] = interval(
                r.replicates(_counts(len(r.m_clean), bootstrap, seed)))
    return table


def position_table(model: GPT2, results: list[Patching]) -> pd.DataFrame:
    """By-position results as a long table: layer, head, head_id, position, then per result its method's
    normalised effect (each result [H, T] on the same pairs)."""
    heads = model.head_ids
    H, T = results[0].values.shape[1:]
    table = pd.DataFrame({"layer": [heads[i][0] for i in range(H) for _ in range(T)],
                          "head": [heads[i][1] for i in range(H) for _ in range(T)],
                          "head_id": [head_id(*heads[i]) for i in range(H) for _ in range(T)],
                          "position": [t for _ in range(H) for t in range(T)]})
    for r in results:
        table[r.method] = r.effect.reshape(-1).tolist()
    return table


def _moves(r: Patching, replicate: torch.Tensor) -> np.ndarray:
    """|change| of replicate effects [B, H]."""
    return (replicate - (0.0 if r.direction == "denoise" else 1.0)).abs().numpy()


def recall_at_k(estimate: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Share of truth's top-k (largest) that estimate's top-k holds."""
    top = lambda x: set(np.argsort(-x, kind="stable")[:k].tolist())
    return len(top(estimate) & top(truth)) / k


def agreement(exact: Patching, approximations: list[Patching], k: int | None = None,
              bootstrap: int = DEFAULT_REPLICATES, seed: int = 0) -> pd.DataFrame:
    """One row per approximation: method, spearman [ci], k, recall_at_k [ci] against ``exact`` (same pairs)."""
    H = exact.values.shape[1]
    k = k or max(1, round(0.1 * H))
    ones = torch.ones(1, len(exact.m_clean), dtype=torch.float64)
    counts = _counts(len(exact.m_clean), bootstrap, seed) if bootstrap else None
    truth = _moves(exact, exact.replicates(ones))[0]
    truth_b = _moves(exact, exact.replicates(counts)) if counts is not None else None
    rows = []
    for a in approximations:
        est = _moves(a, a.replicates(ones))[0]
        row = {"method": a.method, "exact": exact.method, "spearman": float(spearmanr(est, truth).statistic),
               "k": k, "recall_at_k": recall_at_k(est, truth, k)}
        if counts is not None and truth_b is not None:
            est_b = _moves(a, a.replicates(counts))
            rho = [spearmanr(e, t).statistic for e, t in zip(est_b, truth_b)]
            rec = [recall_at_k(e, t, k) for e, t in zip(est_b, truth_b)]
            (row["spearman_ci_lo"], row["spearman_ci_hi"]), (row["recall_ci_lo"], row["recall_ci_hi"]) = (
                tuple(float(x) for x in interval(np.asarray(v))) for v in (rho, rec))
        rows.append(row)
    return pd.DataFrame(rows)
