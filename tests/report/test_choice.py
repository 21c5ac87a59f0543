"""The best ranking chosen on one half of the windows and measured on the other (headprune.report.choice), on
tables whose halves are set by hand: which ranking each half picks, what the run prunes by, what is said."""

from __future__ import annotations

import pandas as pd
import pytest

from headprune.errors import HeadpruneError
from headprune.report.choice import Choice, best_method, choice_sentence, choose, layer_choice
from headprune.report.headline import cost_answer
from headprune.report.render import make_content

from report_tables import BASELINE, SETTINGS, make_curves, make_scores

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


def test_a_ranking_without_a_half_is_left_out_of_the_halves_choice_and_no_halves_fall_back():
    curves = with_halves(make_curves(), EVEN, ODD)
    curves.loc[(curves["method"] == "abl_mean") & (curves["fraction"] > 0), "delta_nll_odd"] = float("nan")
    assert choose(curves) == Choice("taylor", "taylor", "taylor")  # abl_mean, even's best, has no odd half
    curves["delta_nll_odd"] = float("nan")
    assert choose(curves) == Choice("taylor")


def test_the_pick_is_named_best_on_the_even_windows_where_the_halves_disagree():
    split, alike = with_halves(make_curves(), EVEN, ODD), with_halves(make_curves(), ODD, ODD)
    assert "abl_mean (best on the even windows: lowest mean ΔNLL up to 50% there) " in cost_answer(split, BASELINE)
    assert "taylor (best: lowest mean ΔNLL up to 50%) " in cost_answer(alike, BASELINE)
    facts = lambda c: dict(make_content(make_scores(), c, SETTINGS, BASELINE).facts)["Best method"]
    # every window's mean ΔNLL of taylor up to 50%: 1.0·(1/12 + 3/12 + 6/12)/3; abl_mean's on the odd: 2.0·the same
    assert facts(alike) == ("taylor (lowest mean delta NLL over 0 < fraction <= 50%, compensation none, on the even "
                            "windows and on the odd ones alike: 0.2778 nats/token on every window)")
    assert facts(split) == ("abl_mean (lowest mean delta NLL over 0 < fraction <= 50%, compensation none, on the "
                            "even windows; the odd windows chose taylor; held out, on the odd windows: 0.5556 "
                            "nats/token)")
    assert facts(make_curves()).startswith("taylor (lowest mean delta NLL over 0 < fraction <= 50%, compensation "
                                           "none, chosen on the curves that measure it: 0.2778")


def test_points_read_once_each():
    """Asked at 30% and 50% on a grid that stops at 25%: one held-out point, said once."""
    curves = with_halves(make_curves(), EVEN, ODD)
    curves = curves[curves["fraction"] <= 0.25]
    text = choice_sentence(choose(curves), curves, (0.3, 0.5))
    assert text.count("at 25%") == 1 and text.endswith("taylor +0.300 on the even ones.")


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
