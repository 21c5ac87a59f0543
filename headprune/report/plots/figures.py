"""The report's figures, from its tables: :func:`make_pictures`."""

from __future__ import annotations

import html

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.report.choice import best_method
from headprune.report.headline import best_layer_ranking
from headprune.report.plots.common import Picture
from headprune.report.plots.curves import (
    MAIN_CURVES,
    plot_curves,
    plot_curves_phone,
    plot_layer_normalized,
    shown_methods,
)
from headprune.report.plots.maps import heatmap_svg, map_caption, plot_heatmaps, plot_pruning_order
from headprune.report.plots.scatters import plot_rank_correlation, plot_scatters
from headprune.report.predictiveness import joint_rows
from headprune.report.tables import rank_correlations
from headprune.schema import TRUTH, method_columns


def rho_over(pred: pd.DataFrame) -> str:
    """What the ρ intervals resample (predictiveness' ``ci_resamples``), for the scatters' caption."""
    joint = joint_rows(pred)
    if joint.all() and len(joint):
        return "over the scoring windows and the heads together"
    return "over the scoring windows and the heads where a score kept its window replicates, else over the heads" \
        if joint.any() else "over heads"


def make_pictures(scores: pd.DataFrame, curves: pd.DataFrame, baseline: dict, pred: pd.DataFrame,
                  scale: str = "value") -> list[Picture]:
    """The report's figures; ``scale``: heatmaps and scatters in each method's values or in shared ranks.

    curves.png draws the best ``@layer`` ranking the first screen names (:func:`.headline.best_layer_ranking`)
    beside the global rankings, and has a phone version with the best ranking, that one and random only."""
    layer = best_layer_ranking(curves)
    picked = _picked(curves)  # the ranking the run prunes by, drawn even where it is not among the best few
    keep = tuple(dict.fromkeys(m for m in (picked, layer) if m))  # the phone figure draws these alone (and random)
    shown = "" if layer is None else f" Of the per-layer normalised rankings, the best ({layer}) is drawn too."
    if picked is not None and picked != layer and picked not in shown_methods(curves, MAIN_CURVES):
        shown += f" So is {picked}, the ranking chosen on the even windows."
    pics = [Picture("curves.png", f"Perplexity and NLL increase against the share of heads pruned: the {MAIN_CURVES} "
                    "best rankings (lowest mean ΔNLL up to 50% pruned) and random; curves_all.png has every one "
                    "(colour: method family, Okabe-Ito; dash-dot-dot with stars / plus signs: mean- / "
                    "optimal-compensated; left, grey band: random ± 1 std over seeds; right, bands: 95% "
                    "paired-bootstrap intervals over the evaluation windows, for random over seeds and windows "
                    "together; top axis: heads removed)." + shown, plot_curves(curves, baseline, len(scores), keep),
                    phone_png=plot_curves_phone(curves, baseline, list(keep))),
            Picture("curves_all.png", "Every ranking's curves, as in curves.png.",
                    plot_curves(curves, baseline, len(scores), keep, best=None),
                    phone_png=plot_curves(curves, baseline, len(scores), keep, best=None, phone=True))]
    normalized = plot_layer_normalized(curves)
    if normalized is not None:
        pics.append(Picture("curves_layer_normalized.png", "Each weight and activation score ranked globally "
                            "(solid) and with its scores divided by their layer's norm (dashed, Michel et al. 2019): "
                            "a score that only fails across layers recovers when normalized.", normalized,
                            phone_png=plot_layer_normalized(curves, phone=True)))
    order = plot_pruning_order(scores)
    if order is not None:
        pics.append(Picture("pruning_order.png", "The order in which each method removes heads (1 = first), as the "
                            "curves prune: global ranking, lowest score first; dark: removed first, bright: removed "
                            "last, the important heads, as in the heatmaps.", order,
                            phone_png=plot_pruning_order(scores, phone=True)))
    methods = method_columns(scores)
    maps = "".join(f"<figure><figcaption>{html.escape(map_caption(scores, m))}</figcaption>{heatmap_svg(scores, m)}"
                   "</figure>" for m in methods)
    what = "importance ranks on one shared scale (1 = highest score)" if scale == "rank" else "scores"
    pics.append(Picture("heatmaps.png", f"Per-head {what} of every method (rows: layers, columns: heads; grey: "
                        "missing). On the page: hover a cell for its value and rank; heatmaps.png has the numbers in "
                        "the cells.", plot_heatmaps(scores, methods, scale), svg=maps))
    rho = dict(zip(pred["method"], pred["spearman_rho"].astype(float)))
    rho_ci = ({m: (float(lo), float(hi))
               for m, lo, hi in zip(pred["method"], pred["spearman_ci_lo"], pred["spearman_ci_hi"])}
              if "spearman_ci_lo" in pred else None)
    if rho:
        bars = " Grey bars: each score's 95% bootstrap interval over the scoring windows." if scale == "value" else ""
        pics.append(Picture("scatters.png", f"Each score against {TRUTH}, one point per head, coloured by layer; the "
                            f"heads that matter most by {TRUTH} named where their labels do not overlap; \u03c1 with "
                            f"its 95% interval {rho_over(pred)}.{bars}", plot_scatters(scores, rho, scale, rho_ci),
                            phone_png=plot_scatters(scores, rho, scale, rho_ci, phone=True)))
    pics.append(Picture("rank_correlation.png", "Rank correlations between all scoring methods, over heads.",
                        plot_rank_correlation(*rank_correlations(scores)),
                        phone_png=plot_rank_correlation(*rank_correlations(scores), phone=True)))
    return pics


def _picked(curves: pd.DataFrame) -> str | None:
    """The ranking the run prunes by (:func:`.choice.best_method`; None: no ranking)."""
    try:
        return best_method(curves)
    except HeadpruneError:
        return None


