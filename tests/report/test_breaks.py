"""Where a curve breaks (headprune.report.breaks), on curves set by hand: the bracket, its intervals, the midpoints
run measures next, and the sentence in each of its forms."""

import pandas as pd

from headprune.report.breaks import Break, break_sentence, find_break, next_fraction


def curve(points, method="grad", ci=None) -> pd.DataFrame:
    """(fraction, ΔNLL, heads) points, uncompensated; ``ci``: a half-width per point."""
    rows = [{"method": method, "compensation": "none", "fraction": f, "delta_nll": d, "heads_pruned": h}
            for f, d, h in points]
    frame = pd.DataFrame(rows)
    if ci is not None:
        frame["delta_nll_ci_lo"] = frame["delta_nll"] - ci
        frame["delta_nll_ci_hi"] = frame["delta_nll"] + ci
    return frame


GRID = [(0.0, 0.0, 0), (0.1, 0.04, 4), (0.2, 0.09, 8), (0.3, 0.25, 12), (0.4, 0.6, 16)]


def test_the_break_lies_between_the_last_point_on_or_below_the_line_and_the_first_above():
    assert find_break(curve(GRID), "grad") == Break(0.2, 0.3, 8, 12, None, None)
    exactly = curve([(0.0, 0.0, 0), (0.1, 0.1, 4), (0.2, 0.1000001, 8)])
    assert find_break(exactly, "grad") == Break(0.1, 0.2, 4, 8, None, None)  # 0.1 itself is not above
    assert find_break(curve([(0.0, 0.0, 0), (0.1, 0.5, 4)]), "grad").before == 0.0
    assert find_break(curve(GRID[:3]), "grad") is None


def test_intervals_widen_the_bracket_to_the_points_surely_on_each_side():
    # half-widths 0.03: 0.2 (0.06–0.12) and 0.3 (0.22–0.28) straddle nothing; 0.1 (0.01–0.07) is surely below
    ci = pd.Series([0.0, 0.03, 0.03, 0.03, 0.03])
    assert find_break(curve(GRID, ci=ci), "grad") == Break(0.2, 0.3, 8, 12, 0.1, 0.3)
    wide = pd.Series([0.0, 0.07, 0.05, 0.2, 0.1])  # 0.1 reaches 0.11; 0.3 reaches down to 0.05: 0.4 is first above
    assert find_break(curve(GRID, ci=wide), "grad") == Break(0.2, 0.3, 8, 12, 0.0, 0.4)
    none_above = pd.Series([0.0, 0.0, 0.0, 0.2, 0.6])
    assert find_break(curve(GRID, ci=none_above), "grad").hi is None


def test_run_measures_midpoints_until_the_bracket_is_two_and_a_half_percent():
    heads_at = lambda f: round(f * 40)
    frame = curve(GRID)
    assert next_fraction(frame, "grad", heads_at) == 0.25
    frame = pd.concat([frame, curve([(0.25, 0.2, 10)])])  # above: the bracket is now 0.2–0.25
    assert next_fraction(frame, "grad", heads_at) == 0.225
    frame = pd.concat([frame, curve([(0.225, 0.095, 9)])])
    assert next_fraction(frame, "grad", heads_at) is None  # 0.225–0.25: located
    assert next_fraction(curve(GRID), "grad", lambda f: 8) is None  # the midpoint removes no new head count
    assert next_fraction(curve(GRID[:3]), "grad", heads_at) is None  # no break


def test_the_sentence_in_each_form():
    line = "ΔNLL above 0.1 nats/token, perplexity +10.5%"
    assert break_sentence(curve(GRID), "grad") == (f"grad breaks ({line}) between 20.0% and 30.0% of heads removed "
                                                   "(8 and 12 heads).")
    ci = pd.Series([0.0, 0.07, 0.05, 0.2, 0.1])
    assert break_sentence(curve(GRID, ci=ci), "grad").endswith(
        "(8 and 12 heads); with each point's 95% interval, between 0.0% and 40.0%.")
    ci = pd.Series([0.0, 0.0, 0.0, 0.2, 0.6])
    assert break_sentence(curve(GRID, ci=ci), "grad").endswith(
        "with each point's 95% interval, between 20.0% and past 40.0% (no point is surely above the line).")
    assert break_sentence(curve(GRID[:3]), "grad") == f"grad does not break ({line}) up to 20.0% of heads removed."
    assert break_sentence(curve(GRID), "taylor") is None
