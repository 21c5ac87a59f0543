"""The report's section on layers removed whole (:mod:`.layers`): the table of every layer's joint ΔNLL on both
splits, its test share and its heads' single ablations summed, then the finding."""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprune.report.layers import (
    CHOSEN_ON,
    HI,
    LO,
    REPORTED_ON,
    joint_vs_sum,
    layer_finding,
    percent,
    singles_sum,
)
from headprune.report.render import Paragraph, Section, Table
from headprune.schema import LAYER_SCORE, TRUTH

SECTION_TITLE = "Layers removed whole"


def layers_view(layers: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """One row per layer: heads, joint ΔNLL [interval] on each split, the test share [interval], the sum of singles."""
    def cell(row: pd.Series) -> str:
        value = f"{row[LAYER_SCORE]:+.3f}"
        return value if np.isnan(row[LO]) else f"{value} [{row[LO]:+.3f}, {row[HI]:+.3f}]"

    by_split = {s: layers[layers["split"] == s].set_index("layer") for s in (CHOSEN_ON, REPORTED_ON)}
    test = by_split[REPORTED_ON]
    view = pd.DataFrame({"layer": test.index, "heads": test["n_heads"].to_numpy(),
                         f"ΔNLL together ({CHOSEN_ON})": [cell(r) for _, r in by_split[CHOSEN_ON].iterrows()],
                         f"ΔNLL together ({REPORTED_ON})": [cell(r) for _, r in test.iterrows()],
                         f"share ({REPORTED_ON})": [_share_cell(r) for _, r in test.iterrows()]})
    if TRUTH in scores.columns:
        sums = [singles_sum(scores, int(layer)) for layer in test.index]
        view[f"sum of single {TRUTH} ({CHOSEN_ON})"] = ["n/a" if v is None else f"{v:+.3f}" for v in sums]
    return view


def _share_cell(row: pd.Series) -> str:
    if np.isnan(row["share"]):
        return "n/a"
    return percent(row["share"]) + ("" if np.isnan(row["share_ci_lo"])
                                    else f" [{percent(row['share_ci_lo'])}, {percent(row['share_ci_hi'])}]")


def layers_section(layers: pd.DataFrame, scores: pd.DataFrame) -> Section:
    """The section: what was measured, the table, and the finding."""
    read = [f"{split} {int(rows['tokens'].iloc[0]):,} tokens in {int(rows['windows'].iloc[0])} windows"
            for split, rows in layers.groupby("split", sort=False)]
    brackets = "" if layers[LO].isna().all() else "; in brackets the 95% interval over resampled windows"
    lead = (f"Every head of one layer zero-ablated at once, each layer in turn ({', '.join(read)}){brackets}. "
            "A layer's single-head ablations summed is another number: its heads can stand in for each other (the "
            "sum overstates the joint ΔNLL) or need each other (it understates it).")
    versus = joint_vs_sum(layers, scores)
    return Section(SECTION_TITLE, [Paragraph(lead), Table(layers_view(layers, scores)),
                                   Paragraph(layer_finding(layers, scores)), *([Paragraph(versus)] if versus else [])])
