"""Which layer matters, from each layer's heads removed together (``layers.csv``: one row per split and layer,
:mod:`headprune.scoring.layers`): the layer is chosen on the validation split (largest joint ΔNLL) and its ΔNLL and
share are reported on the test split with their 95% intervals; the sum of its heads' single ablations (abl_zero) is
shown beside it and named as a sum. Torch-free: it reads the saved table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from headprune.io.work.files import read_table
from headprune.schema import LAYER_SCORE, LAYER_SPLITS, TRUTH
from headprune.table_checks import check_layers

LAYERS_FILE = "layers.csv"
CHOSEN_ON, REPORTED_ON = LAYER_SPLITS
LO, HI = f"{LAYER_SCORE}_ci_lo", f"{LAYER_SCORE}_ci_hi"


def read_layers(folder: Path) -> pd.DataFrame | None:
    """``folder``/layers.csv, checked (None where there is none)."""
    path = folder / LAYERS_FILE
    return check_layers(read_table(path)) if path.is_file() else None


@dataclass(frozen=True)
class LayerPick:
    """The layer whose heads, removed together, raise the validation NLL most, with its test-split row; the
    runner-up on the validation split with its test row (None for a one-layer model)."""

    layer: int
    test: pd.Series
    runner_up: int | None
    runner_up_test: pd.Series | None


def pick_layer(layers: pd.DataFrame) -> LayerPick:
    """:class:`LayerPick` of a checked layers table (ties: the smaller layer)."""
    chosen = layers[layers["split"] == CHOSEN_ON].sort_values([LAYER_SCORE, "layer"], ascending=[False, True],
                                                              kind="stable")
    test = layers[layers["split"] == REPORTED_ON]

    def test_row(layer: int) -> pd.Series:
        return test[test["layer"] == layer].iloc[0]

    order = [int(layer) for layer in chosen["layer"]]
    runner = order[1] if len(order) > 1 else None
    return LayerPick(order[0], test_row(order[0]), runner, test_row(runner) if runner is not None else None)


def interval_text(lo: float, hi: float) -> str:
    """``95% interval 0.350 to 0.500`` (empty without an interval)."""
    return "" if np.isnan(lo) or np.isnan(hi) else f"95% interval {lo:.3f} to {hi:.3f}"


def percent(share: float) -> str:
    """``21%``: whole percent (an integer, so a share a hair below 0 reads 0%, not -0%)."""
    return f"{round(share * 100)}%"


def share_text(row: pd.Series) -> str | None:
    """``21% of the layers' total (95% interval 18% to 25%)``; None where the share is undefined."""
    if np.isnan(row["share"]):
        return None
    lo, hi = row["share_ci_lo"], row["share_ci_hi"]
    inner = "" if np.isnan(lo) or np.isnan(hi) else f"95% interval {percent(lo)} to {percent(hi)}"
    return f"{percent(row['share'])} of the layers' total" + (f" ({inner})" if inner else "")


def delta_text(row: pd.Series) -> str:
    """``+0.420 nats/token (95% interval 0.350 to 0.500)``."""
    inner = interval_text(row[LO], row[HI])
    return f"{row[LAYER_SCORE]:+.3f} nats/token" + (f" ({inner})" if inner else "")


def layer_answer(layers: pd.DataFrame) -> str:
    """The first screen's sentence: the layer chosen on validation and its test ΔNLL with its interval (its share:
    the findings)."""
    pick = pick_layer(layers)
    return (f"Removed together, layer {pick.layer}'s heads cost most on {CHOSEN_ON}; on {REPORTED_ON} "
            f"{delta_text(pick.test)}.")


def singles_sum(scores: pd.DataFrame, layer: int) -> float | None:
    """abl_zero summed over ``layer``'s heads (None without abl_zero, or where a head of the layer lacks it)."""
    if TRUTH not in scores.columns:
        return None
    values = scores.loc[scores["layer"] == layer, TRUTH].to_numpy(float)
    return float(values.sum()) if len(values) and np.isfinite(values).all() else None


def layer_finding(layers: pd.DataFrame, scores: pd.DataFrame) -> str:
    """The findings' sentence: the chosen layer's joint ΔNLL and share on the test split, its heads' single
    ablations summed (validation, named as a sum), and the runner-up's joint ΔNLL."""
    pick = pick_layer(layers)
    n = int(pick.test["n_heads"])
    text = (f"Layer {pick.layer} matters most (largest NLL increase with all of a layer's heads zero-ablated "
            f"together on the {CHOSEN_ON} split): removing its {n} heads changes the {REPORTED_ON} NLL by "
            f"{delta_text(pick.test)}")
    share = share_text(pick.test)
    text += f", {share}" if share else ""
    total = singles_sum(scores, pick.layer)
    if total is not None:
        text += f"; its heads' single {TRUTH} ablations sum to {total:.3f} ({CHOSEN_ON} split, a sum of singles)"
    if pick.runner_up is not None and pick.runner_up_test is not None:
        text += f"; the runner-up on {CHOSEN_ON}, layer {pick.runner_up}: {delta_text(pick.runner_up_test)} on " \
                f"{REPORTED_ON}"
    return text + "."


def joint_vs_sum(layers: pd.DataFrame, scores: pd.DataFrame) -> str | None:
    """On the validation split (where abl_zero was measured): in how many layers the joint ΔNLL's 95% interval lies
    above the sum of the layer's single abl_zero values, and in how many below (None without abl_zero or
    intervals)."""
    rows = layers[layers["split"] == CHOSEN_ON]
    found = [singles_sum(scores, int(layer)) for layer in rows["layer"]]
    if any(v is None for v in found) or rows[LO].isna().any():
        return None
    sums = np.array(found, dtype=float)
    above, below = int((rows[LO].to_numpy() > sums).sum()), int((rows[HI].to_numpy() < sums).sum())
    return (f"On the {CHOSEN_ON} split, removing a layer's heads together costs more than their single {TRUTH} "
            f"ablations summed in {above} of {len(rows)} layers and less in {below} (the joint ΔNLL's 95% interval "
            "above or below the sum).")
