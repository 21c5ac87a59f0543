"""The real-model study's figure (study.png): pruning by unit at equal head counts, against heads and against
parameters removed, beside the run's curve; and each head's ablation cost on prose against code with the anatomy's
strongest induction and previous-token heads marked."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyses.study_findings import TOP, prose_code_roles
from analyses.study_recovery import RANDOM, RANKING, distilled_points
from analyses.study_units import GROUP, JOINT, QUERY


def units_panel(axis, units: pd.DataFrame, n_heads: int, x: str, scale: float) -> None:
    """ΔNLL against ``x`` (heads_pruned or params_removed) over ``scale``: every unit at the counts it removed as
    asked, and the random query heads' and KV groups' ranges over their seeds."""
    def line(method: str, label: str, **style) -> None:
        c = units[units["method"] == method]
        c = c[np.isclose(c["heads_pruned"], c["fraction"] * n_heads)].sort_values("heads_pruned")
        axis.plot(c[x] / scale, c["delta_nll"], label=label, **style)

    for prefix, label, color in (("query:random#", "random query heads", "grey"),
                                 ("group:random#", "random KV groups", "#D55E00")):
        rand = units[units["method"].str.startswith(prefix)].groupby("heads_pruned")
        band = rand.agg(x=(x, "mean"), lo=("delta_nll", "min"), hi=("delta_nll", "max"),
                        mean=("delta_nll", "mean")).reset_index()
        axis.fill_between(band["x"] / scale, band["lo"], band["hi"], color=color, alpha=0.15,
                          label=f"{label} ({rand.size().max()} seeds: range)")
        axis.plot(band["x"] / scale, band["mean"], color=color, ls="--", lw=1)
    line(QUERY, "query heads by abl_zero", color="#009E73", marker="s")
    line(GROUP, "KV groups by abl_zero (summed)", color="#D55E00", marker="^")
    line(JOINT, "KV groups by joint ablation", color="#D55E00", marker="v", ls=":")
    for m, color in zip(sorted(units["method"][units["method"].str.startswith("uniform:")].unique()),
                        ("#CC79A7", "#E69F00")):
        line(m, f"uniform by {m.split(':', 1)[1]}", color=color, marker="D", ls=":")
    axis.set_yscale("symlog", linthresh=0.01)
    axis.set_ylabel("ΔNLL (nats/token, test split)")


def roles_panel(bx, scores: pd.DataFrame, code: pd.DataFrame, anatomy: pd.DataFrame) -> None:
    """Each head's abl_zero on prose against code, the strongest induction and previous-token heads marked."""
    j = prose_code_roles(scores, code, anatomy)
    bx.scatter(j["abl_zero"], j["code"], s=12, color="lightgrey", label="every head")
    for role, color, marker in (("induction", "#D55E00", "^"), ("previous_token", "#0072B2", "s")):
        top = j.nlargest(TOP, role)
        bx.scatter(top["abl_zero"], top["code"], s=40, color=color, marker=marker,
                   label=f"{TOP} strongest {role.replace('_', '-')} heads")
    named = pd.concat([j.nlargest(3, "abl_zero"), j.nlargest(3, "code")]).drop_duplicates("head_id")
    for k, r in enumerate(named.sort_values("abl_zero").itertuples()):  # labels alternate below and above
        bx.annotate(r.head_id, (r.abl_zero, r.code), fontsize=8, textcoords="offset points",
                    xytext=(-34, -12) if k % 2 else (4, 4))
    bx.set(xlabel="abl_zero on prose (nats/token)", ylabel="abl_zero on code (nats/token)",
           title="Which heads cost the most: prose vs code")
    ticks = [-0.01, 0.0, 0.01, 0.1]
    bx.set_xscale("symlog", linthresh=0.005)
    bx.set_yscale("symlog", linthresh=0.005)
    bx.set_xticks(ticks, [f"{t:g}" for t in ticks])
    bx.set_yticks(ticks, [f"{t:g}" for t in ticks])
    bx.legend(fontsize=8)


def plot_study(curves: pd.DataFrame, units: pd.DataFrame, rec: pd.DataFrame, scores: pd.DataFrame,
               code: pd.DataFrame, anatomy: pd.DataFrame, best: str):
    """Left: ΔNLL against heads removed by unit (query heads, KV groups, uniform shapes, at equal head counts) and
    the random ranges, with the run's best ranking and the distilled points; middle: the same against parameters
    removed (the legend of both); right: :func:`roles_panel`."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.4), layout="constrained")
    ax, px, bx = fig.subplots(1, 3)
    n_heads = len(scores)
    units_panel(ax, units, n_heads, "heads_pruned", n_heads)
    if best != "abl_zero":
        c = curves[(curves["method"] == best) & (curves["compensation"] == "none")].sort_values("fraction")
        ax.plot(c["heads_pruned"] / n_heads, c["delta_nll"], color="#0072B2", marker="o", ms=3,
                label=f"{best} (query heads, the run's curve)")
    points = distilled_points(rec)
    for kind, color, name in ((RANKING, "#0072B2", best), (RANDOM, "#777777", "random prunes")):
        p = points[points["arm"] == kind]
        if len(p):
            ax.scatter(p["heads_pruned"] / n_heads, p["delta_nll"], marker="*", s=140, color=color, zorder=5,
                       label=f"{name} distilled ({int(p['steps'].iloc[0])} steps, mean of seeds)")
    ax.set(xlabel="share of heads removed", title="Pruning by unit: heads")
    n_params = float(curves.loc[curves["fraction"] == 0, "params"].iloc[0])
    units_panel(px, units, n_heads, "params_removed", n_params)
    px.set(xlabel="share of parameters removed", title="Pruning by unit: parameters")
    px.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="lower right")  # both panels' lines, where it is empty
    roles_panel(bx, scores, code, anatomy)
    return fig
