"""Made-up scores and curves tables with known answers, shared by the report tests."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

PNG = b"\x89PNG\r\n\x1a\n"
METHODS = ["wo_fro", "entropy", "taylor", "abl_zero", "abl_mean"]
FRACTIONS = [0.0, 1 / 12, 3 / 12, 6 / 12]  # 0, 1, 3, 6 of 12 heads; 10% and 30% are read at the nearest
SLOPES = {"taylor": 1.0, "abl_mean": 1.5, "wo_fro": 2.0, "random": 3.0}  # delta_nll per fraction: taylor best
SETTINGS = {"model": "tiny", "score_data": "corpus-A:train", "eval_data": "corpus-B:test", "seq_len": 64,
            "timings": {"score_s": 1.5}}
BASELINE = {"tokens": 1000, "nll": 3.0, "ppl": math.exp(3.0)}


def make_scores(layers=3, heads=4, methods=METHODS, seed=0, fingerprint="0123456789"):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame([{"layer": l, "head": h, "head_id": f"L{l}H{h}", "model_fingerprint": fingerprint}
                       for l in range(layers) for h in range(heads)])
    truth = rng.gamma(2.0, 0.5, len(df))
    for m in methods:
        df[m] = truth if m == "abl_zero" else truth * rng.uniform(0.2, 1.0) + rng.normal(0, 0.5, len(df))
    if "taylor" in methods and len(df) > 5:
        df.loc[5, "taylor"] = 0.3  # (a NaN score is refused by check_scores: issue 26)
    return df


def curve_row(method, comp, fraction, delta, n_heads=12):
    nll = 3.0 + delta
    is_random = method == "random"
    return {"method": method, "compensation": comp, "fraction": fraction, "heads_pruned": round(fraction * n_heads),
            "params": 10_000 - round(fraction * n_heads) * 100, "nll": nll, "ppl": math.exp(nll), "delta_nll": delta,
            "delta_ppl": math.exp(nll) - math.exp(3.0), "nll_std": 0.05 if is_random else np.nan,
            "ppl_std": 0.1 * math.exp(nll) if is_random else np.nan, "n_seeds": 5 if is_random else 1}


def make_curves():
    rows = [curve_row(m, "none", f, s * f) for m, s in SLOPES.items() for f in FRACTIONS]
    rows += [curve_row("taylor", "mean", f, 0.5 * f) for f in FRACTIONS]
    return pd.DataFrame(rows).assign(model_fingerprint="0123456789")


def auc_by_ranks(score, positive):
    """Mann-Whitney: (sum of positives' average ranks - P(P+1)/2) / (P N)."""
    ranks = stats.rankdata(score)
    p, n = positive.sum(), (~positive).sum()
    return (ranks[positive].sum() - p * (p + 1) / 2) / (p * n)
