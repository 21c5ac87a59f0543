"""The report's curve figures: perplexity and ΔNLL against the share of heads pruned."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headprune.report.plots.common import (
    COMPENSATED_STYLE,
    DPI,
    FAMILY_COLORS,
    PHONE_FONTS,
    PHONE_WIDTH,
    WIDE_FONTS,
    curve_styles,
    method_color,
    render_png,
)
from headprune.report.plots.common import PHONE_DPI as PHONE_FIGURE_DPI
from headprune.report.tables import groups, methods_by_curves
from headprune.schema import LAYER_NORMALIZED, RANDOM, split_ranking

LOG_Y_RATIO = 10.0  # curves.png uses a log y axis when max/min perplexity exceeds this


MAIN_CURVES = 3  # curves.png draws the best few global rankings; curves_all.png every one


def shown_methods(curves: pd.DataFrame, best: int | None, keep: tuple[str, ...] = ()) -> list[str]:
    """The rankings a curves figure draws: the ``best`` global rankings by :func:`.tables.methods_by_curves`
    (every global ranking where ``best`` is None), then those of ``keep``; random is drawn apart."""
    ranked = [m for m in methods_by_curves(curves) if not split_ranking(m)[1]]
    every = [m for m in dict.fromkeys(curves["method"]) if m != RANDOM and not split_ranking(m)[1]]
    chosen = every if best is None else [m for m in ranked if m in every][:best]
    return list(dict.fromkeys([*chosen, *[m for m in keep if m in set(curves["method"])]]))


def _draw_curve(ax_ppl, ax_nll, method: str, comp: str, g: pd.DataFrame, styles: dict) -> list[float]:
    """One ranking's curve (random: its mean and ± 1 std band) on both panels; the perplexities drawn."""
    seen: list[float] = []
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
        ax_ppl.fill_between(x, np.maximum(ppl - std_ppl, 1.0), ppl + std_ppl, label=f"random ± 1 std{suffix}",
                            **band)
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
    return seen


def _label_axes(ax_ppl, ax_nll, fonts, phone: bool, n_heads: int | None) -> None:
    """Titles, axis labels (the perplexity axis says where it is logarithmic), grids, and heads removed on top."""
    ax_ppl.set_ylabel("perplexity" + (" (log scale)" if ax_ppl.get_yscale() == "log" else ""), fontsize=fonts.label)
    ax_nll.set_ylabel("ΔNLL (nats/token)", fontsize=fonts.label)
    ax_ppl.set_title("Perplexity", fontsize=fonts.title + 1)
    ax_nll.set_title("NLL increase over the unpruned model" + ("\n" if phone else " ") + "(bands: 95% intervals)",
                     fontsize=fonts.title + 1)
    for ax in (ax_ppl, ax_nll):
        ax.set_xlabel("heads pruned (%)", fontsize=fonts.label)
        ax.tick_params(labelsize=fonts.tick + 1)
        ax.grid(alpha=0.3, which="both")
        if n_heads:
            top = ax.secondary_xaxis("top", functions=(lambda p, n=n_heads: p * n / 100,
                                                       lambda k, n=n_heads: k * 100 / n))
            top.set_xlabel("heads removed", fontsize=fonts.label)
            top.tick_params(labelsize=fonts.tick + (0 if phone else 1))


def plot_curves(curves: pd.DataFrame, baseline: dict, n_heads: int | None = None, keep: tuple[str, ...] = (),
                best: int | None = MAIN_CURVES, phone: bool = False) -> bytes:
    """Perplexity (left) and ΔNLL (right) against the % of heads pruned; a secondary x axis in heads removed.
    Draws the ``best`` global rankings (with their compensated curves; None: every one, :func:`shown_methods`),
    the per-layer rankings (``<method>@layer``) in ``keep``, and random with its band. ``phone``: the two panels
    stacked, :data:`.common.PHONE_WIDTH` wide, in :data:`.common.PHONE_FONTS`."""
    fonts = PHONE_FONTS if phone else WIDE_FONTS
    methods = shown_methods(curves, best, keep)
    if phone:
        fig = Figure(figsize=(PHONE_WIDTH, 8.0), layout="constrained")
        ax_ppl, ax_nll = fig.subplots(2, 1)
    else:
        fig = Figure(figsize=(11.0, 3.6 if best is not None else 4.8), layout="constrained")  # 1st screen
        ax_ppl, ax_nll = fig.subplots(1, 2)
    curves = curves[curves["method"].isin([*methods, RANDOM])]
    styles = curve_styles(methods)
    seen: list[float] = []
    for (method, comp), g in groups(curves):
        seen.extend(_draw_curve(ax_ppl, ax_nll, method, comp, g, styles))
    if np.isfinite(baseline["ppl"]):
        ax_ppl.axhline(baseline["ppl"], color="grey", ls=":", lw=1, label=f"unpruned ({baseline['ppl']:.2f})")
        seen.append(baseline["ppl"])
    ax_nll.axhline(0.0, color="grey", ls=":", lw=1)
    shown = np.asarray(seen, float)
    shown = shown[np.isfinite(shown) & (shown > 0)]
    if len(shown) and shown.max() / shown.min() > LOG_Y_RATIO:
        ax_ppl.set_yscale("log")
    _label_axes(ax_ppl, ax_nll, fonts, phone, n_heads)
    handles, labels = ax_ppl.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2 if phone else min(6, len(labels)),
               fontsize=fonts.legend, frameon=False)
    return render_png(fig, PHONE_FIGURE_DPI if phone else DPI)


PHONE_SIZE, PHONE_DPI = (4.2, 4.6), 2 * 110  # inches; drawn 924 px wide: sharp at 400 CSS px on a 2x screen
PHONE_FONT = 12


def plot_curves_phone(curves: pd.DataFrame, baseline: dict, methods: list[str]) -> bytes:
    """The perplexity panel of :func:`plot_curves` for a 400 px screen: only ``methods`` (uncompensated), random
    with its ± 1 std band and the unpruned line, in fonts of 12 pt that stay ~11 px tall on the phone."""
    fig = Figure(figsize=PHONE_SIZE)
    ax = fig.subplots()
    plain = curves[curves["compensation"] == "none"]
    styles = curve_styles(methods)
    for method in [*methods, RANDOM]:
        g = plain[plain["method"] == method].sort_values("fraction")
        if g.empty:
            continue
        x, ppl = 100 * g["fraction"].to_numpy(), g["ppl"].to_numpy(float)
        if method == RANDOM:
            std = np.nan_to_num(g["ppl_std"].to_numpy(float))
            ax.fill_between(x, np.maximum(ppl - std, 1.0), ppl + std, color="grey", alpha=0.25, lw=0)
            ax.plot(x, ppl, color=FAMILY_COLORS[RANDOM], lw=2.2, label="random (± 1 std)")
        else:
            st = styles[method]
            ax.plot(x, ppl, color=st["color"], ls=st["ls"], marker=st["marker"], ms=6, lw=2.4, label=method)
    if np.isfinite(baseline["ppl"]):
        ax.axhline(baseline["ppl"], color="grey", ls=":", lw=1.5, label=f"unpruned ({baseline['ppl']:.1f})")
    top = plain["ppl"].to_numpy(float)
    if len(top) and np.nanmax(top) / max(np.nanmin(top), 1e-12) > LOG_Y_RATIO:
        ax.set_yscale("log")
    ax.set_xlabel("heads pruned (%)", fontsize=PHONE_FONT)
    ax.set_ylabel("perplexity", fontsize=PHONE_FONT)
    ax.set_title("Perplexity after pruning", fontsize=PHONE_FONT + 1)
    ax.tick_params(labelsize=PHONE_FONT - 1)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=PHONE_FONT - 1, loc="upper left", frameon=False)
    fig.tight_layout()
    return render_png(fig, PHONE_DPI)


def _delta_interval(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The curve's ΔNLL 95% interval; without one (older tables, --bootstrap 0): ± 1 std over seeds, else none."""
    dnll = g["delta_nll"].to_numpy(float)
    if "delta_nll_ci_lo" in g and np.isfinite(g["delta_nll_ci_lo"].to_numpy(float)).all():
        return g["delta_nll_ci_lo"].to_numpy(float), g["delta_nll_ci_hi"].to_numpy(float)
    std = np.nan_to_num(g["nll_std"].to_numpy(float))
    return dnll - std, dnll + std


def plot_layer_normalized(curves: pd.DataFrame, phone: bool = False) -> bytes | None:
    """Small multiples, one per score with a per-layer-normalized variant: ΔNLL of the global ranking (solid),
    of the ranking within layers (dashed) and of random (grey, 95% band), on one y scale. ``phone``: two per
    row, :data:`.common.PHONE_WIDTH` wide, in :data:`.common.PHONE_FONTS`."""
    plain = curves[curves["compensation"] == "none"]
    pairs = [m for m in dict.fromkeys(plain["method"]) if m + LAYER_NORMALIZED in set(plain["method"])]
    if not pairs:
        return None
    fonts = PHONE_FONTS if phone else WIDE_FONTS
    cols = min(2 if phone else 3, len(pairs))
    rows = math.ceil(len(pairs) / cols)
    size = (PHONE_WIDTH, 2.3 * rows + 1.0) if phone else (3.6 * cols, 2.7 * rows + 0.6)
    fig = Figure(figsize=size, layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)).ravel()
    rand = plain[plain["method"] == RANDOM].sort_values("fraction")
    for ax, method in zip(axes, pairs):
        color = method_color(method)
        if not rand.empty:
            lo, hi = _delta_interval(rand)
            ax.fill_between(100 * rand["fraction"], lo, hi, color="grey", alpha=0.25, lw=0)
            ax.plot(100 * rand["fraction"], rand["delta_nll"], color=FAMILY_COLORS[RANDOM], lw=1.2, label="random")
        for name, ls, label in ((method, "-", "global ranking"),
                                (method + LAYER_NORMALIZED, "--", "normalized per layer")):
            g = plain[plain["method"] == name].sort_values("fraction")
            lo, hi = _delta_interval(g)
            ax.plot(100 * g["fraction"], g["delta_nll"], color=color, ls=ls, lw=1.5, marker="o", ms=3, label=label)
            ax.fill_between(100 * g["fraction"], lo, hi, color=color, alpha=0.12, lw=0)
        ax.set_title(method, fontsize=fonts.title)
        ax.tick_params(labelsize=fonts.tick)
        ax.grid(alpha=0.3)
    for ax in axes[len(pairs):]:
        ax.set_visible(False)
    for ax in axes[::cols]:
        ax.set_ylabel("ΔNLL (nats/token)", fontsize=fonts.label)
    for ax in axes[:len(pairs)][-cols:]:
        ax.set_xlabel("heads pruned (%)", fontsize=fonts.label)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=fonts.legend, frameon=False)
    return render_png(fig, PHONE_FIGURE_DPI if phone else DPI)
