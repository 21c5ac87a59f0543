"""The real-model study's units part (analyses.study_units): the head counts the units are compared at, and each
sentence against a table built by hand."""

from __future__ import annotations

import pandas as pd

from analyses.study_status import CERTIFIED, CONTESTED, REFUTED, query_vs_group
from analyses.study_units import compared_counts, group_count, unit_counts, unit_sentences


def test_counts_are_whole_kv_groups_and_the_uniform_shapes_counts():
    # SmolLM2: 270 heads in groups of 3; its uniform shapes remove 0, 90, 150, 180, 210 or 240 heads
    assert unit_counts(270, 3, [0, 90, 150, 180, 210, 240]) == [27, 54, 81, 90, 135, 150]
    # Gemma 3 270M: 72 heads in groups of 4 (one KV head a layer): 7.2 -> 8, 14.4 -> 16, 21.6 -> 20, 36; the
    # uniform shapes remove 36 or 54 (75%, above the 60% compared)
    assert unit_counts(72, 4, [0, 36, 54]) == [8, 16, 20, 36]
    assert unit_counts(72, 4, [18, 24]) == [8, 16, 20, 24, 36]  # 18 heads is no whole number of KV groups
    assert group_count(0.01, 72, 4) == 4  # at least one group


def _rows(method: str, counts, deltas, width=0.05, params_per_head=100) -> list[dict]:
    return [{"method": method, "compensation": "none", "fraction": n / 20, "heads_pruned": h, "delta_nll": d,
             "delta_nll_ci_lo": d - width, "delta_nll_ci_hi": d + width, "params_removed": params_per_head * h}
            for n, h, d in zip((4, 6, 10), counts, deltas)]


def _units() -> pd.DataFrame:
    """20 heads in KV groups of 2; counts 4, 6 and 10; the one uniform shape removes 10 heads."""
    return pd.DataFrame(_rows("query:abl_zero", (4, 6, 10), (0.05, 0.1, 0.5))
                        + _rows("group:abl_zero", (4, 6, 10), (0.2, 0.3, 0.52), params_per_head=150)
                        + _rows("group:joint", (4, 6, 10), (0.15, 0.25, 0.45), params_per_head=150)
                        + _rows("uniform:abl_zero", (10, 10, 10), (0.8, 0.8, 0.8))
                        + _rows("query:random#0", (4, 6, 10), (0.5, 0.6, 1.0))
                        + _rows("query:random#1", (4, 6, 10), (0.7, 0.8, 1.4))
                        + _rows("group:random#0", (4, 6, 10), (0.9, 1.0, 2.0))
                        + _rows("group:random#1", (4, 6, 10), (1.1, 2.0, 3.0)))


def test_units_are_stated_at_the_counts_they_removed():
    units = _units()
    assert compared_counts(units, 20) == [6, 10]  # 30% and 50% of 20; 10 is also the uniform shape's count
    at6, at10 = unit_sentences(units, 20)
    assert at6 == ("At 6 of 20 heads removed (30%), ΔNLL in nats/token [95% interval over windows]: query heads by "
                   "abl_zero +0.100 [+0.050, +0.150]; KV groups by the same score (summed) +0.300 [+0.250, +0.350]; "
                   "KV groups by their joint ablation +0.250 [+0.200, +0.300]; random query heads +0.700 (mean of 2 "
                   "seeds, range +0.600 to +0.800); random KV groups +1.500 (mean of 2 seeds, range +1.000 to "
                   "+2.000). Query heads cost less than KV groups by the same score, removing 600 parameters against "
                   "900.")
    assert at10.startswith("At 10 of 20 heads removed (50%; the count a uniform shape removes)")
    assert "uniform by abl_zero +0.800 [+0.750, +0.850]" in at10  # its row at 10 heads, wherever it was asked
    assert "Query heads are not told apart from KV groups" in at10  # 0.45-0.55 against 0.47-0.57
    reversed_ = units.assign(delta_nll_ci_lo=units["delta_nll_ci_lo"].where(units["method"] != "query:abl_zero",
                                                                            0.9),
                             delta_nll_ci_hi=units["delta_nll_ci_hi"].where(units["method"] != "query:abl_zero", 1.0))
    assert "Query heads cost more than KV groups" in unit_sentences(reversed_, 20)[0]


def test_the_status_of_query_heads_against_kv_groups():
    units = _units()
    assert query_vs_group(units, 6, 20).status == CERTIFIED
    assert query_vs_group(units, 10, 20).status == CONTESTED
    flipped = units.assign(delta_nll_ci_lo=units["delta_nll_ci_lo"] + 2 * (units["method"] == "query:abl_zero"),
                           delta_nll_ci_hi=units["delta_nll_ci_hi"] + 2 * (units["method"] == "query:abl_zero"))
    assert query_vs_group(flipped, 6, 20).status == REFUTED
    assert query_vs_group(units.assign(delta_nll_ci_lo=float("nan")), 6, 20).status == CONTESTED
