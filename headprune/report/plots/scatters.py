"""The report's scatters (each score against abl_zero, one point per head, coloured by layer) and the rank
correlations between methods."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from headprune.report.plots.common import (
    DPI,
    MISSING_COLOR,
    PHONE_DPI,
    PHONE_FONTS,
    PHONE_WIDTH,
    annotate_cells,
    importance_rank,
    render_png,
    wrapped,
)
from headprune.report.plots.maps import error_bars, score_interval
from headprune.schema import DESCRIPTIVE, METHOD_UNITS, TRUTH

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
                 min_gap: float = 0.07, fontsize: float = 6.5) -> None:
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
                        ha="right" if right else "left", fontsize=fontsize)
            placed.append((fx, fy))


def plot_scatters(scores: pd.DataFrame, rho: dict[str, float], scale: str = "value",
                  rho_ci: dict[str, tuple[float, float]] | None = None, phone: bool = False) -> bytes:
    """Small multiples: each method against ``abl_zero``, one point per head, coloured by layer (discrete
    legend), Spearman rho (and its head-bootstrap interval ``rho_ci``) in the title; the top heads by ``abl_zero``
    named where their labels do not overlap. In values, grey bars show each score's 95% window-bootstrap interval
    (both axes, where the table has one). ``rank``: both axes in importance ranks (1 = highest score), one shared
    scale for every panel, no bars. ``phone``: two panels per row, :data:`.common.PHONE_WIDTH` wide, in
    :data:`.common.PHONE_FONTS`."""
    methods = list(rho)
    n_layers = int(scores["layer"].max()) + 1
    small = PHONE_FONTS.tick if phone else 7  # axis labels, ticks, point names, legend
    cols = min(2 if phone else 4, len(methods))
    rows = -(-len(methods) // cols)
    size = (PHONE_WIDTH, 2.7 * rows + 1.2) if phone else (3.3 * cols, 3.0 * rows + 0.6)
    fig = Figure(figsize=size, layout="constrained")
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
            label_points(ax, x, y, names, top, fontsize=small if phone else 6.5)
        else:
            ax.text(0.5, 0.5, "no head has both values", ha="center", va="center", transform=ax.transAxes,
                    fontsize=max(small, 8))
        r, (r_lo, r_hi) = rho[method], (rho_ci or {}).get(method, (math.nan, math.nan))
        note = " (a description)" if method in DESCRIPTIVE else ""
        band = "" if math.isnan(r) or math.isnan(r_lo) else f" [{r_lo:.2f}, {r_hi:.2f}]"
        value = "n/a" if math.isnan(r) else f"{r:.2f}"
        ax.set_title(f"{method}{note}:" + ("\n" if phone else " ") + f"\u03c1 = {value}{band}", fontsize=9)
        unit = "rank (1 = highest)" if scale == "rank" else METHOD_UNITS.get(method, "score")
        ax.set_xlabel(f"{method}, {unit}", fontsize=small)
        ax.xaxis.set_major_locator(MaxNLocator(3 if phone else 5))  # long tick labels (-0.0050) must not collide
        ax.tick_params(labelsize=small)
        ax.grid(alpha=0.3)
    for i, ax in enumerate(axes):
        if i % cols == 0 and i < len(methods):
            ax.set_ylabel(f"{TRUTH}, " + ("rank (1 = highest)" if scale == "rank" else METHOD_UNITS[TRUTH]),
                          fontsize=small)
            ax.tick_params(labelleft=True)
    for ax in axes[len(methods):]:
        ax.set_visible(False)
    if scale == "rank":
        for ax in axes[: len(methods)]:
            ax.set_xlim(0, len(scores) + 1)
            ax.set_ylim(0, len(scores) + 1)
    layer_legend(fig, n_layers, small)
    title = f"Each score against {TRUTH}, one point per head (Spearman \u03c1 [95% CI] in the titles)"
    fig.suptitle(wrapped(title, 10, PHONE_WIDTH) if phone else title, fontsize=10)
    return render_png(fig, PHONE_DPI if phone else DPI)


def plot_rank_correlation(rho: pd.DataFrame, tau: pd.DataFrame, phone: bool = False) -> bytes:
    """Spearman and Kendall matrices side by side (``phone``: one above the other, numbers in the cells only up to
    8 methods, :data:`.common.PHONE_FONTS`)."""
    m = len(rho)
    side = max(3.2, 0.55 * m + 1.6)
    fig = Figure(figsize=(PHONE_WIDTH, 2 * PHONE_WIDTH + 0.4) if phone else (2 * side + 1.0, side),
                 layout="constrained" if phone else None)
    axes = fig.subplots(2, 1) if phone else fig.subplots(1, 2)
    tick = PHONE_FONTS.tick if phone else 8
    cmap = colormaps["RdBu_r"].with_extremes(bad=MISSING_COLOR)
    for ax, matrix, title in zip(axes, (rho, tau), ("Spearman \u03c1", "Kendall \u03c4-b")):
        values = matrix.to_numpy(float)
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=-1, vmax=1)
        ax.set_xticks(range(m), matrix.columns, rotation=45, ha="right", fontsize=tick)
        ax.set_yticks(range(m), matrix.index, fontsize=tick)
        ax.set_title(f"{title} between scoring methods", fontsize=10)
        if not phone or m <= 8:
            annotate_cells(ax, values, cmap, -1.0, 1.0, "{:.2f}", fontsize=tick if phone else 6.5)
    bar = fig.colorbar(image, ax=list(axes), shrink=0.8, location="bottom" if phone else "right")
    bar.set_label("rank correlation", fontsize=tick if phone else 10)
    bar.ax.tick_params(labelsize=tick if phone else 10)
    return render_png(fig, PHONE_DPI if phone else DPI)
