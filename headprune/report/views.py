"""Narrower views of the report's tables for the page and summary.md: the CSVs keep every column and digit.

- :func:`predictiveness_view`: each statistic with its 95% interval in one cell, "ρ [lo, hi]";
- :func:`phone_summary`: the perplexity at 30% and 50% only, for a phone;
- :func:`per_row`: a table less the columns that hold one value per run;
- :func:`flatten` / :func:`settings_frame`: the nested settings as "key.subkey" rows.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from headprune.report.numbers import fixed, format_table
from headprune.report.predictiveness import joint_rows
from headprune.report.tables import TOP_PERCENT
from headprune.schema import SCORES_DIGEST, TRUTH

PRED_NOTE = (f"r2: R^2 of a linear fit of {TRUTH} on the score; spearman_rho, kendall_tau (tau-b): rank agreement; "
             f"roc_auc_top10: ROC-AUC of the score for the top {TOP_PERCENT}% heads by {TRUTH} (ceil, ties to the "
             "smaller layer/head); within_layer_rho: Spearman ρ of the ranks within each layer (each layer's mean "
             "rank removed), pooled; [lo, hi]: 95% intervals from 200 bootstrap resamplings {resamples} (the "
             "*_ci_lo/hi columns of predictiveness.csv); inverse: the ROC-AUC interval lies below 0.5 (the score "
             "ranks heads inversely). kind=description: not an importance, read its sign as a finding.")
def pred_note(pred: pd.DataFrame) -> str:
    """:data:`PRED_NOTE`, saying what each row's intervals resample (predictiveness' ``ci_resamples``)."""
    joint = joint_rows(pred)
    if not joint.any():
        resamples = "of the heads (the scoring windows' noise is not in them)"
    elif joint.all():
        resamples = f"of the scoring windows and the heads together (the data noise in them: {TRUTH}'s and each " \
                    "data score's values on the same resampled windows; a replicate's noise pulls |ρ| down, so these " \
                    "intervals lean toward 0)"
    else:
        resamples = (f"of the scoring windows and the heads together for {', '.join(pred.loc[joint, 'method'])} "
                     "(leaning toward 0: a replicate's noise pulls |ρ| down), of the heads alone for the others (no "
                     "window replicates saved for them)")
    return PRED_NOTE.format(resamples=resamples)
PRED_DECIMALS = 2
PRED_INTERVALS = {"spearman_rho": "spearman_ci", "kendall_tau": "kendall_ci", "roc_auc_top10": "roc_auc_ci",
                  "within_layer_rho": "within_layer_ci"}  # a statistic and the stem of its interval's columns
PER_RUN_COLUMNS = ("model_fingerprint", SCORES_DIGEST)  # one value per run: in the settings, not in every row


def value_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def flatten(settings: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as "key.subkey" rows, sorted; lists as comma-separated values; never raw JSON objects."""
    rows: list[tuple[str, str]] = []
    for key, value in sorted(settings.items()):
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows += flatten(value, name + ".")
        elif isinstance(value, list):
            rows.append((name, ", ".join(value_text(v) for v in value)))
        else:
            rows.append((name, "n/a" if value is None else value_text(value)))
    return rows


def settings_frame(settings: dict, fingerprint: str) -> pd.DataFrame:
    """The settings as rows, less the model fingerprint where the Model fact already names it."""
    rows = [(k, v) for k, v in flatten(settings) if not (k == "model_fingerprint" and v == fingerprint)]
    return pd.DataFrame(rows, columns=["setting", "value"])


def per_row(df: pd.DataFrame) -> pd.DataFrame:
    """A table for the page without the columns that hold one value per run (the settings show it once)."""
    return df.drop(columns=[c for c in PER_RUN_COLUMNS if c in df.columns])


def predictiveness_view(pred: pd.DataFrame) -> pd.DataFrame:
    """``predictiveness`` for the page: each statistic and its 95% interval in one cell, "ρ [lo, hi]" at 2 decimals
    (the statistics lie in [-1, 1] and their intervals are tenths wide), so the 17 columns of the CSV fit 1400 px
    as 9; the CSV keeps every digit."""
    out = format_table(pred.drop(columns=["ci_resamples"], errors="ignore"))  # said in :func:`pred_note`
    for stat, stem in PRED_INTERVALS.items():
        lo, hi = f"{stem}_lo", f"{stem}_hi"
        if not {stat, lo, hi} <= set(pred.columns):
            continue
        values = pred[[stat, lo, hi]].to_numpy(float)  # [methods, 3]
        text = [[fixed(x, PRED_DECIMALS) for x in row] for row in values]
        out[stat] = [v if np.isnan(row).any() else f"{v} [{a}, {b}]" for (v, a, b), row in zip(text, values)]
        out = out.drop(columns=[lo, hi])
    return out


def phone_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The perplexity at 30% and 50% only, compensation folded into the ranking's name: narrow enough for a phone."""
    wanted = [c for c in ("ppl@30%", "ppl@50%") if c in summary.columns]
    name = [m if comp == "none" else f"{m} ({comp}-comp.)" for m, comp in zip(summary["method"],
                                                                              summary["compensation"])]
    return pd.DataFrame({"ranking": name, **{c: summary[c].to_numpy() for c in wanted}})
