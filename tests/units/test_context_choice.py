"""The largest streaming share within a tolerance, its interval and the held-out choice (headprune.context.choice)
on curves built by hand: 4 KV heads, shares 0, 1/4, ..., 1; 4 windows; 4 prompts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from headprune.context.choice import RankingPoints, choose, cross_fit, curve_table, largest_shares

FULL_NLL = [2.0, 2.2, 1.8, 2.4]


def make(deltas: dict[str, list[list[float]]], rights: dict[str, list[list[int]]]):
    """curve + points: ranking -> per share (1/4 .. 1) per-window ΔNLL and per-prompt answers; the full model shared."""
    rows, points = [], {"full": {"tail_nll": FULL_NLL, "right": [1, 1, 1, 1]}}
    for name, per_share in deltas.items():
        rows.append({"ranking": name, "n_streaming": 0, "share": 0.0, "point": "full"})
        for n, (d, r) in enumerate(zip(per_share, rights[name]), start=1):
            key = f"{name}{n}"
            points[key] = {"tail_nll": [f + x for f, x in zip(FULL_NLL, d)], "right": r}
            rows.append({"ranking": name, "n_streaming": n, "share": n / 4, "point": key})
    return pd.DataFrame(rows), points


ALL = [1, 1, 1, 1]
CURVE, POINTS = make(
    {"a": [[0.005] * 4, [0.02] * 4, [0.003] * 4, [0.1] * 4],  # within 1% at 1/4 only (1/2 breaks the run)
     "b": [[0.0] * 4, [0.0] * 4, [0.04] * 4, [0.2] * 4]},  # within 5% to 3/4 by NLL, but 3/4 loses a prompt
    {"a": [ALL, ALL, ALL, ALL], "b": [ALL, ALL, [1, 1, 1, 0], [0, 0, 0, 0]]})


def test_largest_share_by_hand():
    table = largest_shares(CURVE, POINTS, (0.01, 0.05), replicates=100, seed=0)
    by_measure = table.set_index(["measure", "ranking", "tolerance"])
    shares = by_measure.loc["all"]
    # a: ΔNLL 0.005 ≤ log(1.01) = 0.00995 at 1/4; 0.02 breaks 1% at 1/2 (0.003 at 3/4 comes after the break);
    #    at 5% (log 1.05 = 0.0488) 1/4, 1/2, 3/4 pass and 1 (0.1) fails
    assert shares.loc[("a", 0.01), "share"] == 0.25 and shares.loc[("a", 0.05), "share"] == 0.75
    # b: ΔNLL 0 at 1/4 and 1/2; at 3/4 ΔNLL 0.04 passes 5% but accuracy 3/4 < 0.95 · 1
    assert shares.loc[("b", 0.01), "share"] == 0.5 and shares.loc[("b", 0.05), "share"] == 0.5
    # a's deltas are the same in every window and all its prompts right: every replicate agrees
    assert shares.loc[("a", 0.01), ["share_lo", "share_hi"]].tolist() == [0.25, 0.25]
    # b at 5%: a replicate that never draws the wrong prompt passes 3/4 (the interval reaches it), none passes 1
    assert shares.loc[("b", 0.05), "share_lo"] == 0.5 and shares.loc[("b", 0.05), "share_hi"] == 0.75
    assert shares.loc[("b", 0.01), "n_streaming"] == 2
    # one measure alone: b by perplexity passes 3/4 at 5% (0.04) and fails 1 (0.2); by accuracy it keeps 1/2
    # (3/4 loses a prompt at both tolerances); a's prompts are all right at every share: accuracy alone allows all
    assert by_measure.loc[("perplexity", "b", 0.05), "share"] == 0.75
    assert by_measure.loc[("perplexity", "a", 0.01), "share"] == 0.25
    assert by_measure.loc[("accuracy", "b", 0.01), "share"] == 0.5 == by_measure.loc[("accuracy", "b", 0.05), "share"]
    assert by_measure.loc[("accuracy", "a", 0.01), "share"] == 1.0
    assert len(table) == 2 * 3 * 2  # rankings × measures × tolerances
    no_prompts = {k: {**v, "right": []} for k, v in POINTS.items()}
    alone = largest_shares(CURVE, no_prompts, (0.01, 0.05), replicates=20)
    assert set(alone.measure) == {"all"} and (alone.set_index(["ranking", "tolerance"]).share
                                              == by_measure.loc["perplexity"].share).all()


def test_curve_table_by_hand():
    table = curve_table(CURVE, POINTS, replicates=50).set_index(["ranking", "n_streaming"])
    assert math.isclose(table.loc[("a", 2), "delta_nll"], 0.02, abs_tol=1e-12)
    assert math.isclose(table.loc[("a", 2), "tail_nll"], np.mean(FULL_NLL) + 0.02, abs_tol=1e-12)
    assert table.loc[("b", 3), "accuracy"] == 0.75 and table.loc[("b", 4), "accuracy"] == 0.0
    assert table.loc[("b", 3), "accuracy_lo"] <= 0.75 <= table.loc[("b", 3), "accuracy_hi"] == 1.0


def test_cross_fit_chooses_on_one_half_and_measures_on_the_other():
    # c is within 1% at 1/4 on the even windows (0, 2) only, d on the odd ones (1, 3); both break at 1/2
    curve, points = make({"c": [[0.0, 0.03, 0.0, 0.03], [0.1] * 4, [0.1] * 4, [0.1] * 4],
                          "d": [[0.03, 0.0, 0.03, 0.0], [0.1] * 4, [0.1] * 4, [0.1] * 4]},
                         {"c": [ALL] * 4, "d": [ALL] * 4})
    folds = cross_fit(curve, points, ["c", "d"], 0.01).set_index("fold")
    assert folds.loc[0, "ranking"] == "c" and folds.loc[0, "share"] == 0.25
    assert folds.loc[1, "ranking"] == "d" and folds.loc[1, "share"] == 0.25
    # each measured on the half it was not chosen on: the windows where it costs 0.03
    assert math.isclose(folds.loc[0, "held_out_delta_nll"], 0.03) and math.isclose(folds.loc[1, "held_out_delta_nll"],
                                                                                       0.03)
    assert folds.held_out_accuracy_drop.tolist() == [0.0, 0.0]
    assert folds.chosen_on.tolist() == ["2 windows, 2 prompts"] * 2
    # on every window neither is within 1% at 1/4 (mean 0.015): the pattern streams nothing
    assert choose(curve, points, ["c", "d"], 0.01) == ("none", 0.0)
    assert choose(CURVE, POINTS, ["a", "b"], 0.01) == ("b", 0.5)


def test_points_of_a_ranking():
    pts = RankingPoints.of(CURVE, POINTS, "b")
    assert pts.shares.tolist() == [0, 0.25, 0.5, 0.75, 1.0]
    assert pts.nll.shape == (5, 4) and pts.right.shape == (5, 4)
