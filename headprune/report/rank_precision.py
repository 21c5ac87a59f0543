"""How far the exact ranking is decided at the run's budget: each head's 95% rank interval by ``abl_zero`` over the
scoring windows (:func:`headprune.bootstrap.rank_interval`; 1 = the costliest, ranks lo..hi), read against the top
k = ceil(10%) heads (:data:`~headprune.report.tables.TOP_PERCENT`, the set the ROC-AUC and the prune's first cuts
are about):

    certainly in the top k     hi ≤ k
    certainly outside it       lo > k
    contested                  lo ≤ k < hi

and the heads whose ``abl_zero`` interval holds 0 (the sign of their effect is not decided either).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprune.report.numbers import names
from headprune.report.tables import TOP_PERCENT, top_count, top_heads
from headprune.schema import TRUTH, ci_columns, rank_columns

NAMED = 5  # the costliest heads named with their intervals


def membership(scores: pd.DataFrame) -> pd.Series:
    """Per head (the finite abl_zero rows, table order): ``in``, ``out`` or ``contested`` for the top k."""
    lo_col, hi_col = rank_columns(TRUTH)
    rows = scores[np.isfinite(scores[TRUTH].to_numpy(float))]
    k = top_count(len(rows))
    lo, hi = rows[lo_col].to_numpy(float), rows[hi_col].to_numpy(float)
    return pd.Series(np.where(hi <= k, "in", np.where(lo > k, "out", "contested")), index=rows.index)


def rank_sentence(scores: pd.DataFrame) -> str | None:
    """The finding on the ranking's precision; None without rank intervals."""
    if TRUTH not in scores.columns or not set(rank_columns(TRUTH)) <= set(scores.columns):
        return None
    status = membership(scores)
    if status.empty or not np.isfinite(scores.loc[status.index, list(rank_columns(TRUTH))].to_numpy(float)).all():
        return None
    k, count = top_count(len(status)), status.value_counts()
    lo_col, hi_col = rank_columns(TRUTH)
    top = top_heads(scores, NAMED)
    named = [f"{h} ({int(lo)}–{int(hi)})" for h, lo, hi in zip(top["head_id"], top[lo_col], top[hi_col], strict=True)]
    text = (f"By {TRUTH}'s 95% rank intervals over the scoring windows, {int(count.get('in', 0))} of the "
            f"{len(status)} heads are certainly among the top {k} ({TOP_PERCENT}%), {int(count.get('out', 0))} "
            f"certainly not, and {int(count.get('contested', 0))} are contested; the {len(named)} costliest rank "
            f"{names(named)}.")
    ci_lo, ci_hi = ci_columns(TRUTH)
    if {ci_lo, ci_hi} <= set(scores.columns):
        rows = scores.loc[status.index]
        holds_zero = int(((rows[ci_lo] <= 0) & (rows[ci_hi] >= 0)).sum())
        text += f" {holds_zero} heads' {TRUTH} intervals hold 0: the sign of their effect is not decided."
    return text
