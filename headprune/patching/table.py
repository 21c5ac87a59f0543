"""Patching results as tidy tables: one row per head (like ``score``), and how well each approximation agrees.

Per head (per KV group for k and v under grouped-query attention) and method, the normalised effect
(m − m_corrupt)/(m_clean − m_corrupt) of :class:`~.exact.Patching` with its 95% percentile
interval over bootstrap resamples of the pairs (:mod:`headprune.bootstrap`).

Agreement of an approximation a with exact patching e, on what each head moves, |change| (the normalised
effect minus the unpatched run's: AtP* estimates a magnitude only):

    spearman    Spearman ρ of |change_a| and |change_e| over heads, with its interval from the same pair
                resamples for both methods
    recall@k    |top_k(a) ∩ top_k(e)| / k, the share of the k heads exact patching ranks first that a finds
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr

from headprune.bootstrap import DEFAULT_REPLICATES, interval, window_counts
from headprune.io.read.fingerprint import model_fingerprint
from headprune.models.base import HeadModel
from headprune.patching.exact import Patching, patch_units, unit_ids


def _counts(n_pairs: int, bootstrap: int, seed: int) -> torch.Tensor:
    return window_counts(n_pairs, bootstrap, seed)


def _units(model: HeadModel, kv_heads: bool) -> pd.DataFrame:
    """One row per query head (layer, head, head_id), or per KV group (layer, kv_head, head_id ``L{l}G{g}``)."""
    units = patch_units(model, kv_heads)
    frame = pd.DataFrame({"layer": [l for l, _ in units], ("kv_head" if kv_heads else "head"): [u for _, u in units],
                          "head_id": unit_ids(model, kv_heads)})
    return frame.assign(unit="kv_group" if kv_heads else "head")


def _joined(model: HeadModel, frames: dict[bool, pd.DataFrame]) -> pd.DataFrame:
    """The query heads' rows, then the KV groups' where some result is per group, with columns ``unit`` and
    ``kv_head`` (the group a head reads, or the group itself) and ``head`` empty on group rows."""
    if set(frames) == {False}:
        return frames[False].drop(columns="unit")
    if False in frames:
        frames[False]["kv_head"] = [cast(Any, model.cfg).kv_head(h) for h in frames[False]["head"]]
    table = pd.concat(list(frames.values()), ignore_index=True)
    table["head"] = (table["head"] if "head" in table else pd.Series([pd.NA] * len(table))).astype("Int64")
    front = ["layer", "head", "kv_head", "head_id", "unit"]
    return table[front + [c for c in table.columns if c not in front]]


def patch_table(model: HeadModel, results: list[Patching], bootstrap: int = DEFAULT_REPLICATES, seed: int = 0
                ) -> pd.DataFrame:
    """layer, head, head_id, model_fingerprint, then per result its method's normalised effect [and interval];
    results per KV group (k, v under GQA) add one row per group (:func:`_joined`)."""
    frames: dict[bool, pd.DataFrame] = {False: _units(model, False)}
    for r in results:
        if r.values.dim() != 2:
            raise ValueError(f"{r.method} is by position; use position_table")
        table = frames.setdefault(r.kv_heads, _units(model, r.kv_heads))
        table[r.method] = r.effect.tolist()
        if bootstrap:
            table[f"{r.method}_ci_lo"], table[f"{r.method}_ci_hi"] = interval(
                r.replicates(_counts(len(r.m_clean), bootstrap, seed)))
    table = _joined(model, frames)
    table.insert(list(table.columns).index("head_id") + 1, "model_fingerprint", model_fingerprint(model))
    return table


def position_table(model: HeadModel, results: list[Patching]) -> pd.DataFrame:
    """By-position results as a long table: layer, head, head_id, position, then per result its method's
    normalised effect (each result [U, T] on the same pairs; rows per KV group as in :func:`patch_table`)."""
    T = results[0].values.shape[2]
    frames: dict[bool, pd.DataFrame] = {}
    for r in results:
        if r.kv_heads not in frames:
            units = _units(model, r.kv_heads)
            frames[r.kv_heads] = units.loc[units.index.repeat(T)].reset_index(drop=True).assign(
                position=list(range(T)) * len(units))
        frames[r.kv_heads][r.method] = r.effect.reshape(-1).tolist()
    return _joined(model, dict(sorted(frames.items())))


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
