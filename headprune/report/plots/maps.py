"""The report's per-head maps: layer x head heatmaps (PNG and inline SVG) and the pruning order."""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from headprune.report.plots.common import (
    DPI,
    MISSING_COLOR,
    PHONE_DPI,
    PHONE_FONTS,
    PHONE_WIDTH,
    WIDE_FONTS,
    annotate_cells,
    display_exponent,
    head_grid,
    importance_rank,
    render_png,
    scaled_label,
    wrapped,
)
from headprune.report.tables import pruning_order, ranked_methods
from headprune.schema import METHOD_UNITS, ci_columns


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


def _head_ticks(ax, n_layers: int, n_heads: int, fontsize: float = 7) -> None:
    """Layer and head numbers, horizontal, thinned to at most 16 labels per axis so they never overlap."""
    hs, ls = max(1, math.ceil(n_heads / 16)), max(1, math.ceil(n_layers / 16))
    ax.set_xticks(range(0, n_heads, hs), [str(h) for h in range(0, n_heads, hs)], fontsize=fontsize)
    ax.set_yticks(range(0, n_layers, ls), [f"L{layer}" for layer in range(0, n_layers, ls)], fontsize=fontsize)


def plot_heatmaps(scores: pd.DataFrame, methods: list[str], scale: str = "value",
                  unit: str | dict[str, str] | None = None, scaled: bool = True, phone: bool = False,
                  decimals: int = 2) -> bytes:
    """:func:`heatmaps_figure` as PNG bytes (a phone version: one map per row, :data:`.common.PHONE_FONTS`)."""
    return render_png(heatmaps_figure(scores, methods, scale, unit, scaled, phone, decimals),
                      PHONE_DPI if phone else DPI)


def heatmaps_figure(scores: pd.DataFrame, methods: list[str], scale: str = "value",
                    unit: str | dict[str, str] | None = None, scaled: bool = True, phone: bool = False,
                    decimals: int = 2) -> Figure:
    """Small multiples: one layer x head map per method. ``value``: each map on its own colour scale with a
    colorbar in the method's unit (``unit``: one for all, or one per column), every cell number in one format
    (``decimals`` decimals; with ``scaled``, the power of ten left out of the numbers goes into the colorbar
    label; without, the numbers and the colorbar are in the unit itself); ``rank``: every map on one shared scale
    of importance ranks (1 = highest score), one colorbar. ``phone``: one map per row,
    :data:`.common.PHONE_WIDTH` wide."""
    n_layers, n_heads = int(scores["layer"].max()) + 1, int(scores["head"].max()) + 1
    fonts = PHONE_FONTS if phone else WIDE_FONTS
    cols = 1 if phone else min(3, len(methods))
    rows = -(-len(methods) // cols)
    w, h = min(6.0, max(3.2, 0.36 * n_heads + 1.8)), min(6.0, max(2.2, 0.32 * n_layers + 1.0))
    if phone:
        w, h = PHONE_WIDTH, max(2.4, 0.3 * n_layers + 1.2)
    fig = Figure(figsize=(cols * w, rows * h + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    annotate = n_layers * n_heads <= 200 and (not phone or n_heads <= 12)
    image = None
    for ax, method in zip(axes, methods):
        if scale == "rank":
            ranked = scores.assign(_rank=importance_rank(scores[method].to_numpy(float)))
            values = head_grid(ranked, "_rank").to_numpy(float)
            vmin, vmax, cmap_name, k = 1.0, float(max(len(scores), 2)), "viridis_r", 0
        else:
            values = head_grid(scores, method).to_numpy(float)
            k = display_exponent(values) if scaled else 0
            values = values / 10.0**k
            vmin, vmax, cmap_name = _color_limits(values)
        cmap = colormaps[cmap_name].with_extremes(bad=MISSING_COLOR)
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_title(method, fontsize=fonts.title)
        _head_ticks(ax, n_layers, n_heads, fonts.tick)
        if scale == "value":
            bar = fig.colorbar(image, ax=ax, shrink=0.9)
            name = unit.get(method) if isinstance(unit, dict) else unit
            bar.set_label(scaled_label(name or METHOD_UNITS.get(method, "score"), k), fontsize=fonts.tick)
            bar.ax.tick_params(labelsize=fonts.tick)
            if isinstance(bar.formatter, ScalarFormatter):  # the numbers in the label's unit, no offset beside them
                bar.formatter.set_useOffset(False)
        if annotate:
            annotate_cells(ax, values, cmap, vmin, vmax, "{:.0f}" if scale == "rank" else f"{{:.{decimals}f}}",
                            fontsize=fonts.cell if phone else (6 if n_heads <= 12 else 5))
    for ax in axes[len(methods):]:
        ax.set_visible(False)
    if scale == "rank" and image is not None:
        bar = fig.colorbar(image, ax=list(axes[: len(methods)]), shrink=0.6)
        bar.set_label("importance rank within the method (1 = highest score)", fontsize=fonts.label)
    what = "importance ranks, one shared scale" if scale == "rank" else unit if isinstance(unit, str) else "scores"
    title = f"Per-head {what} (rows: layers, columns: heads; grey: missing)"
    fig.suptitle(wrapped(title, fonts.title + 1, PHONE_WIDTH) if phone else title, fontsize=fonts.title + 1)
    return fig


def map_caption(scores: pd.DataFrame, method: str) -> str:
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


SVG_FONT, SVG_MIN_TEXT_PX = 7, 9  # the inline maps' font size (viewBox units) and its smallest size on screen


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
    readable = math.ceil(width * SVG_MIN_TEXT_PX / SVG_FONT)  # drawn no narrower: text >= SVG_MIN_TEXT_PX px
    parts = [(f'<svg viewBox="0 0 {width} {height}" role="img" style="min-width:{readable}px" '
              f'aria-label="{html.escape(method)} per head" font-size="{SVG_FONT}" font-family="sans-serif">')]
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


#: The pruning order's colours follow the heatmaps' "bright = important": removed first (step 1, the least
#: important by the method) dark, removed last bright, as viridis runs from low to high values there.
ORDER_CMAP = "viridis"


def order_colors(steps: np.ndarray, n: int) -> np.ndarray:
    """RGBA of each step 1..n as :func:`plot_pruning_order` draws it (NaN: the missing-head grey)."""
    cmap = colormaps[ORDER_CMAP].with_extremes(bad=MISSING_COLOR)
    span = max(n, 2) - 1
    return cmap(np.ma.masked_invalid((np.asarray(steps, float) - 1) / span))


def plot_pruning_order(scores: pd.DataFrame, phone: bool = False) -> bytes | None:
    """One small layer x head grid per ranking method: the step at which the head is removed (1 = first; dark,
    the last bright: :data:`ORDER_CMAP`). ``phone``: two grids per row, :data:`.common.PHONE_WIDTH` wide, in
    :data:`.common.PHONE_FONTS`, without the step numbers (a colorbar gives them)."""
    grids = [(m, pruning_order(scores, m)) for m in ranked_methods(scores)]
    if not grids:
        return None
    n_layers, n_heads = int(scores["layer"].max()) + 1, int(scores["head"].max()) + 1
    fonts = PHONE_FONTS if phone else WIDE_FONTS
    cols = min(2 if phone else 4, len(grids))
    rows = -(-len(grids) // cols)
    cell_w, cell_h = max(2.2, 0.34 * n_heads + 0.6), max(1.6, 0.3 * n_layers + 0.9)
    if phone:
        cell_w, cell_h = PHONE_WIDTH / cols, max(1.8, 0.25 * n_layers + 1.0)
    fig = Figure(figsize=(cols * cell_w, rows * cell_h + (1.2 if phone else 0.6)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    n = len(scores)
    cmap = colormaps[ORDER_CMAP].with_extremes(bad=MISSING_COLOR)
    tick = 9 if phone else 6
    head_step, layer_step = (max(1, math.ceil(n_heads / 6)), max(1, math.ceil(n_layers / 8))) if phone else (1, 1)
    image = None
    for ax, (method, grid) in zip(axes, grids):
        ax.set_title(method, fontsize=fonts.title)
        heads, layers = range(0, n_heads, head_step), range(0, n_layers, layer_step)
        ax.set_xticks(heads, [str(h) for h in heads] if n_heads <= 16 or phone else [], fontsize=tick)
        ax.set_yticks(layers, [f"L{layer}" for layer in layers], fontsize=tick)
        if grid is None:
            ax.text(0.5, 0.5, "not ranked\n(a NaN score)", ha="center", va="center", fontsize=max(tick, 8),
                    transform=ax.transAxes)
            ax.set_xlim(-0.5, n_heads - 0.5)
            ax.set_ylim(n_layers - 0.5, -0.5)
            continue
        values = grid.to_numpy(float)
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=1, vmax=max(n, 2), aspect="auto")
        if n_layers * n_heads <= 200 and not phone:
            annotate_cells(ax, values, cmap, 1.0, float(max(n, 2)), "{:.0f}", fontsize=5.5)
    for ax in axes[len(grids):]:
        ax.set_visible(False)
    if phone and image is not None:
        bar = fig.colorbar(image, ax=list(axes[: len(grids)]), location="bottom", shrink=0.8, aspect=30)
        bar.set_label("step at which the head is removed", fontsize=fonts.label)
        bar.ax.tick_params(labelsize=fonts.tick)
    title = ("Pruning order: the step at which each head is removed (1 = first, dark; last = most important, "
             "bright, as in the heatmaps; rows: layers, columns: heads)")
    fig.suptitle(wrapped(title, fonts.title + 1, PHONE_WIDTH) if phone else title, fontsize=fonts.title + 1)
    return render_png(fig, PHONE_DPI if phone else DPI)
