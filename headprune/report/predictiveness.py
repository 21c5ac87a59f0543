"""How well each score predicts ``abl_zero`` (the predictiveness table), with intervals over the heads, and over the
scoring windows with them where the scores' window replicates are given (:mod:`.head_bootstrap`)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression

from headprune.errors import HeadpruneError
from headprune.report.head_bootstrap import WindowReplicates, head_bootstrap, within_layer
from headprune.report.tables import rank_stats, roc_auc, top_count, top_heads_mask, varies
from headprune.schema import DESCRIPTIVE, METHOD_SPECS, TRUTH, method_columns
from headprune.table_checks import check_scores

PREDICTIVENESS_COLUMNS = ("method", "kind", "n", "r2", "spearman_rho", "spearman_ci_lo", "spearman_ci_hi",
                          "kendall_tau", "kendall_ci_lo", "kendall_ci_hi", "roc_auc_top10", "roc_auc_ci_lo",
                          "roc_auc_ci_hi", "inverse", "within_layer_rho", "within_layer_ci_lo", "within_layer_ci_hi",
                          "ci_resamples")
INTERVAL_COLUMNS = ("spearman_ci_lo", "spearman_ci_hi", "kendall_ci_lo", "kendall_ci_hi", "roc_auc_ci_lo",
                    "roc_auc_ci_hi")
JOINT = "windows and heads"  # predictiveness' ci_resamples where the scoring windows were resampled with the heads


def top_rows(scores: pd.DataFrame, Y: np.ndarray) -> np.ndarray:
    """[B, H] bool: :func:`top_heads_mask` of each row of Y [B, H] (the truth on a resample of the windows)."""
    layer, head = scores["layer"].to_numpy(), scores["head"].to_numpy()
    out = np.zeros(Y.shape, bool)
    for row, y in zip(out, Y, strict=True):
        finite = np.flatnonzero(np.isfinite(y))
        row[finite[np.lexsort((head[finite], layer[finite], -y[finite]))[:top_count(len(finite))]]] = True
    return out


def _predict_row(method: str, x: np.ndarray, truth: np.ndarray, positive: np.ndarray, layers: np.ndarray,
                 windows: WindowReplicates | None = None) -> dict:
    ok = np.isfinite(x) & np.isfinite(truth)
    x, y, pos, layers = x[ok], truth[ok], positive[ok], layers[ok]
    if windows is not None:  # the same heads' columns of the window replicates
        windows = WindowReplicates(None if windows.x is None else windows.x[:, ok], windows.y[:, ok],
                                   windows.positive[:, ok])
    row: dict[str, str | int | float | bool] = {
        "method": method, "kind": "description" if method in DESCRIPTIVE else "importance", "n": int(ok.sum())
    }
    both_vary = varies(x) and varies(y)
    if both_vary:
        row["r2"] = float(LinearRegression().fit(x[:, None], y).score(x[:, None], y))
    else:
        row["r2"] = math.nan
    row["spearman_rho"], row["kendall_tau"] = rank_stats(x, y)
    row["roc_auc_top10"] = roc_auc(x, pos)
    intervals = head_bootstrap(x, y, pos, windows=windows) if both_vary else dict.fromkeys(INTERVAL_COLUMNS, math.nan)
    row |= intervals
    row["inverse"] = bool(intervals["roc_auc_ci_hi"] < 0.5)  # the whole interval below chance: ranks heads inversely
    within = within_layer(x, y, layers, windows=windows) if both_vary else (math.nan,) * 3
    row["within_layer_rho"], row["within_layer_ci_lo"], row["within_layer_ci_hi"] = within
    row["ci_resamples"] = JOINT if windows is not None else "heads"
    return row


def joint_rows(pred: pd.DataFrame) -> pd.Series:
    """Per predictiveness row: True where its intervals resample the scoring windows with the heads."""
    return pred["ci_resamples"] == JOINT if "ci_resamples" in pred.columns else pd.Series(False, index=pred.index)


def aligned(scores: pd.DataFrame, replicates: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``replicates`` [B, H], their columns ``scores``' rows, reordered as :func:`check_scores` sorts the rows (by
    layer, head); HeadpruneError where a width is not the table's."""
    bad = [m for m, v in replicates.items() if np.ndim(v) != 2 or np.shape(v)[1] != len(scores)]
    if bad:
        raise HeadpruneError(f"the window replicates of {', '.join(bad)} are not one column per head of the scores "
                             f"table ({len(scores)} heads)")
    order = np.lexsort((scores["head"].to_numpy(), scores["layer"].to_numpy()))  # a stable sort, as check_scores
    return {m: np.asarray(v, dtype=float)[:, order] for m, v in replicates.items()}


def predictiveness(scores: pd.DataFrame, replicates: Mapping[str, np.ndarray] | None = None) -> pd.DataFrame:
    """How well each score predicts abl_zero, one row per method column but abl_zero (empty without abl_zero).

    r2: R^2 of the least-squares line abl_zero ~ score; spearman_rho, kendall_tau (tau-b): rank agreement;
    roc_auc_top10: ROC-AUC of the score for the top-10% heads by abl_zero (NaN if one class). ``*_ci_lo/hi``:
    95% bootstrap intervals over heads (:func:`head_bootstrap`), and over the scoring windows with them where
    ``replicates`` holds abl_zero's window replicates [B, H] (columns: the table's rows; and the score's, for a score
    that reads data:
    ``ci_resamples`` says which); ``inverse``: the ROC-AUC interval lies below 0.5; ``within_layer_rho`` and its
    interval: ρ of the ranks within each layer (:func:`within_layer`: heads compared with the heads of their own
    layer only). Rows use the heads where both values are finite; entropy is marked kind=description (its sign
    carries no importance claim).
    """
    raw, scores = scores, check_scores(scores)
    if TRUTH not in scores.columns:
        return pd.DataFrame(columns=PREDICTIVENESS_COLUMNS)
    truth, positive = scores[TRUTH].to_numpy(float), top_heads_mask(scores)
    layers = scores["layer"].to_numpy()
    replicates = aligned(raw, replicates or {})
    truth_rows = replicates.get(TRUTH)
    positive_rows = top_rows(scores, truth_rows) if truth_rows is not None else None
    rows = []
    for m in method_columns(scores):
        if m == TRUTH:
            continue
        if truth_rows is None or positive_rows is None or (METHOD_SPECS[m].data_dependent and m not in replicates):
            windows = None  # a data-dependent score without its window replicates: the heads alone
        else:
            windows = WindowReplicates(replicates.get(m), truth_rows, positive_rows)
        rows.append(_predict_row(m, scores[m].to_numpy(float), truth, positive, layers, windows))
    return pd.DataFrame(rows, columns=PREDICTIVENESS_COLUMNS)
