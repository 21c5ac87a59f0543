"""The report's figures: pure functions from tables to PNG bytes.

Figures are ``matplotlib.figure.Figure`` objects rendered by Agg, never registered with pyplot (nothing to close).
"""

from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from headprune.report.tables import groups, pruning_order, rank_correlations, ranked_methods
from headprune.schema import (
    DESCRIPTIVE,
    LAYER_NORMALIZED,
    METHOD_UNITS,
    RANDOM,
    TRUTH,
    ci_columns,
    method_columns,
    method_family,
    split_ranking,
)

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


SCALES = ("value", "rank")  # heatmaps and scatters: each method's own values, or ranks on one shared scale


def importance_rank(values: np.ndarray) -> np.ndarray:
    """Rank of each value within its method, 1 = highest (ties share their mean rank); NaN stays NaN."""
    from scipy.stats import rankdata

    ranks = np.full(len(values), np.nan)
    ok = np.isfinite(values)
    if ok.any():
        ranks[ok] = rankdata(-values[ok], method="average")
    return ranks


def display_exponent(values: np.ndarray) -> int:
    """k such that values / 10**k has its largest magnitude in [1, 10) (0 where that holds already, or no value)."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if len(finite) else 0.0
    return 0 if top == 0 or 1 <= top < 10 else math.floor(math.log10(top))


def scaled_label(unit: str, k: int) -> str:
    """``unit`` with the power of ten the shown numbers leave out, e.g. ``ΔNLL, nats/token (×10⁻²)``."""
    return unit if k == 0 else f"{unit} ($\\times 10^{{{k}}}$)"


def _head_ticks(ax, n_layers: int, n_heads: int, fontsize: float = 7) -> None:
    """Layer and head numbers, horizontal, thinned to at most 16 labels per axis so they never overlap."""
    hs, ls = max(1, math.ceil(n_heads / 16)), max(1, math.ceil(n_layers / 16))
    ax.set_xticks(range(0, n_heads, hs), [str(h) for h in range(0, n_heads, hs)], fontsize=fontsize)
    ax.set_yticks(range(0, n_layers, ls), [f"L{layer}" for layer in range(0, n_layers, ls)], fontsize=fontsize)


def plot_heatmaps(scores: pd.DataFrame, methods: list[str], scale: str = "value") -> bytes:
    """Small multiples: one layer x head map per method. ``value``: each map on its own colour scale with a
    colorbar in the method's unit, every cell number in one format (2 decimals; the power of ten in the colorbar
    label); ``rank``: every map on one shared scale of importance ranks (1 = highest score), one colorbar."""
    n_layers, n_heads = int(scores["layer"].max()) + 1, int(scores["head"].max()) + 1
    cols = min(3, len(methods))
    rows = -(-len(methods) // cols)
    w, h = min(6.0, max(3.2, 0.36 * n_heads + 1.8)), min(6.0, max(2.2, 0.32 * n_layers + 1.0))
    fig = Figure(figsize=(cols * w, rows * h + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    annotate = n_layers * n_heads <= 200
    image = None
    for ax, method in zip(axes, methods):
        if scale == "rank":
            ranked = scores.assign(_rank=importance_rank(scores[method].to_numpy(float)))
            values = head_grid(ranked, "_rank").to_numpy(float)
            vmin, vmax, cmap_name, k = 1.0, float(max(len(scores), 2)), "viridis_r", 0
        else:
            values = head_grid(scores, method).to_numpy(float)
            k = display_exponent(values)
            values = values / 10.0**k
            vmin, vmax, cmap_name = _color_limits(values)
        cmap = colormaps[cmap_name].with_extremes(bad=MISSING_COLOR)
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_title(method, fontsize=9)
        _head_ticks(ax, n_layers, n_heads)
        if scale == "value":
            bar = fig.colorbar(image, ax=ax, shrink=0.9)
            bar.set_label(scaled_label(METHOD_UNITS.get(method, "score"), k), fontsize=7)
            bar.ax.tick_params(labelsize=7)
        if annotate:
            _annotate_cells(ax, values, cmap, vmin, vmax, "{:.0f}" if scale == "rank" else "{:.2f}",
                            fontsize=6 if n_heads <= 12 else 5)
    for ax in axes[len(methods):]:
        ax.set_visible(False)
    if scale == "rank" and image is not None:
        fig.colorbar(image, ax=list(axes[: len(methods)]), shrink=0.6,
                     label="importance rank within the method (1 = highest score)")
    what = "importance ranks, one shared scale" if scale == "rank" else "scores"
    fig.suptitle(f"Per-head {what} (rows: layers, columns: heads; grey: missing)", fontsize=10)
    return _png(fig)


def _annotate_cells(ax, values: np.ndarray, cmap, vmin: float, vmax: float, fmt: str = "{:.3g}",
                    fontsize: float = 6.5) -> None:
    """Write each finite value in its cell, white on dark colours and black on light ones."""
    span = (vmax - vmin) or 1.0
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            r, g, b, _ = cmap(float(np.clip((v - vmin) / span, 0, 1)))
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
            text = fmt.format(v)
            text = text[1:] if text.startswith("-") and not text.strip("-0.") else text  # no "-0.00"
            ax.text(j, i, text, ha="center", va="center", fontsize=fontsize, color="white" if dark else "black")


def _map_caption(scores: pd.DataFrame, method: str) -> str:
    """``method (unit): low (colour) to high (colour)`` for an inline map."""
    values = scores[method].to_numpy(float)
    values = values[np.isfinite(values)]
    unit = METHOD_UNITS.get(method, "score")
    if not len(values):
        return f"{method} ({unit}): no values"
    cmap = _color_limits(values)[2]
    ends = ("blue", "red") if cmap == "RdBu_r" else ("dark", "yellow")
    return f"{method} ({unit}): {values.min():.3g} to {values.max():.3g}, {ends[0]} to {ends[1]}"


def score_interval(scores: pd.DataFrame, method: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The 95% bootstrap interval (lo, hi) of each head's ``method`` score, or None when the table has none."""
    lo, hi = ci_columns(method)
    if lo not in scores or hi not in scores:
        return None
    return scores[lo].to_numpy(float), scores[hi].to_numpy(float)


def error_bars(values: np.ndarray, interval: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray | None:
    """``errorbar``'s [2, n] extents below and above each value (0 where the interval is missing)."""
    if interval is None:
        return None
    lo, hi = interval
    return np.nan_to_num(np.stack([values - lo, hi - values]), nan=0.0).clip(min=0.0)


def heatmap_svg(scores: pd.DataFrame, method: str) -> str:
    """One method's layer x head map as inline SVG: a ``<rect>`` per head whose ``<title>`` the browser shows on
    hover (head, value, rank), so maps of any size (GPT-2 XL: 1,200 heads) stay readable on the page."""
    values = head_grid(scores, method).to_numpy(float)
    n_layers, n_heads = values.shape
    vmin, vmax, cmap_name = _color_limits(values)
    cmap = colormaps[cmap_name]
    ranks = dict(zip(scores["head_id"], importance_rank(scores[method].to_numpy(float))))
    interval = score_interval(scores, method)
    ci = dict(zip(scores["head_id"], zip(*interval))) if interval is not None else {}
    cell, left, top = 12, 26, 12
    width, height = left + cell * n_heads, top + cell * n_layers
    unit = METHOD_UNITS.get(method, "")
    parts = [(f'<svg viewBox="0 0 {width} {height}" role="img" '
              f'aria-label="{html.escape(method)} per head" font-size="7" font-family="sans-serif">')]
    hs, ls = max(1, math.ceil(n_heads / 16)), max(1, math.ceil(n_layers / 24))
    parts += [f'<text x="{left + cell * h + cell / 2}" y="{top - 3}" text-anchor="middle">{h}</text>'
              for h in range(0, n_heads, hs)]
    parts += [f'<text x="{left - 3}" y="{top + cell * layer + cell * 0.75}" text-anchor="end">L{layer}</text>'
              for layer in range(0, n_layers, ls)]
    span = (vmax - vmin) or 1.0
    for (i, j), v in np.ndenumerate(values):
        head = f"L{i}H{j}"
        if np.isfinite(v):
            r, g, b, _ = cmap(float(np.clip((v - vmin) / span, 0, 1)))
            fill = f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"
            rank = ranks.get(head, math.nan)
            tip = f"{head} {method} = {v:.4g} {unit}"
            if head in ci and np.isfinite(ci[head]).all():
                tip += f" (95% CI {ci[head][0]:.4g} to {ci[head][1]:.4g})"
            tip += "" if math.isnan(rank) else f"; rank {rank:g} of {len(scores)}"
        else:
            fill, tip = MISSING_COLOR, f"{head}: no score"
        parts.append(f'<rect x="{left + cell * j}" y="{top + cell * i}" width="{cell}" height="{cell}" '
                     f'fill="{fill}"><title>{html.escape(tip)}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


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


MAX_LAYER_ENTRIES = 12  # a layer legend lists single layers up to this many, else groups of adjacent layers


def layer_groups(n_layers: int) -> list[tuple[str, list[int], tuple]]:
    """Discrete legend entries for layers: (label, layers, colour), one per layer up to MAX_LAYER_ENTRIES, else
    adjacent layers grouped into at most MAX_LAYER_ENTRIES bins; colours ordered along viridis."""
    size = max(1, math.ceil(n_layers / MAX_LAYER_ENTRIES))
    bins = [list(range(i, min(i + size, n_layers))) for i in range(0, n_layers, size)]
    cmap = colormaps["viridis"]
    return [(f"L{b[0]}" if len(b) == 1 else f"L{b[0]}-{b[-1]}", b, cmap(i / max(len(bins) - 1, 1)))
            for i, b in enumerate(bins)]


def scatter_by_layer(ax, x: np.ndarray, y: np.ndarray, layers: np.ndarray, n_layers: int, size: float = 20) -> None:
    """Points coloured by layer with a discrete colour per layer (or group of layers), for :func:`layer_legend`."""
    for label, members, color in layer_groups(n_layers):
        sel = np.isin(layers, members) & np.isfinite(x) & np.isfinite(y)
        ax.scatter(x[sel], y[sel], color=color, s=size, alpha=0.85, label=label, edgecolors="none")


def layer_legend(fig: Figure, n_layers: int, fontsize: float = 7) -> None:
    """One discrete layer legend below the figure, for every panel drawn with :func:`scatter_by_layer`."""
    from matplotlib.lines import Line2D

    groups_ = layer_groups(n_layers)
    handles = [Line2D([], [], ls="", marker="o", color=c, ms=5) for _, _, c in groups_]
    fig.legend(handles, [label for label, _, _ in groups_], title="layer", loc="outside lower center",
               ncol=min(len(groups_), 12), fontsize=fontsize, title_fontsize=fontsize, frameon=False)


def label_points(ax, x: np.ndarray, y: np.ndarray, names: list[str], order: np.ndarray, k: int = 4,
                 min_gap: float = 0.07) -> None:
    """Name the first ``k`` points of ``order`` that lie at least ``min_gap`` (a fraction of the axes) from every
    point named before, so no two labels overlap."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    placed: list[tuple[float, float]] = []
    for i in order:
        if len(placed) == k:
            break
        if not (np.isfinite(x[i]) and np.isfinite(y[i])):
            continue
        fx, fy = (x[i] - x0) / ((x1 - x0) or 1), (y[i] - y0) / ((y1 - y0) or 1)
        if all(abs(fx - px) > 2 * min_gap or abs(fy - py) > min_gap for px, py in placed):
            right = fx > 0.8  # near the right edge: the label goes left of its point, inside the axes
            ax.annotate(names[i], (x[i], y[i]), xytext=(-3 if right else 3, 3), textcoords="offset points",
                        ha="right" if right else "left", fontsize=6.5)
            placed.append((fx, fy))


def plot_scatters(scores: pd.DataFrame, rho: dict[str, float], scale: str = "value",
                  rho_ci: dict[str, tuple[float, float]] | None = None) -> bytes:
    """Small multiples: each method against ``abl_zero``, one point per head, coloured by layer (discrete
    legend), Spearman rho (and its head-bootstrap interval ``rho_ci``) in the title; the top heads by ``abl_zero``
    named where their labels do not overlap. In values, grey bars show each score's 95% window-bootstrap interval
    (both axes, where the table has one). ``rank``: both axes in importance ranks (1 = highest score), one shared
    scale for every panel, no bars."""
    methods = list(rho)
    n_layers = int(scores["layer"].max()) + 1
    cols = min(4, len(methods))
    rows = -(-len(methods) // cols)
    fig = Figure(figsize=(3.3 * cols, 3.0 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel()
    truth = scores[TRUTH].to_numpy(float)
    y = importance_rank(truth) if scale == "rank" else truth
    layers, names = scores["layer"].to_numpy(), list(scores["head_id"])
    top = np.argsort(-np.nan_to_num(truth, nan=-np.inf), kind="stable")
    yerr = error_bars(y, score_interval(scores, TRUTH)) if scale == "value" else None
    for ax, method in zip(axes, methods):
        x = scores[method].to_numpy(float)
        x = importance_rank(x) if scale == "rank" else x
        if (np.isfinite(x) & np.isfinite(y)).any():
            xerr = error_bars(x, score_interval(scores, method)) if scale == "value" else None
            if xerr is not None or yerr is not None:
                ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="none", ecolor="0.55", elinewidth=0.6, alpha=0.7,
                            zorder=1)
            scatter_by_layer(ax, x, y, layers, n_layers, size=14)
            label_points(ax, x, y, names, top)
        else:
            ax.text(0.5, 0.5, "no head has both values", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        r, (r_lo, r_hi) = rho[method], (rho_ci or {}).get(method, (math.nan, math.nan))
        note = " (a description)" if method in DESCRIPTIVE else ""
        band = "" if math.isnan(r) or math.isnan(r_lo) else f" [{r_lo:.2f}, {r_hi:.2f}]"
        ax.set_title(f"{method}{note}: \u03c1 = {'n/a' if math.isnan(r) else f'{r:.2f}'}{band}", fontsize=9)
        unit = "rank (1 = highest)" if scale == "rank" else METHOD_UNITS.get(method, "score")
        ax.set_xlabel(f"{method}, {unit}", fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(5))  # long tick labels (-0.0050) must not run into each other
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for i, ax in enumerate(axes):
        if i % cols == 0 and i < len(methods):
            ax.set_ylabel(f"{TRUTH}, " + ("rank (1 = highest)" if scale == "rank" else METHOD_UNITS[TRUTH]), fontsize=7)
            ax.tick_params(labelleft=True)
    for ax in axes[len(methods):]:
        ax.set_visible(False)
    if scale == "rank":
        for ax in axes[: len(methods)]:
            ax.set_xlim(0, len(scores) + 1)
            ax.set_ylim(0, len(scores) + 1)
    layer_legend(fig, n_layers)
    fig.suptitle(f"Each score against {TRUTH}, one point per head (Spearman \u03c1 [95% CI] in the titles)", fontsize=10)
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
    svg: str | None = None  # report.html shows this inline markup (hover values) instead of the PNG


def make_pictures(scores: pd.DataFrame, curves: pd.DataFrame, baseline: dict, pred: pd.DataFrame,
                  scale: str = "value") -> list[Picture]:
    """The report's figures; ``scale``: heatmaps and scatters in each method's values or in shared ranks."""
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
    methods = method_columns(scores)
    maps = "".join(f"<figure><figcaption>{html.escape(_map_caption(scores, m))}</figcaption>{heatmap_svg(scores, m)}"
                   "</figure>" for m in methods)
    what = "importance ranks on one shared scale (1 = highest score)" if scale == "rank" else "scores"
    pics.append(Picture("heatmaps.png", f"Per-head {what} of every method (rows: layers, columns: heads; grey: "
                        "missing). On the page: hover a cell for its value and rank; heatmaps.png has the numbers in "
                        "the cells.", plot_heatmaps(scores, methods, scale), svg=maps))
    rho = dict(zip(pred["method"], pred["spearman_rho"].astype(float)))
    rho_ci = ({m: (float(lo), float(hi)) for m, lo, hi in zip(pred["method"], pred["spearman_ci_lo"], pred["spearman_ci_hi"])}
              if "spearman_ci_lo" in pred else None)
    if rho:
        bars = " Grey bars: each score's 95% bootstrap interval over the scoring windows." if scale == "value" else ""
        pics.append(Picture("scatters.png", f"Each score against {TRUTH}, one point per head, coloured by layer; the "
                            f"heads that matter most by {TRUTH} named where their labels do not overlap; \u03c1 with "
                            f"its 95% interval over heads.{bars}", plot_scatters(scores, rho, scale, rho_ci)))
    pics.append(Picture("rank_correlation.png", "Rank correlations between all scoring methods, over heads.",
                        plot_rank_correlation(*rank_correlations(scores))))
    return pics
