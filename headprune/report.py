"""The report of a headprune run: which heads matter, how well the cheap scores predict it, what pruning costs.

``build_report(scores, curves, out_dir, settings, baseline)`` writes into ``out_dir``, every file atomically:

- ``scores.parquet``, ``scores.csv``: one row per head (layer, head, head_id, model_fingerprint, one column per method);
- ``curves.parquet``, ``curves.csv``: perplexity after pruning, one row per (method, compensation, fraction);
- ``predictiveness.csv``: how well each score predicts ``abl_zero`` (NLL increase when the head is zero-ablated):
  R^2 of a one-variable linear fit, Spearman rho, Kendall tau-b, ROC-AUC for finding the top 10% heads;
- ``heatmap_{method}.png``: a method's scores on the layer x head grid (grey: head missing);
- ``curves.png``: perplexity against the share of heads pruned; random as mean line with a +-1 std band;
- ``scatter_{method}.png``: each score against ``abl_zero``, Spearman rho in the title;
- ``rank_correlation.png``: Spearman and Kendall matrices of all method columns;
- ``settings.json``, ``baseline.json``: the run's settings and unpruned baseline, so the report can be rebuilt;
- ``summary.md``: settings (scoring data vs evaluation data), baseline, best method, perplexity at 10/30/50% pruned,
  predictiveness, top-10 heads by ``abl_zero``;
- ``report.html``: one self-contained page with all of the above (pictures as data: URIs, no external CSS/JS).

``rebuild_report`` redoes it from saved tables; ``run_report_command`` is the ``headprune report`` entry point.
Figures are ``matplotlib.figure.Figure`` objects rendered by Agg, never registered with pyplot (nothing to close).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from scipy import stats
from sklearn.linear_model import LinearRegression
from sklearn.metrics import roc_auc_score

from .curves import CURVE_COLUMNS
from .errors import HeadpruneError
from .scoring import DESCRIPTIVE, METHODS
from .outputs import ensure_dir, read_table, write_bytes, write_json, write_table, write_text

METHOD_LABELS = {
    "wo_fro": "Frobenius norm of the head's W_O block",
    "wo_spec": "spectral norm of the head's W_O block",
    "ov_fro": "Frobenius norm of the head's OV circuit",
    "ov_spec": "spectral norm of the head's OV circuit",
    "out_norm": "mean norm of the head's output z_i W_O^(i)",
    "fluct": "FLAP fluctuation: sum of Var(z_ij) times squared W_O row norms",
    "entropy": "mean attention entropy (nats; a description)",
    "grad": "mean |dL/dg| of the head gate (Michel et al.)",
    "taylor": "-dL/dg: first-order estimate of the NLL increase",
    "abl_zero": "NLL increase when zero-ablated (nats/token)",
    "abl_mean": "NLL increase when mean-ablated (nats/token)",
}
DESCRIPTIONS = frozenset(DESCRIPTIVE)  # describe a head; not "higher = more important"
TRUTH = "abl_zero"
RANDOM = "random"
COMPENSATIONS = ("none", "mean")
SCORE_COLUMNS = ("layer", "head", "head_id", "model_fingerprint")
CURVE_INTS = ("heads_pruned", "params", "n_seeds")
PREDICTIVENESS_COLUMNS = ("method", "kind", "n", "r2", "spearman_rho", "kendall_tau", "roc_auc_top10")
SUMMARY_FRACTIONS = (0.1, 0.3, 0.5)
BEST_MAX_FRACTION = 0.5
TOP_PERCENT = 10  # the ROC-AUC positives: the ceil(10%) heads with the largest abl_zero
TOP_HEADS = 10
SCORE_DATA_KEYS = ("score_data", "scoring_data", "data_score")
EVAL_DATA_KEYS = ("eval_data", "evaluation_data", "data_eval")
LOG_Y_RATIO = 10.0  # curves.png uses a log y axis when max/min perplexity exceeds this
DPI = 110
MISSING_COLOR = "#d9d9d9"
FRACTION_TOL = 1e-9


# ---------------------------------------------------------------- validation


def method_columns(scores: pd.DataFrame) -> list[str]:
    """The scoring-method columns of ``scores``, in the canonical order."""
    return [m for m in METHODS if m in scores.columns]


def _require_columns(df, required, what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise HeadpruneError(f"{what} must be a table (pandas DataFrame), got {type(df).__name__}")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise HeadpruneError(f"{what} table lacks column(s) {', '.join(missing)}; is it a headprune {what} table?")
    if df.empty:
        raise HeadpruneError(f"{what} table has no rows")


def _as_float(df: pd.DataFrame, column: str, what: str) -> pd.Series:
    try:
        return df[column].astype(float)
    except (TypeError, ValueError):
        raise HeadpruneError(f"{what} column {column} must hold numbers") from None


def _as_int(df: pd.DataFrame, column: str, what: str, minimum: int = 0) -> pd.Series:
    values = _as_float(df, column, what)
    if not (np.isfinite(values) & (values % 1 == 0) & (values >= minimum)).all():
        raise HeadpruneError(f"{what} column {column} must hold integers >= {minimum}")
    return values.astype("int64")


def check_scores(scores: pd.DataFrame) -> pd.DataFrame:
    """A validated, typed copy of ``scores`` sorted by (layer, head); HeadpruneError on bad input."""
    _require_columns(scores, SCORE_COLUMNS, "scores")
    methods = method_columns(scores)
    if not methods:
        raise HeadpruneError(f"scores table has no method column; expected any of {', '.join(METHODS)}")
    df = scores.copy()
    for column in ("layer", "head"):
        df[column] = _as_int(df, column, "scores")
    for column in ("head_id", "model_fingerprint"):
        df[column] = df[column].astype(str)
    for column in methods:
        df[column] = _as_float(df, column, "scores")
    expected = "L" + df["layer"].astype(str) + "H" + df["head"].astype(str)
    if (bad := df["head_id"] != expected).any():
        raise HeadpruneError(f"scores head_id {df.loc[bad, 'head_id'].iloc[0]!r} does not match its layer and head")
    if (dup := df.duplicated(["layer", "head"])).any():
        raise HeadpruneError(f"scores table lists head {df.loc[dup, 'head_id'].iloc[0]} more than once")
    if (n := df["model_fingerprint"].nunique()) > 1:
        raise HeadpruneError(f"scores table mixes {n} models (model_fingerprint); report one model at a time")
    return df.sort_values(["layer", "head"], kind="stable").reset_index(drop=True)


def check_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """A validated, typed copy of ``curves`` sorted by (method, compensation, fraction)."""
    _require_columns(curves, CURVE_COLUMNS, "curves")
    df = curves.copy()
    df["method"] = df["method"].astype(str)
    df["compensation"] = df["compensation"].astype(str)
    if bad := sorted(set(df["compensation"]) - set(COMPENSATIONS)):
        raise HeadpruneError(f"curves compensation {bad[0]!r} is not one of {', '.join(COMPENSATIONS)}")
    for column in CURVE_COLUMNS[2:]:
        df[column] = _as_int(df, column, "curves") if column in CURVE_INTS else _as_float(df, column, "curves")
    if not df["fraction"].between(0, 1).all():
        raise HeadpruneError("curves column fraction must lie in [0, 1]")
    if (dup := df.duplicated(["method", "compensation", "fraction"])).any():
        row = df[dup].iloc[0]
        where = f"{row.method}/{row.compensation} at fraction {row.fraction}"
        raise HeadpruneError(f"curves table has two rows for {where}")
    keys = df["method"].map(_method_key)
    df = df.assign(_key=keys, _comp=df["compensation"].map(COMPENSATIONS.index))
    df = df.sort_values(["_key", "_comp", "fraction"], kind="stable").drop(columns=["_key", "_comp"])
    return df.reset_index(drop=True)


def _method_key(method: str) -> tuple:
    """Sort order: known methods in canonical order, then others by name, random last."""
    if method == RANDOM:
        return (2, "")
    return (0, f"{METHODS.index(method):02d}") if method in METHODS else (1, method)


def _groups(curves: pd.DataFrame):
    """(method, compensation) and its rows sorted by fraction, in report order (curves already checked)."""
    return [(key, g) for key, g in curves.groupby(["method", "compensation"], sort=False)]


def _check_baseline(baseline) -> dict:
    """{"tokens", "nll", "ppl"} as numbers; one of nll and ppl gives the other."""
    if not isinstance(baseline, dict) or (baseline.get("nll") is None and baseline.get("ppl") is None):
        raise HeadpruneError("baseline must be a dict with nll and ppl (tokens optional)")
    try:
        nll = float(baseline["nll"]) if baseline.get("nll") is not None else math.log(float(baseline["ppl"]))
        ppl = float(baseline["ppl"]) if baseline.get("ppl") is not None else math.exp(nll)
        tokens = int(baseline["tokens"]) if baseline.get("tokens") is not None else None
    except (TypeError, ValueError, OverflowError):
        raise HeadpruneError(f"baseline {baseline} must hold numbers (tokens, nll, ppl)") from None
    return {"tokens": tokens, "nll": nll, "ppl": ppl}


def _jsonable(settings) -> dict:
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise HeadpruneError(f"settings must be a dict, got {type(settings).__name__}")
    return json.loads(json.dumps(settings, default=str))


# ---------------------------------------------------------------- numbers


def best_method(curves: pd.DataFrame) -> str:
    """The non-random method with the lowest mean delta_nll over fractions in (0, 0.5], compensation none.

    Ties go to the alphabetically first name. HeadpruneError if no method has such points.
    """
    curves = check_curves(curves)
    sel = curves[(curves["method"] != RANDOM) & (curves["compensation"] == "none") & (curves["fraction"] > 0)
                 & (curves["fraction"] <= BEST_MAX_FRACTION + FRACTION_TOL)]
    means = sel.groupby("method")["delta_nll"].mean().dropna()
    if means.empty:
        raise HeadpruneError("no non-random method has curve points with compensation none and 0 < fraction <= 0.5")
    return min(means.index, key=lambda m: (means[m], m))


def _nearest_row(group: pd.DataFrame, target: float) -> pd.Series:
    """The row whose fraction is nearest ``target``; of two equally near, the smaller fraction."""
    dist = (group["fraction"] - target).abs().round(12).to_numpy()
    return group.iloc[np.lexsort((group["fraction"].to_numpy(), dist))[0]]


def ppl_label(target: float) -> str:
    return f"ppl@{round(100 * target)}%"


def summary_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Perplexity at 10/30/50% of heads pruned (nearest fraction present), one row per (method, compensation).

    Columns: method, compensation, ppl@10%, ppl@30%, ppl@50%; random last, compensation none before mean.
    """
    curves = check_curves(curves)
    rows = []
    for (method, comp), group in _groups(curves):
        row = {"method": method, "compensation": comp}
        row.update({ppl_label(t): float(_nearest_row(group, t)["ppl"]) for t in SUMMARY_FRACTIONS})
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", "compensation", *map(ppl_label, SUMMARY_FRACTIONS)])


def _fraction_note(curves: pd.DataFrame) -> str:
    """Which fractions stood in for 10/30/50% where no curve point sits at the target ('' if all do)."""
    parts = []
    for target in SUMMARY_FRACTIONS:
        used = sorted({float(_nearest_row(g, target)["fraction"]) for _, g in _groups(curves)})
        if any(abs(u - target) > FRACTION_TOL for u in used):
            parts.append(f"{target:.0%} read at {', '.join(f'{u:.1%}' for u in used)}")
    return ("Nearest fraction present: " + "; ".join(parts) + ".") if parts else ""


def top_heads_mask(scores: pd.DataFrame) -> np.ndarray:
    """True for the ceil(10%) heads (of those with a finite abl_zero) with the largest abl_zero.

    Ties at the cut go to the head with the smaller (layer, head).
    """
    truth = scores[TRUTH].to_numpy(float)
    finite = np.flatnonzero(np.isfinite(truth))
    k = -(-len(finite) * TOP_PERCENT // 100)  # integer ceil: 0.1 * 30 is 3.0000000000000004 in floats
    order = np.lexsort((scores["head"].to_numpy()[finite], scores["layer"].to_numpy()[finite], -truth[finite]))
    mask = np.zeros(len(truth), bool)
    mask[finite[order[:k]]] = True
    return mask


def _varies(x: np.ndarray) -> bool:
    return len(x) >= 3 and np.ptp(x) > 0


def _rank_stats(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Spearman rho and Kendall tau-b of paired finite values; NaN when undefined."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if not (_varies(x) and _varies(y)):
        return math.nan, math.nan
    return float(stats.spearmanr(x, y).statistic), float(stats.kendalltau(x, y).statistic)


def _predict_row(method: str, x: np.ndarray, truth: np.ndarray, positive: np.ndarray) -> dict:
    ok = np.isfinite(x) & np.isfinite(truth)
    x, y, pos = x[ok], truth[ok], positive[ok]
    row = {"method": method, "kind": "description" if method in DESCRIPTIONS else "importance", "n": int(ok.sum())}
    if _varies(x) and _varies(y):
        row["r2"] = float(LinearRegression().fit(x[:, None], y).score(x[:, None], y))
    else:
        row["r2"] = math.nan
    row["spearman_rho"], row["kendall_tau"] = _rank_stats(x, y)
    row["roc_auc_top10"] = float(roc_auc_score(pos, x)) if pos.any() and not pos.all() else math.nan
    return row


def predictiveness(scores: pd.DataFrame) -> pd.DataFrame:
    """How well each score predicts abl_zero, one row per method column but abl_zero (empty without abl_zero).

    r2: R^2 of the least-squares line abl_zero ~ score; spearman_rho, kendall_tau (tau-b): rank agreement;
    roc_auc_top10: ROC-AUC of the score for the top-10% heads by abl_zero (NaN if one class). Rows use the heads
    where both values are finite; entropy is marked kind=description (its sign carries no importance claim).
    """
    scores = check_scores(scores)
    if TRUTH not in scores.columns:
        return pd.DataFrame(columns=PREDICTIVENESS_COLUMNS)
    truth, positive = scores[TRUTH].to_numpy(float), top_heads_mask(scores)
    rows = [_predict_row(m, scores[m].to_numpy(float), truth, positive) for m in method_columns(scores) if m != TRUTH]
    return pd.DataFrame(rows, columns=PREDICTIVENESS_COLUMNS)


def rank_correlations(scores: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Spearman and Kendall tau-b matrices of all method columns (pairwise finite heads; NaN when undefined)."""
    methods = method_columns(scores)
    rho = pd.DataFrame(np.nan, index=methods, columns=methods)
    tau = rho.copy()
    for i, a in enumerate(methods):
        for b in methods[i:]:
            r, t = _rank_stats(scores[a].to_numpy(float), scores[b].to_numpy(float))
            rho.loc[a, b] = rho.loc[b, a] = r
            tau.loc[a, b] = tau.loc[b, a] = t
    return rho, tau


def top_heads(scores: pd.DataFrame, n: int = TOP_HEADS) -> pd.DataFrame:
    """The ``n`` heads with the largest abl_zero (ties: smaller layer, head first); empty without abl_zero."""
    if TRUTH not in scores.columns:
        return pd.DataFrame(columns=["rank", "head_id", "layer", "head", TRUTH])
    df = scores.dropna(subset=[TRUTH]).sort_values([TRUTH, "layer", "head"], ascending=[False, True, True])
    df = df[["head_id", "layer", "head", TRUTH]].head(n).reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def baseline_from_curves(curves: pd.DataFrame) -> dict:
    """The unpruned baseline read off the curves: a fraction-0 row, else nll - delta_nll. Tokens unknown."""
    curves = check_curves(curves)
    zero = curves[curves["fraction"] == 0]
    if len(zero):
        row = zero.sort_values("compensation", key=lambda c: c.map(COMPENSATIONS.index), kind="stable").iloc[0]
        return {"tokens": None, "nll": float(row["nll"]), "ppl": float(row["ppl"])}
    nll = float((curves["nll"] - curves["delta_nll"]).median())
    return {"tokens": None, "nll": nll, "ppl": math.exp(nll)}


# ---------------------------------------------------------------- pictures


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def head_grid(scores: pd.DataFrame, method: str) -> pd.DataFrame:
    """Layers x heads of ``method`` (0..max layer, 0..max head); NaN where a head is missing."""
    layers, heads = range(int(scores["layer"].max()) + 1), range(int(scores["head"].max()) + 1)
    return scores.pivot(index="layer", columns="head", values=method).reindex(index=layers, columns=heads)


def _color_limits(values: np.ndarray) -> tuple[float, float, str]:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return 0.0, 1.0, "viridis"
    lo, hi = float(finite.min()), float(finite.max())
    if lo < 0 < hi:
        edge = max(-lo, hi)
        return -edge, edge, "RdBu_r"
    if lo == hi:
        pad = abs(lo) * 0.05 or 0.5
        return lo - pad, hi + pad, "viridis"
    return lo, hi, "viridis"


def plot_heatmap(scores: pd.DataFrame, method: str) -> bytes:
    grid = head_grid(scores, method)
    values = grid.to_numpy(float)
    n_layers, n_heads = values.shape
    vmin, vmax, cmap_name = _color_limits(values)
    cmap = colormaps[cmap_name].with_extremes(bad=MISSING_COLOR)
    fig = Figure(figsize=(max(4.5, 0.6 * n_heads + 2.2), max(3.0, 0.45 * n_layers + 1.6)))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    fig.colorbar(image, ax=ax, label=method)
    ax.set_xticks(range(n_heads), [f"H{h}" for h in range(n_heads)], rotation=90 if n_heads > 16 else 0, fontsize=8)
    ax.set_yticks(range(n_layers), [f"L{layer}" for layer in range(n_layers)], fontsize=8)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{method}: {METHOD_LABELS.get(method, method)}", fontsize=10)
    if n_layers * n_heads <= 400:
        _annotate_cells(ax, values, cmap, vmin, vmax)
    return _png(fig)


def _annotate_cells(ax, values: np.ndarray, cmap, vmin: float, vmax: float, fmt: str = "{:.3g}") -> None:
    """Write each finite value in its cell, white on dark colours and black on light ones."""
    span = (vmax - vmin) or 1.0
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            r, g, b, _ = cmap(float(np.clip((v - vmin) / span, 0, 1)))
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=6.5, color="white" if dark else "black")


def plot_curves(curves: pd.DataFrame, baseline: dict) -> bytes:
    fig = Figure(figsize=(9.0, 5.2))
    ax = fig.add_subplot()
    methods = [m for m in dict.fromkeys(curves["method"]) if m != RANDOM]
    palette = colormaps["tab10" if len(methods) <= 10 else "tab20"]
    seen = []
    for (method, comp), g in _groups(curves):
        x, ppl = 100 * g["fraction"].to_numpy(), g["ppl"].to_numpy(float)
        style = "-" if comp == "none" else "--"
        suffix = "" if comp == "none" else " (mean-compensated)"
        if method == RANDOM:
            std = np.nan_to_num(g["ppl_std"].to_numpy(float))
            seeds = int(g["n_seeds"].max())
            ax.plot(x, ppl, color="black", ls=style, lw=1.6, label=f"random, mean of {seeds} seeds{suffix}")
            ax.fill_between(x, np.maximum(ppl - std, 1.0), ppl + std, color="grey", alpha=0.25,
                            label=f"random +-1 std{suffix}")
            seen.extend(ppl + std)
        else:
            color = palette(methods.index(method) % palette.N)
            ax.plot(x, ppl, color=color, ls=style, marker="o", ms=3, lw=1.4, label=f"{method}{suffix}")
        seen.extend(ppl)
    if np.isfinite(baseline["ppl"]):
        ax.axhline(baseline["ppl"], color="grey", ls=":", lw=1, label=f"unpruned ({baseline['ppl']:.2f})")
        seen.append(baseline["ppl"])
    seen = np.asarray(seen, float)
    seen = seen[np.isfinite(seen) & (seen > 0)]
    if len(seen) and seen.max() / seen.min() > LOG_Y_RATIO:
        ax.set_yscale("log")
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel("perplexity" + (" (log scale)" if ax.get_yscale() == "log" else ""))
    ax.set_title("Perplexity against the share of heads pruned")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return _png(fig)


def plot_scatter(scores: pd.DataFrame, method: str, rho: float) -> bytes:
    x, y = scores[method].to_numpy(float), scores[TRUTH].to_numpy(float)
    ok = np.isfinite(x) & np.isfinite(y)
    fig = Figure(figsize=(5.6, 4.6))
    ax = fig.add_subplot()
    if ok.any():
        points = ax.scatter(x[ok], y[ok], c=scores["layer"].to_numpy()[ok], cmap="viridis", s=24, alpha=0.85)
        fig.colorbar(points, ax=ax, label="layer")
        for i in np.flatnonzero(ok)[np.argsort(-y[ok], kind="stable")[:5]]:
            ax.annotate(scores["head_id"].iloc[i], (x[i], y[i]), xytext=(3, 3), textcoords="offset points", fontsize=7)
    else:
        ax.text(0.5, 0.5, "no head has both values", ha="center", va="center", transform=ax.transAxes)
    rho_text = "n/a" if math.isnan(rho) else f"{rho:.3f}"
    note = " (a description)" if method in DESCRIPTIONS else ""
    ax.set_title(f"{method}{note} vs {TRUTH}: Spearman \u03c1 = {rho_text}", fontsize=10)
    ax.set_xlabel(f"{method}: {METHOD_LABELS.get(method, method)}", fontsize=9)
    ax.set_ylabel(f"{TRUTH}: {METHOD_LABELS[TRUTH]}", fontsize=9)
    ax.grid(alpha=0.3)
    return _png(fig)


def plot_rank_correlation(rho: pd.DataFrame, tau: pd.DataFrame) -> bytes:
    m = len(rho)
    side = max(3.2, 0.55 * m + 1.6)
    fig = Figure(figsize=(2 * side + 1.0, side))
    axes = fig.subplots(1, 2)
    cmap = colormaps["RdBu_r"].with_extremes(bad=MISSING_COLOR)
    for ax, matrix, title in zip(axes, (rho, tau), ("Spearman \u03c1", "Kendall \u03c4-b")):
        values = matrix.to_numpy(float)
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=-1, vmax=1)
        ax.set_xticks(range(m), matrix.columns, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(m), matrix.index, fontsize=8)
        ax.set_title(f"{title} between scoring methods", fontsize=10)
        _annotate_cells(ax, values, cmap, -1.0, 1.0, "{:.2f}")
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="rank correlation")
    return _png(fig)


@dataclass
class Picture:
    name: str  # file name in out_dir
    caption: str
    png: bytes


def make_pictures(scores: pd.DataFrame, curves: pd.DataFrame, baseline: dict, pred: pd.DataFrame) -> list[Picture]:
    pics = [Picture("curves.png", "Perplexity against the share of heads pruned (dashed: mean-compensated; grey "
                    "band: random +-1 std over seeds).", plot_curves(curves, baseline))]
    for method in method_columns(scores):
        pics.append(Picture(f"heatmap_{method}.png", f"{method} per head (rows: layers, columns: heads; grey: "
                            "missing).", plot_heatmap(scores, method)))
    rho = dict(zip(pred["method"], pred["spearman_rho"]))
    for method in rho:
        pics.append(Picture(f"scatter_{method}.png", f"{method} against {TRUTH}, one point per head (top 5 by "
                            f"{TRUTH} labelled).", plot_scatter(scores, method, float(rho[method]))))
    pics.append(Picture("rank_correlation.png", "Rank correlations between all scoring methods, over heads.",
                        plot_rank_correlation(*rank_correlations(scores))))
    return pics


# ---------------------------------------------------------------- text


@dataclass
class Content:
    """What summary.md and report.html both say."""

    scores: pd.DataFrame
    curves: pd.DataFrame
    settings: dict
    baseline: dict
    best: str | None
    summary: pd.DataFrame
    fraction_note: str
    predictiveness: pd.DataFrame
    top: pd.DataFrame
    facts: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _setting(settings: dict, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if settings.get(key) not in (None, ""):
            return _value_text(settings[key])
    return None


def _value_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _number(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return f"{value:,}"
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            return "n/a" if np.isnan(value) else str(value)
        return f"{value:,.1f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def make_content(scores, curves, settings, baseline) -> Content:
    try:
        best = best_method(curves)
    except HeadpruneError:
        best = None
    content = Content(scores, curves, settings, baseline, best, summary_table(curves), _fraction_note(curves),
                      predictiveness(scores), top_heads(scores))
    score_data, eval_data = _setting(settings, SCORE_DATA_KEYS), _setting(settings, EVAL_DATA_KEYS)
    content.facts = [
        ("Model", f"{settings.get('model', 'not recorded')} (fingerprint {scores['model_fingerprint'].iloc[0]})"),
        ("Heads scored on", score_data or "not recorded in settings"),
        ("Curves (perplexity) measured on", eval_data or "not recorded in settings"),
        ("Heads", f"{len(scores)} ({scores['layer'].nunique()} layers)"),
        ("Baseline (unpruned)", f"perplexity {_number(baseline['ppl'])}, NLL {_number(baseline['nll'])} nats/token, "
                                f"{_number(baseline['tokens'])} tokens"),
        ("Best method", _best_text(content)),
    ]
    if score_data is not None and score_data == eval_data:
        content.notes.append("The heads were scored on the same data the curves were measured on: the curves are "
                             "in-sample and flatter the importance scores.")
    if TRUTH not in scores.columns:
        content.notes.append(f"The scores have no {TRUTH} column: predictiveness and scatter plots are skipped.")
    if "entropy" in scores.columns:
        content.notes.append("entropy is a description of a head (mean attention entropy), not an importance score.")
    return content


def _best_text(content: Content) -> str:
    if content.best is None:
        return "not determined (no non-random curve with compensation none and 0 < fraction <= 0.5)"
    sel = content.curves[(content.curves["method"] == content.best) & (content.curves["compensation"] == "none")
                         & (content.curves["fraction"] > 0)
                         & (content.curves["fraction"] <= BEST_MAX_FRACTION + FRACTION_TOL)]
    return (f"{content.best} (lowest mean delta NLL over 0 < fraction <= 50%, compensation none: "
            f"{sel['delta_nll'].mean():.4g} nats/token)")


def markdown_table(df: pd.DataFrame) -> str:
    def cell(v) -> str:
        return _number(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _settings_frame(settings: dict) -> pd.DataFrame:
    return pd.DataFrame([(k, _value_text(v)) for k, v in sorted(settings.items())], columns=["setting", "value"])


def render_markdown(c: Content) -> str:
    out = ["# headprune report", "", "## Settings", ""]
    out += [f"- **{label}**: {value}" for label, value in c.facts]
    out += [f"- Note: {note}" for note in c.notes]
    if c.settings:
        out += ["", markdown_table(_settings_frame(c.settings))]
    out += ["", "## Perplexity after pruning", ""]
    out += [markdown_table(c.summary)] + ([f"\n{c.fraction_note}"] if c.fraction_note else [])
    out += ["", f"## How well each score predicts {TRUTH}", ""]
    if len(c.predictiveness):
        out += [markdown_table(c.predictiveness), "", _PRED_NOTE]
    else:
        out.append(f"Not computed: the scores have no {TRUTH} column or no other method.")
    out += ["", f"## Top {TOP_HEADS} heads by {TRUTH}", ""]
    out.append(markdown_table(c.top) if len(c.top) else f"Not available: the scores have no {TRUTH} column.")
    return "\n".join(out) + "\n"


_PRED_NOTE = (f"r2: R^2 of a linear fit of {TRUTH} on the score; spearman_rho, kendall_tau (tau-b): rank agreement; "
              f"roc_auc_top10: ROC-AUC of the score for the top {TOP_PERCENT}% heads by {TRUTH} (ceil, ties to the "
              "smaller layer/head). kind=description: not an importance, read its sign as a finding.")

_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.85em}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}figure{margin:1em 0}img{max-width:100%}
figcaption{font-size:.85em;color:#555}.note{color:#8a4b00}"""


def _html_table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, border=0, na_rep="n/a", float_format=lambda v: f"{v:.6g}")


def render_html(c: Content, pictures: list[Picture]) -> str:
    e = html.escape
    body = ["<h1>headprune report</h1>", "<h2>Settings</h2>", "<ul>"]
    body += [f"<li><b>{e(label)}</b>: {e(value)}</li>" for label, value in c.facts]
    body += ["</ul>"] + [f'<p class="note">Note: {e(note)}</p>' for note in c.notes]
    if c.settings:
        body.append(_html_table(_settings_frame(c.settings)))
    body += ["<h2>Perplexity after pruning</h2>", _html_table(c.summary)]
    body += [f"<p>{e(c.fraction_note)}</p>"] if c.fraction_note else []
    body.append(f"<h2>How well each score predicts {TRUTH}</h2>")
    if len(c.predictiveness):
        body += [_html_table(c.predictiveness), f"<p>{e(_PRED_NOTE)}</p>"]
    else:
        body.append(f"<p>Not computed: the scores have no {TRUTH} column or no other method.</p>")
    body.append(f"<h2>Top {TOP_HEADS} heads by {TRUTH}</h2>")
    body.append(_html_table(c.top) if len(c.top) else f"<p>Not available: the scores have no {TRUTH} column.</p>")
    body.append("<h2>Pictures</h2>")
    for pic in pictures:
        uri = "data:image/png;base64," + base64.b64encode(pic.png).decode("ascii")
        body.append(f'<figure><img src="{uri}" alt="{e(pic.name)}"><figcaption>{e(pic.name)}: {e(pic.caption)}'
                    "</figcaption></figure>")
    body += ["<h2>Scores (one row per head)</h2>", _html_table(c.scores)]
    body += ["<h2>Curves (one row per method, compensation, fraction)</h2>", _html_table(c.curves)]
    head = f'<meta charset="utf-8"><title>headprune report</title><style>{_CSS}</style>'
    page = "\n".join(body)
    return f'<!DOCTYPE html>\n<html lang="en">\n<head>{head}</head>\n<body>\n{page}\n</body>\n</html>\n'


# ---------------------------------------------------------------- entry points


def build_report(scores: pd.DataFrame, curves: pd.DataFrame, out_dir: str | os.PathLike, settings: dict | None,
                 baseline: dict) -> Path:
    """Write the tables, pictures, summary.md and report.html into ``out_dir``; return report.html's path.

    Inputs are validated before anything is written (HeadpruneError naming the problem).
    """
    scores, curves = check_scores(scores), check_curves(curves)
    settings, baseline = _jsonable(settings), _check_baseline(baseline)
    out = ensure_dir(out_dir)
    content = make_content(scores, curves, settings, baseline)
    pictures = make_pictures(scores, curves, baseline, content.predictiveness)
    for name, df in (("scores", scores), ("curves", curves)):
        write_table(df, out / f"{name}.parquet")
        write_table(df, out / f"{name}.csv")
    write_table(content.predictiveness, out / "predictiveness.csv")
    write_json(out / "settings.json", settings)
    write_json(out / "baseline.json", baseline)
    for pic in pictures:
        write_bytes(out / pic.name, pic.png)
    write_text(out / "summary.md", render_markdown(content))
    write_text(out / "report.html", render_html(content, pictures))
    return out / "report.html"


def read_scores(path: str | os.PathLike) -> pd.DataFrame:
    """A saved scores table; from csv, head_id and model_fingerprint are kept as text (a hex id may look numeric)."""
    scores = read_table(path)
    text = [c for c in ("head_id", "model_fingerprint") if c in scores.columns]
    if Path(path).suffix == ".csv" and text:
        scores[text] = pd.read_csv(path, usecols=text, dtype=str, keep_default_na=False)[text]
    return scores


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadpruneError(f"cannot read {path} ({type(err).__name__}); fix or remove it") from None
    if not isinstance(value, dict):
        raise HeadpruneError(f"{path} must hold a JSON object")
    return value


def rebuild_report(scores_path: str | os.PathLike, curves_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """build_report from saved tables, with settings.json / baseline.json beside the scores file if present.

    Without them: empty settings, and the baseline read off the curves' fraction-0 row.
    """
    scores, curves = read_scores(scores_path), read_table(curves_path)
    folder = Path(scores_path).parent
    settings = _read_json(folder / "settings.json") or {}
    baseline = _read_json(folder / "baseline.json") or baseline_from_curves(curves)
    return build_report(scores, curves, out_dir, settings, baseline)


def run_report_command(scores: str | os.PathLike, curves: str | os.PathLike, out: str | os.PathLike) -> Path:
    """``headprune report --scores S --curves C --out DIR``: rebuild the report; return report.html's path."""
    return rebuild_report(scores, curves, out)
