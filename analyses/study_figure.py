"""The real-model study's figure (study.png): pruning by unit beside the run's curves, and each head's ablation cost on
prose against code with the anatomy's strongest induction and previous-token heads marked."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyses.study_findings import TOP, prose_code_roles


def plot_study(curves: pd.DataFrame, units: pd.DataFrame, rec: pd.DataFrame, scores: pd.DataFrame,
               code: pd.DataFrame, anatomy: pd.DataFrame, best: str):
    """Left: ΔNLL against heads removed by unit (query head, KV group, uniform) and random, with the distilled
    points; right: each head's zero-ablation cost on prose against code, the strongest induction and
    previous-token heads marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.4), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    n_heads = len(scores)

    def line(frame: pd.DataFrame, method: str, label: str, **style) -> None:
        c = frame[(frame["method"] == method) & (frame["compensation"] == "none")].sort_values("fraction")
        ax.plot(c["heads_pruned"] / n_heads, c["delta_nll"], label=label, **style)

    if best != "abl_zero":  # (drawn next)
        line(curves, best, f"{best} (query heads)", color="#0072B2", marker="o")
    line(curves, "abl_zero", "abl_zero (query heads)", color="#009E73", marker="s")
    line(curves, "random", "random query heads (mean of seeds)", color="grey", marker=".")
    line(units, "group:abl_zero", "KV groups by joint abl_zero", color="#D55E00", marker="^")
    rand = units[units["method"].str.startswith("group:random")].groupby("fraction")[["heads_pruned", "delta_nll"]]
    rand = rand.mean().reset_index()
    ax.plot(rand["heads_pruned"] / n_heads, rand["delta_nll"], color="grey", ls="--", marker="x",
            label="random KV groups (mean)")
    for m, color in zip(sorted(units["method"][units["method"].str.startswith("uniform:")].unique()),
                        ("#CC79A7", "#E69F00")):
        line(units, m, f"uniform by {m.split(':', 1)[1]}", color=color, marker="D", ls=":")
    ax.scatter(rec["heads_pruned"] / n_heads, np.log(rec["ppl_distilled"] / rec["ppl_unpruned"]), marker="*", s=140,
               color="#0072B2", zorder=5, label=f"{best} distilled ({int(rec['steps'].iloc[0])} steps)")
    ax.set(xlabel="share of heads removed", ylabel="ΔNLL (nats/token, test split)",
           title="Pruning by unit")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.legend(fontsize=8)
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
    return fig
