"""The report's numbers: methods ranked by their curves, perplexity at 10/30/50%, rank statistics, top heads (the
predictiveness table: :mod:`.predictiveness`).

Every function takes validated tables (:func:`headprune.table_checks.check_scores` / ``check_curves``).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from scipy import stats

from headprune.errors import HeadpruneError
from headprune.pruning.selection import rank_heads, select_heads
from headprune.schema import COMPENSATIONS, DESCRIPTIVE, RANDOM, TRUTH, method_columns, rank_columns
from headprune.table_checks import check_curves

SUMMARY_FRACTIONS = (0.1, 0.3, 0.5)
BEST_MAX_FRACTION = 0.5
TOP_PERCENT = 10  # the ROC-AUC positives: the ceil(10%) heads with the largest abl_zero
TOP_HEADS = 10
FRACTION_TOL = 1e-9


def groups(curves: pd.DataFrame):
    """(method, compensation) and its rows sorted by fraction, in report order (curves already checked)."""
    return [(key, g) for key, g in curves.groupby(["method", "compensation"], sort=False)]


def check_baseline(baseline) -> dict:
    """{"tokens", "nll", "ppl"} as numbers (and "bytes" where given); one of nll and ppl gives the other."""
    if not isinstance(baseline, dict) or (baseline.get("nll") is None and baseline.get("ppl") is None):
        raise HeadpruneError("baseline must be a dict with nll and ppl (tokens optional)")
    try:
        nll = float(baseline["nll"]) if baseline.get("nll") is not None else math.log(float(baseline["ppl"]))
        ppl = float(baseline["ppl"]) if baseline.get("ppl") is not None else math.exp(nll)
        tokens = int(baseline["tokens"]) if baseline.get("tokens") is not None else None
        n_bytes = int(baseline["bytes"]) if baseline.get("bytes") is not None else None
    except (TypeError, ValueError, OverflowError):
        raise HeadpruneError(f"baseline {baseline} must hold numbers (tokens, nll, ppl, bytes)") from None
    return {"tokens": tokens, "nll": nll, "ppl": ppl} | ({"bytes": n_bytes} if n_bytes is not None else {})


def bpb_factor(baseline: dict) -> float | None:
    """Bits per byte per nat/token: tokens / (ln 2 · bytes), so bpb = nll · factor (None without bytes or tokens).

    Every curve point is measured on the baseline's text, so one factor serves them all.
    """
    tokens, n_bytes = baseline.get("tokens"), baseline.get("bytes")
    return tokens / (math.log(2) * n_bytes) if tokens and n_bytes else None


#: How far the curves' unpruned (fraction-0) NLL may lie from the baseline's: the same evaluation, so only noise.
BASELINE_TOL = 1e-4


def check_together(scores: pd.DataFrame, curves: pd.DataFrame, baseline: dict) -> None:
    """Refuse scores, curves and a baseline that do not come from one model, corpus and setting: a report of
    mixed tables would contradict itself (its baseline against its own fraction-0 point)."""
    prints = [set(t["model_fingerprint"].astype(str)) for t in (scores, curves) if "model_fingerprint" in t.columns]
    if len(prints) == 2 and prints[0] != prints[1]:
        raise HeadpruneError(f"the scores (model {min(prints[0])}) and the curves (model {min(prints[1])}) come from "
                             "different models; use the tables of one run")
    from headprune.schema import SCORES_DIGEST
    from headprune.table_checks import scores_digest

    if SCORES_DIGEST in curves.columns and (ranked := set(curves[SCORES_DIGEST].astype(str))) != {
            mine := scores_digest(scores)}:
        raise HeadpruneError(f"the curves were ranked by another scores table (digest {min(ranked)}, these scores "
                             f"{mine}): they come from another run; use the scores and curves of one run")
    everything = curves.loc[curves["fraction"] == 1, "heads_pruned"]
    if len(everything) and (n := int(everything.max())) != len(scores):
        raise HeadpruneError(f"the scores table has {len(scores)} heads but the curves' model has {n} (all pruned at "
                             "fraction 1): head rows are missing or added; use the tables of one run")
    zero = curves[(curves["fraction"] == 0) & (curves["compensation"] == "none")]
    if len(zero) and (gap := float((zero["nll"] - baseline["nll"]).abs().max())) > BASELINE_TOL:
        raise HeadpruneError(f"the curves' unpruned NLL differs from the baseline's {baseline['nll']:.4f} "
                             f"by {gap:.4f}: "
                             "they were measured on another model, corpus or setting; use the tables of one run")


def jsonable(settings) -> dict:
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise HeadpruneError(f"settings must be a dict, got {type(settings).__name__}")
    return json.loads(json.dumps(settings, default=str))


def methods_by_curves(curves: pd.DataFrame, column: str = "delta_nll") -> list[str]:
    """The non-random methods, best first: by mean ``column`` (ΔNLL on every window, or on one half:
    :mod:`.choice`) over fractions in (0, 0.5], compensation none, its finite points (ties: alphabetically), at the
    fractions every such method measured (a curve refined between grid points, :func:`refine_points`, is compared
    on the shared grid only; where the methods share none, on each one's own points). Methods without such points
    are left out."""
    curves = check_curves(curves)
    sel = curves[(curves["method"] != RANDOM) & (curves["compensation"] == "none") & (curves["fraction"] > 0)
                 & (curves["fraction"] <= BEST_MAX_FRACTION + FRACTION_TOL)]
    shared = sel.groupby("fraction")["method"].nunique() == sel["method"].nunique()
    if shared.any():
        sel = sel[sel["fraction"].isin(shared.index[shared])]
    means = sel.groupby("method")[column].mean().dropna()
    return sorted(means.index, key=lambda m: (means[m], m))


def read_at(curves: pd.DataFrame, method: str, column: str, target: float) -> tuple[float, float] | None:
    """(fraction read, ``column`` there) of ``method``'s uncompensated point nearest ``target`` (None: no point)."""
    group = curves[(curves["method"] == method) & (curves["compensation"] == "none")]
    if group.empty:
        return None
    row = nearest_row(group, target)
    return float(row["fraction"]), float(row[column])


def nearest_row(group: pd.DataFrame, target: float) -> pd.Series:
    """The row whose fraction is nearest ``target``; of two equally near, the smaller fraction."""
    dist = (group["fraction"] - target).abs().round(12).to_numpy()
    return group.iloc[np.lexsort((group["fraction"].to_numpy(), dist))[0]]


def ppl_label(target: float) -> str:
    return f"ppl@{round(100 * target)}%"


def bpb_label(target: float) -> str:
    return f"bpb@{round(100 * target)}%"


def summary_table(curves: pd.DataFrame, bpb: float | None = None) -> pd.DataFrame:
    """Perplexity at 10/30/50% of heads pruned (nearest fraction present), one row per (method, compensation).

    Columns: method, compensation, ppl@10%, ppl@30%, ppl@50% and, given ``bpb`` (:func:`bpb_factor`), bits per
    byte bpb@10%, bpb@30%, bpb@50%; random last, compensation none before mean.
    """
    curves = check_curves(curves)
    rows = []
    columns = ["method", "compensation", *map(ppl_label, SUMMARY_FRACTIONS)]
    columns += list(map(bpb_label, SUMMARY_FRACTIONS)) if bpb else []
    for (method, comp), group in groups(curves):
        row = {"method": method, "compensation": comp}
        row.update({ppl_label(t): float(nearest_row(group, t)["ppl"]) for t in SUMMARY_FRACTIONS})
        if bpb:
            row.update({bpb_label(t): float(nearest_row(group, t)["nll"]) * bpb for t in SUMMARY_FRACTIONS})
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def fraction_note(curves: pd.DataFrame) -> str:
    """Which fractions stood in for 10/30/50% where no curve point sits at the target ('' if all do)."""
    parts = []
    for target in SUMMARY_FRACTIONS:
        used = sorted({float(nearest_row(g, target)["fraction"]) for _, g in groups(curves)})
        if any(abs(u - target) > FRACTION_TOL for u in used):
            parts.append(f"{target:.0%} read at {', '.join(f'{u:.1%}' for u in used)}")
    return ("Nearest fraction present: " + "; ".join(parts) + ".") if parts else ""


def top_count(n_heads: int) -> int:
    """k = ceil(TOP_PERCENT% of ``n_heads``), in integers (0.1 * 30 is 3.0000000000000004 in floats)."""
    return -(-n_heads * TOP_PERCENT // 100)


def top_heads_mask(scores: pd.DataFrame) -> np.ndarray:
    """True for the ceil(10%) heads (of those with a finite abl_zero) with the largest abl_zero.

    Ties at the cut go to the head with the smaller (layer, head).
    """
    truth = scores[TRUTH].to_numpy(float)
    finite = np.flatnonzero(np.isfinite(truth))
    k = top_count(len(finite))
    order = np.lexsort((scores["head"].to_numpy()[finite], scores["layer"].to_numpy()[finite], -truth[finite]))
    mask = np.zeros(len(truth), bool)
    mask[finite[order[:k]]] = True
    return mask


def varies(x: np.ndarray) -> bool:
    return len(x) >= 3 and np.ptp(x) > 0


def rank_stats(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Spearman rho and Kendall tau-b of paired finite values; NaN when undefined."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if not (varies(x) and varies(y)):
        return math.nan, math.nan
    return float(stats.spearmanr(x, y).statistic), float(stats.kendalltau(x, y).statistic)


def roc_auc(x: np.ndarray, positive: np.ndarray) -> float:
    """ROC-AUC of score ``x`` for the ``positive`` heads (ties count half); NaN when one class is missing.

    The Mann-Whitney form, (Σ ranks of positives − n₊(n₊+1)/2) / (n₊ n₋) with average ranks: equal to
    sklearn's ``roc_auc_score`` and ~100x faster, which the bootstrap over heads needs."""
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if not n_pos or not n_neg:
        return math.nan
    return float((stats.rankdata(x)[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def rank_correlations(scores: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Spearman and Kendall tau-b matrices of all method columns (pairwise finite heads; NaN when undefined)."""
    methods = method_columns(scores)
    rho = pd.DataFrame(np.nan, index=methods, columns=methods)
    tau = rho.copy()
    for i, a in enumerate(methods):
        for b in methods[i:]:
            r, t = rank_stats(scores[a].to_numpy(float), scores[b].to_numpy(float))
            rho.loc[a, b] = rho.loc[b, a] = r
            tau.loc[a, b] = tau.loc[b, a] = t
    return rho, tau


def top_heads(scores: pd.DataFrame, n: int = TOP_HEADS) -> pd.DataFrame:
    """The ``n`` heads with the largest abl_zero (ties: smaller layer, head first), with their rank intervals where
    the table has them; empty without abl_zero."""
    if TRUTH not in scores.columns:
        return pd.DataFrame(columns=["rank", "head_id", "layer", "head", TRUTH])
    df = scores.dropna(subset=[TRUTH]).sort_values([TRUTH, "layer", "head"], ascending=[False, True, True])
    ranks = [c for c in rank_columns(TRUTH) if c in df.columns]  # the 95% rank interval, where the run has one
    df = df[["head_id", "layer", "head", TRUTH, *ranks]].head(n).reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def ranked_methods(scores: pd.DataFrame) -> list[str]:
    """The method columns that choose heads to prune (not the descriptions)."""
    return [m for m in method_columns(scores) if m not in DESCRIPTIVE]


def pruning_order(scores: pd.DataFrame, method: str) -> pd.DataFrame | None:
    """Layers x heads: the step at which ``method`` removes each head (1 = first; :func:`rank_heads`, global,
    no rescaling: as the curves prune). None where the method cannot rank (a NaN score)."""
    try:
        ranked = rank_heads(scores, method)
    except HeadpruneError:
        return None
    steps = pd.DataFrame([(layer, head, step) for step, (layer, head) in enumerate(ranked, 1)],
                         columns=["layer", "head", "step"])
    layers, heads = range(int(scores["layer"].max()) + 1), range(int(scores["head"].max()) + 1)
    return steps.pivot(index="layer", columns="head", values="step").reindex(index=layers, columns=heads)


def layer_counts(scores: pd.DataFrame, fractions=SUMMARY_FRACTIONS) -> pd.DataFrame:
    """Heads each method removes from each layer at each fraction: one row per method, one column per layer,
    cells "a / b / c" for the fractions in order (:func:`select_heads`, as the curves prune)."""
    layers = sorted(scores["layer"].unique())
    rows = []
    for method in ranked_methods(scores):
        try:
            chosen = [select_heads(scores, method, fraction=f) for f in fractions]
        except HeadpruneError:
            continue
        row = {"method": method}
        for layer in layers:
            row[f"layer {layer}"] = " / ".join(str(sum(h[0] == layer for h in c)) for c in chosen)
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", *(f"layer {layer}" for layer in layers)])


def baseline_from_curves(curves: pd.DataFrame) -> dict:
    """The unpruned baseline read off the curves: a fraction-0 row, else nll - delta_nll. Tokens unknown."""
    curves = check_curves(curves)
    zero = curves[curves["fraction"] == 0]
    if len(zero):
        row = zero.sort_values("compensation", key=lambda c: c.map(COMPENSATIONS.index), kind="stable").iloc[0]
        return {"tokens": None, "nll": float(row["nll"]), "ppl": float(row["ppl"])}
    nll = float((curves["nll"] - curves["delta_nll"]).median())
    return {"tokens": None, "nll": nll, "ppl": math.exp(nll)}
