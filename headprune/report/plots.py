"""The report's figures: pure functions from tables to PNG bytes.

Figures are ``matplotlib.figure.Figure`` objects rendered by Agg, never registered with pyplot (nothing to close).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from ..schema import DESCRIPTIVE, METHOD_LABELS, RANDOM, TRUTH, method_columns
from .tables import groups, rank_correlations

LOG_Y_RATIO = 10.0  # curves.png uses a log y axis when max/min perplexity exceeds this
DPI = 110
MISSING_COLOR = "#d9d9d9"


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
    seen: list[float] = []
    for (method, comp), g in groups(curves):
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
    shown = np.asarray(seen, float)
    shown = shown[np.isfinite(shown) & (shown > 0)]
    if len(shown) and shown.max() / shown.min() > LOG_Y_RATIO:
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
    note = " (a description)" if method in DESCRIPTIVE else ""
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
    for method, r in rho.items():
        pics.append(Picture(f"scatter_{method}.png", f"{method} against {TRUTH}, one point per head (top 5 by "
                            f"{TRUTH} labelled).", plot_scatter(scores, method, float(r))))
    pics.append(Picture("rank_correlation.png", "Rank correlations between all scoring methods, over heads.",
                        plot_rank_correlation(*rank_correlations(scores))))
    return pics
