"""The best ranking chosen on one half of the windows and measured on the other (headprune.report.choice), on
tables whose halves are set by hand: which ranking each half picks, what the run prunes by, what is said."""

from __future__ import annotations

import pandas as pd
import pytest

from headprune.errors import HeadpruneError
from headprune.report.choice import Choice, best_method, choice_sentence, choose, layer_choice
from headprune.report.headline import cost_answer

from report_tables import BASELINE, make_curves

# ΔNLL per fraction on the even and the odd windows: taylor is best on the whole (make_curves) and on the odd
# windows; abl_mean on the even ones (its mean up to 50%, 1.0·(1+3+6)/12/3, is below taylor's 1.2·…)
EVEN = {"taylor": 1.2, "abl_mean": 1.0, "wo_fro": 2.0, "random": 3.0}
ODD = {"taylor": 0.8, "abl_mean": 2.0, "wo_fro": 2.0, "random": 3.0}


def with_halves(curves: pd.DataFrame, even: dict, odd: dict) -> pd.DataFrame:
    out = curves.copy()
    out["delta_nll_even"] = [even[m] * f for m, f in zip(out["method"], out["fraction"], strict=True)]
    out["delta_nll_odd"] = [odd[m] * f for m, f in zip(out["method"], out["fraction"], strict=True)]
    return out


def test_without_halves_the_choice_is_made_on_every_window_and_said_to_be():
    choice = choose(make_curves())
    assert choice == Choice("taylor") and not choice.held_out and choice.pick == "taylor"
    assert choice_sentence(choice, make_curves(), (0.3,)) == \
        "taylor was chosen on the curves that measure it: no held-out choice."


def test_halves_that_agree_give_one_held_out_ranking():
    curves = with_halves(make_curves(), ODD, ODD)
    choice = choose(curves)
    assert (choice.on_all, choice.on_even, choice.on_odd, choice.agree) == ("taylor", "taylor", "taylor", True)
    assert "taylor was chosen on the even windows and on the odd ones alike" in cost_answer(curves, BASELINE)


def test_halves_that_disagree_prune_by_the_even_choice_and_measure_each_on_the_other_half():
    curves = with_halves(make_curves(), EVEN, ODD)
    choice = choose(curves)
    assert (choice.on_all, choice.on_even, choice.on_odd, choice.agree) == ("taylor", "abl_mean", "taylor", False)
    assert best_method(curves) == "abl_mean"  # what the run prunes, compensates and exports by
    # asked at 30%, read at the nearest point 3/12: abl_mean on the odd windows 2.0·0.25, taylor on the even 1.2·0.25
    assert choice_sentence(choice, curves, (0.3,)) == (
        "abl_mean was chosen on the even windows (lowest mean ΔNLL up to 50%), but the odd windows chose taylor: "
        "the choice is not stable at this budget. Held out, ΔNLL (nats/token) at 25%, abl_mean +0.500 on the odd "
        "windows and taylor +0.300 on the even ones.")


def test_a_ranking_without_a_half_falls_back_to_the_whole():
    curves = with_halves(make_curves(), EVEN, ODD)
    curves.loc[(curves["method"] == "wo_fro") & (curves["fraction"] > 0), "delta_nll_odd"] = float("nan")
    assert choose(curves) == Choice("taylor")


def test_the_layer_choice_reads_only_layer_normalised_rankings():
    curves = with_halves(make_curves(), EVEN, ODD)
    assert layer_choice(curves) is None
    layer = curves[curves["method"] != "random"].assign(method=lambda d: d["method"] + "@layer")
    both = pd.concat([curves, layer], ignore_index=True)
    assert layer_choice(both) == Choice("taylor@layer", "abl_mean@layer", "taylor@layer")
    assert choose(both).on_all in {"taylor", "taylor@layer"}


def test_no_ranking_up_to_half_is_refused():
    with pytest.raises(HeadpruneError, match="no non-random method"):
        choose(make_curves().query("method == 'random'"))
