"""The report's curve figures: perplexity and ΔNLL against the share of heads pruned."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headprune.report.plots.common import COMPENSATED_STYLE, FAMILY_COLORS, curve_styles, method_color, render_png
from headprune.report.tables import groups
from headprune.schema import LAYER_NORMALIZED, RANDOM, split_ranking

LOG_Y_RATIO = 10.0  # curves.png uses a log y axis when max/min perplexity exceeds this


def plot_curves(curves: pd.DataFrame, baseline: dict, n_heads: int | None = None, keep: tuple[str, ...] = ()
                ) -> bytes:
    """Perplexity (left) and ΔNLL (right) against the % of heads pruned; a secondary x axis in heads removed.
    Per-layer rankings (``<method>@layer``) have their own figure, but those in ``keep`` are drawn here too."""
    fig = Figure(figsize=(11.0, 4.8))
    ax_ppl, ax_nll = fig.subplots(1, 2)
    curves = curves[curves["method"].isin(keep) | ~curves["method"].map(lambda m: split_ranking(m)[1])]
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
    return render_png(fig)


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
    return render_png(fig)
