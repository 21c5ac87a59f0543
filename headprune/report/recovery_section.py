"""The report's recovery part (``curve --recover STEPS``): perplexity before and after fine-tuning each pruned
point, and the share of the perplexity gap recovered, (P_pruned − P_recovered) / (P_pruned − P_unpruned).

Curves with a ``recover_steps`` column are split (:func:`split_recovered`): the rows with 0 are the usual curves
(everything else in the report reads only them), the others the recovered points shown here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headprune.report.plots.common import Picture, curve_styles, render_png
from headprune.report.render import Note, Paragraph, Section, Table
from headprune.schema import RECOVER_COLUMN

RECOVERY_PICTURE = "recovery.png"


def split_recovered(curves: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(the curves as pruned, without the column; the recovered rows, or None where there are none)."""
    if RECOVER_COLUMN not in curves.columns:
        return curves, None
    steps = curves[RECOVER_COLUMN]
    before = curves[steps == 0].drop(columns=RECOVER_COLUMN).reset_index(drop=True)
    recovered = curves[steps > 0].reset_index(drop=True)
    return before, (recovered if len(recovered) else None)


def recovery_table(before: pd.DataFrame, recovered: pd.DataFrame, baseline: dict) -> pd.DataFrame:
    """One row per recovered point: perplexity pruned and recovered, and the share of the gap recovered."""
    keys = ["method", "compensation", "fraction"]
    merged = recovered.merge(before[[*keys, "ppl"]], on=keys, how="left", suffixes=("_recovered", "_pruned"))
    gap = merged["ppl_pruned"] - baseline["ppl"]
    share = (merged["ppl_pruned"] - merged["ppl_recovered"]) / gap.where(gap > 0)
    return pd.DataFrame({"method": merged["method"], "compensation": merged["compensation"],
                         "fraction": merged["fraction"], "heads_pruned": merged["heads_pruned"],
                         RECOVER_COLUMN: merged[RECOVER_COLUMN], "ppl_pruned": merged["ppl_pruned"],
                         "ppl_recovered": merged["ppl_recovered"], "gap_recovered": share})


def plot_recovery(table: pd.DataFrame, baseline: dict) -> bytes:
    """Perplexity against % of heads pruned: solid as pruned, dashed after recovery, one colour per method."""
    fig = Figure(figsize=(7.5, 4.4))
    ax = fig.subplots()
    styles = curve_styles(list(dict.fromkeys(table["method"])))
    for (method, comp), g in table.groupby(["method", "compensation"], sort=False):
        x, suffix = 100 * g["fraction"].to_numpy(), "" if comp == "none" else f" ({comp}-compensated)"
        color, marker = styles[str(method)]["color"], styles[str(method)]["marker"]
        ax.plot(x, g["ppl_pruned"], color=color, marker=marker, ms=4, ls="-", label=f"{method}{suffix}, pruned")
        ax.plot(x, g["ppl_recovered"], color=color, marker=marker, ms=4, ls="--", mfc="white",
                label=f"{method}{suffix}, after {int(g[RECOVER_COLUMN].iloc[0])} steps")
    if np.isfinite(baseline["ppl"]):
        ax.axhline(baseline["ppl"], color="grey", ls=":", lw=1, label=f"unpruned ({baseline['ppl']:.2f})")
    ax.set(xlabel="heads pruned (%)", ylabel="perplexity", title="Before and after recovery")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return render_png(fig)


def recovery_sentence(table: pd.DataFrame) -> str:
    """The headline: the share of the gap recovered at the largest fraction pruned, per method."""
    top = table[table["fraction"] == table["fraction"].max()]
    parts = [f"{r.method}{'' if r.compensation == 'none' else f' ({r.compensation})'} {r.gap_recovered:.0%}"
             for r in top.itertuples()
             if np.isfinite(r.gap_recovered)]
    steps = int(table[RECOVER_COLUMN].max())
    if not parts:
        return f"Recovery ({steps} fine-tuning steps): no point lost perplexity to recover."
    return (f"{steps} fine-tuning steps recover this share of the perplexity gap at {top['fraction'].iloc[0]:.0%} of "
            f"heads pruned: {', '.join(parts)}.")


def recovery_parts(before: pd.DataFrame, recovered: pd.DataFrame, baseline: dict
                   ) -> tuple[Section, Picture, pd.DataFrame]:
    """The report section, its picture and its table (written as recovery.csv)."""
    table = recovery_table(before, recovered, baseline)
    pic = Picture(RECOVERY_PICTURE, "Perplexity as pruned (solid) and after fine-tuning every pruned point (dashed); "
                  "fraction 0 dashed: the unpruned model after the same steps.", plot_recovery(table, baseline))
    note = ("gap_recovered = (ppl_pruned − ppl_recovered) / (ppl_pruned − unpruned ppl): 1 is back to the unpruned "
            "model, above 1 better than it (the steps also train what pruning did not touch: compare fraction 0).")
    section = Section("Recovery after pruning", [Paragraph(recovery_sentence(table)), pic, Table(table), Note(note)])
    return section, pic, table
