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

from ..schema import (
    DESCRIPTIVE,
    LAYER_NORMALIZED,
    METHOD_LABELS,
    RANDOM,
    TRUTH,
    method_columns,
    method_family,
    split_ranking,
)
from .tables import groups, pruning_order, rank_correlations, ranked_methods

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


def _annotate_cells(ax, values: np.ndarray, cmap, vmin: float, vmax: float, fmt: str = "{:.3g}",
                    fontsize: float = 6.5) -> None:
    """Write each finite value in its cell, white on dark colours and black on light ones."""
    span = (vmax - vmin) or 1.0
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            r, g, b, _ = cmap(float(np.clip((v - vmin) / span, 0, 1)))
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=fontsize, color="white" if dark else "black")


# Okabe & Ito (2008), colour-blind safe: one hue per method family, line styles within a family.
FAMILY_COLORS = {"weights": "#E69F00", "activations": "#CC79A7", "gradients": "#009E73", "ablation": "#0072B2",
                 "other": "#D55E00", RANDOM: "#000000"}
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")
COMPENSATED_STYLE = (0, (6, 1.5, 1, 1.5, 1, 1.5))  # dash-dot-dot: never a family's own style


def curve_styles(methods: list[str]) -> dict[str, dict]:
    """Colour (by family), line style and marker (by place in the family) of each non-random method."""
    seen: dict[str, int] = {}
    styles = {}
    for method in methods:
        family = method_family(method)
        i = seen[family] = seen.get(family, -1) + 1
        styles[method] = {"color": FAMILY_COLORS.get(family, FAMILY_COLORS["other"]),
                          "ls": LINE_STYLES[i % len(LINE_STYLES)], "marker": MARKERS[i % len(MARKERS)]}
    return styles


def plot_curves(curves: pd.DataFrame, baseline: dict, n_heads: int | None = None) -> bytes:
    """Perplexity (left) and ΔNLL (right) against the % of heads pruned; a secondary x axis in heads removed."""
    fig = Figure(figsize=(11.0, 4.8))
    ax_ppl, ax_nll = fig.subplots(1, 2)
    curves = curves[~curves["method"].map(lambda m: split_ranking(m)[1])]  # per-layer variants: their own figure
    methods = [m for m in dict.fromkeys(curves["method"]) if m != RANDOM]
    styles = curve_styles(methods)
    seen: list[float] = []
    for (method, comp), g in groups(curves):
        x, ppl, dnll = 100 * g["fraction"].to_numpy(), g["ppl"].to_numpy(float), g["delta_nll"].to_numpy(float)
        lo, hi = _delta_interval(g)
        suffix = "" if comp == "none" else f" ({comp}-compensated)"
        if method == RANDOM:
            std_ppl = np.nan_to_num(g["ppl_std"].to_numpy(float))
            seeds = int(g["n_seeds"].max())
            ls = "-" if comp == "none" else COMPENSATED_STYLE
            kw = {"color": FAMILY_COLORS[RANDOM], "ls": ls, "lw": 1.6}
            ax_ppl.plot(x, ppl, label=f"random, mean of {seeds} seeds{suffix}", **kw)
            ax_nll.plot(x, dnll, **kw)
            band = {"color": "grey", "alpha": 0.25, "lw": 0}
            ax_ppl.fill_between(x, np.maximum(ppl - std_ppl, 1.0), ppl + std_ppl, label=f"random ± 1 std{suffix}", **band)
            ax_nll.fill_between(x, lo, hi, **band)
            seen.extend(ppl + std_ppl)
        else:
            st = dict(styles[method])
            if comp != "none":
                st.update(ls=COMPENSATED_STYLE, marker="*" if comp == "mean" else "P")
            kw = {"color": st["color"], "ls": st["ls"], "marker": st["marker"], "ms": 4, "lw": 1.5}
            ax_ppl.plot(x, ppl, label=f"{method}{suffix}", **kw)
            ax_nll.plot(x, dnll, **kw)
            ax_nll.fill_between(x, lo, hi, color=st["color"], alpha=0.12, lw=0)
        seen.extend(ppl)
    if np.isfinite(baseline["ppl"]):
        ax_ppl.axhline(baseline["ppl"], color="grey", ls=":", lw=1, label=f"unpruned ({baseline['ppl']:.2f})")
        seen.append(baseline["ppl"])
    ax_nll.axhline(0.0, color="grey", ls=":", lw=1)
    shown = np.asarray(seen, float)
    shown = shown[np.isfinite(shown) & (shown > 0)]
    if len(shown) and shown.max() / shown.min() > LOG_Y_RATIO:
        ax_ppl.set_yscale("log")
    ax_ppl.set_ylabel("perplexity" + (" (log scale)" if ax_ppl.get_yscale() == "log" else ""))
    ax_nll.set_ylabel("ΔNLL (nats/token)")
    ax_ppl.set_title("Perplexity", fontsize=10)
    ax_nll.set_title("NLL increase over the unpruned model (bands: 95% intervals)", fontsize=10)
    for ax in (ax_ppl, ax_nll):
        ax.set_xlabel("heads pruned (%)")
        ax.grid(alpha=0.3, which="both")
        if n_heads:
            top = ax.secondary_xaxis("top", functions=(lambda p, n=n_heads: p * n / 100,
                                                       lambda k, n=n_heads: k * 100 / n))
            top.set_xlabel("heads removed", fontsize=8)
            top.tick_params(labelsize=8)
    handles, labels = ax_ppl.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(5, len(labels)), fontsize=8,
               frameon=False)
    fig.tight_layout()
    return _png(fig)


def _delta_interval(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The curve's ΔNLL 95% interval; without one (older tables, --bootstrap 0): ± 1 std over seeds, else none."""
    dnll = g["delta_nll"].to_numpy(float)
    if "delta_nll_ci_lo" in g and np.isfinite(g["delta_nll_ci_lo"].to_numpy(float)).all():
        return g["delta_nll_ci_lo"].to_numpy(float), g["delta_nll_ci_hi"].to_numpy(float)
    std = np.nan_to_num(g["nll_std"].to_numpy(float))
    return dnll - std, dnll + std


def plot_layer_normalized(curves: pd.DataFrame) -> bytes | None:
    """Small multiples, one per score with a per-layer-normalized variant: ΔNLL of the global ranking (solid),
    of the ranking within layers (dashed) and of random (grey, 95% band), on one y scale."""
    plain = curves[curves["compensation"] == "none"]
    pairs = [m for m in dict.fromkeys(plain["method"]) if m + LAYER_NORMALIZED in set(plain["method"])]
    if not pairs:
        return None
    cols = min(3, len(pairs))
    rows = math.ceil(len(pairs) / cols)
    fig = Figure(figsize=(3.6 * cols, 2.7 * rows + 0.6))
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)).ravel()
    rand = plain[plain["method"] == RANDOM].sort_values("fraction")
    for ax, method in zip(axes, pairs):
        color = FAMILY_COLORS.get(method_family(method), FAMILY_COLORS["other"])
        if not rand.empty:
            lo, hi = _delta_interval(rand)
            ax.fill_between(100 * rand["fraction"], lo, hi, color="grey", alpha=0.25, lw=0)
            ax.plot(100 * rand["fraction"], rand["delta_nll"], color=FAMILY_COLORS[RANDOM], lw=1.2, label="random")
        for name, ls, label in ((method, "-", "global ranking"), (method + LAYER_NORMALIZED, "--", "normalized per layer")):
            g = plain[plain["method"] == name].sort_values("fraction")
            lo, hi = _delta_interval(g)
            ax.plot(100 * g["fraction"], g["delta_nll"], color=color, ls=ls, lw=1.5, marker="o", ms=3, label=label)
            ax.fill_between(100 * g["fraction"], lo, hi, color=color, alpha=0.12, lw=0)
        ax.set_title(method, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[len(pairs):]:
        ax.set_visible(False)
    for ax in axes[::cols]:
        ax.set_ylabel("ΔNLL (nats/token)", fontsize=8)
    for ax in axes[:len(pairs)][-cols:]:
        ax.set_xlabel("heads pruned (%)", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels), fontsize=8,
               frameon=False)
    fig.tight_layout()
    return _png(fig)


def plot_pruning_order(scores: pd.DataFrame) -> bytes | None:
    """One small layer x head grid per ranking method: the step at which the head is removed (1 = first)."""
    grids = [(m, pruning_order(scores, m)) for m in ranked_methods(scores)]
    if not grids:
        return None
    n_layers, n_heads = int(scores["layer"].max()) + 1, int(scores["head"].max()) + 1
    cols = min(4, len(grids))
    rows = -(-len(grids) // cols)
    cell_w, cell_h = max(2.2, 0.34 * n_heads + 0.6), max(1.6, 0.3 * n_layers + 0.9)
    fig = Figure(figsize=(cols * cell_w, rows * cell_h + 0.6))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    n = len(scores)
    cmap = colormaps["viridis_r"].with_extremes(bad=MISSING_COLOR)
    for ax, (method, grid) in zip(axes, grids):
        ax.set_title(method, fontsize=9)
        ax.set_xticks(range(n_heads), [str(h) for h in range(n_heads)] if n_heads <= 16 else [], fontsize=6)
        ax.set_yticks(range(n_layers), [f"L{layer}" for layer in range(n_layers)], fontsize=6)
        if grid is None:
            ax.text(0.5, 0.5, "not ranked\n(a NaN score)", ha="center", va="center", fontsize=8,
                    transform=ax.transAxes)
            ax.set_xlim(-0.5, n_heads - 0.5)
            ax.set_ylim(n_layers - 0.5, -0.5)
            continue
        values = grid.to_numpy(float)
        ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=1, vmax=max(n, 2), aspect="auto")
        if n_layers * n_heads <= 200:
            _annotate_cells(ax, values, cmap, 1.0, float(max(n, 2)), "{:.0f}", fontsize=5.5)
    for ax in axes[len(grids):]:
        ax.set_visible(False)
    fig.suptitle("Pruning order: the step at which each head is removed (1 = first; rows: layers, columns: heads)",
                 fontsize=10)
    fig.tight_layout()
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
    pics = [Picture("curves.png", "Perplexity and NLL increase against the share of heads pruned (colour: method "
                    "family, Okabe-Ito; dash-dot-dot with stars / plus signs: mean- / optimal-compensated; left, grey band: random ± 1 std "
                    "over seeds; right, bands: 95% paired-bootstrap intervals over the evaluation windows, for "
                    "random over seeds and windows together; top axis: heads removed).",
                    plot_curves(curves, baseline, len(scores)))]
    normalized = plot_layer_normalized(curves)
    if normalized is not None:
        pics.append(Picture("curves_layer_normalized.png", "Each weight and activation score ranked globally "
                            "(solid) and with its scores divided by their layer's norm (dashed, Michel et al. 2019): "
                            "a score that only fails across layers recovers when normalized.", normalized))
    order = plot_pruning_order(scores)
    if order is not None:
        pics.append(Picture("pruning_order.png", "The order in which each method removes heads (1 = first), as the "
                            "curves prune: global ranking, lowest score first.", order))
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
