"""The studies' "What holds at this budget" table (issue 53, item 7): every row's status recomputed here, with code
of its own, from the table the row cites, on the committed studies; and each rule broken on purpose by a table made
to flip it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyses.study_status import CERTIFIED, CONTESTED, REFUTED, best_cheap, top_head, top_layer, versus_random
from tests.report.test_claims import arm_stats, difference_stats

ROOT = Path(__file__).resolve().parents[2]
STUDIES = [p.parent for p in sorted((ROOT / "reports").glob("*/study.md"))
           if (p.parent / "study_recovery.csv").is_file()]


def rows_of(md: str) -> list[tuple[str, str, str]]:
    section = md.split("## What holds at this budget", 1)[1]
    return [tuple(cell.strip() for cell in line.strip("|").split(" | "))  # type: ignore[misc]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| finding")]


def status_of(lo_mine: float, hi_mine: float, lo_theirs: float, hi_theirs: float, lower_is_better: bool) -> str:
    """Certified where the intervals separate the claimed way, refuted the other way, else contested."""
    if lower_is_better:
        lo_mine, hi_mine, lo_theirs, hi_theirs = -hi_mine, -lo_mine, -hi_theirs, -lo_theirs
    if lo_mine > hi_theirs:
        return CERTIFIED
    return REFUTED if hi_mine < lo_theirs else CONTESTED


def point_at(curves: pd.DataFrame, method: str, fraction: float) -> pd.Series:
    """``method``'s uncompensated point nearest ``fraction``."""
    rows = curves[(curves["compensation"] == "none") & (curves["method"] == method)]
    return rows.loc[(rows["fraction"] - fraction).abs().idxmin()]


@pytest.mark.parametrize("folder", STUDIES, ids=[p.name for p in STUDIES])
def test_every_status_is_recomputed_from_its_table(folder):
    rows = rows_of((folder / "study.md").read_text())
    scores = pd.read_csv(folder / "scores.csv").sort_values("abl_zero", ascending=False, kind="stable")
    curves = pd.read_csv(folder / "curves.csv")
    checked = 0
    for finding, evidence, status in rows:
        assert status in (CERTIFIED, CONTESTED, REFUTED)
        if finding.endswith("is the costliest head to zero-ablate"):
            top = scores.iloc[0]
            assert finding.startswith(top["head_id"])
            beaten = (scores.iloc[1:]["abl_zero_ci_hi"] < top["abl_zero_ci_lo"]).all()
            assert status == (CERTIFIED if beaten else CONTESTED)
        elif finding.startswith("the top 5 heads"):
            outside = scores.iloc[5:]["abl_zero_ci_hi"].max()
            sure = int((scores.iloc[:5]["abl_zero_ci_lo"] > outside).sum())
            assert f"certified members: {sure} of 5" in evidence
            assert status == (CERTIFIED if sure == 5 else CONTESTED)
        elif finding.startswith("which heads help"):
            open_ = int(((scores["abl_zero_ci_lo"] <= 0) & (scores["abl_zero_ci_hi"] >= 0)).sum())
            assert f", {open_} have an interval that includes 0" in evidence
            assert status == (CONTESTED if open_ else CERTIFIED)
        elif "removed together, cost most" in finding:
            layers = pd.read_csv(folder / "layers.csv")
            val = layers[layers["split"] == "validation"]
            layer = int(val.loc[val["abl_layer"].idxmax(), "layer"])
            assert finding.startswith(f"layer {layer}'s heads")
            test = layers[layers["split"] == "test"].set_index("layer")
            others = test.drop(layer)
            want = status_of(test.loc[layer, "abl_layer_ci_lo"], test.loc[layer, "abl_layer_ci_hi"],
                             others["abl_layer_ci_lo"].max(), others["abl_layer_ci_hi"].max(), False)
            if (others["abl_layer_ci_lo"] > test.loc[layer, "abl_layer_ci_hi"]).any():
                want = REFUTED
            assert status == want
        elif "better than random" in finding:
            method, target = re.match(r"(\S+) prunes (\d+)% of heads better than random", finding).groups()
            mine, rand = (point_at(curves, m, int(target) / 100) for m in (method, "random"))
            assert status == status_of(mine["delta_nll_ci_lo"], mine["delta_nll_ci_hi"], rand["delta_nll_ci_lo"],
                                       rand["delta_nll_ci_hi"], True)
        elif "the best cheap score" in finding:
            pred = pd.read_csv(folder / "predictiveness.csv")
            cheap = pred[(pred["kind"] == "importance") & ~pred["method"].str.startswith("abl_")]
            best = cheap.loc[cheap["spearman_rho"].idxmax()]
            assert finding.startswith(best["method"])
            assert status == status_of(best["spearman_ci_lo"], best["spearman_ci_hi"], 0.0, 0.0, False)
        elif finding.endswith("is the best ranking"):
            plain = curves[(curves["compensation"] == "none") & (curves["method"] != "random")
                           & (curves["fraction"] > 0) & (curves["fraction"] <= 0.5 + 1e-9)]
            shared = plain.groupby("fraction")["method"].nunique()
            grid = shared[shared == plain["method"].nunique()].index
            halves = [plain[plain["fraction"].isin(grid)].groupby("method")[c].mean().idxmin()
                      for c in ("delta_nll_even", "delta_nll_odd")]
            assert finding.startswith(halves[0])
            assert status == (CERTIFIED if halves[0] == halves[1] else CONTESTED)
        elif " breaks between " in finding:
            m = re.search(r"with each point's 95% interval: ([\d.]+)% to ([\d.]+)%", evidence)
            said = re.search(r"between ([\d.]+)% and ([\d.]+)% of heads", finding)
            assert m and said
            assert status == (CERTIFIED if m.groups() == said.groups() else CONTESTED)
        elif finding.startswith(("distillation", "distilled, ")):
            rec = pd.read_csv(folder / "study_recovery.csv")
            if "arm" not in rec.columns:
                assert status == CONTESTED and "no control run" in evidence
            else:
                assert status == distilled_status(finding, rec)
        else:
            continue
        checked += 1
    assert checked >= 10


def distilled_status(finding: str, rec: pd.DataFrame) -> str:
    """A distillation row's status from the table, on every evaluation corpus: the ranking's prune wins back more
    than half its gap (the interval's worse end above 50%), or ends below the random prunes (the difference's
    interval below 0)."""
    f = int(re.search(r"at (\d+)%$", finding)[1]) / 100
    sides = []
    for corpus in rec["measured_on"].unique():
        at = rec[np.isclose(rec["fraction"], f) & (rec["measured_on"] == corpus)]
        mine, rand = (at[at["arm"] == a] for a in ("ranking", "random"))
        if finding.startswith("distillation wins back most"):
            m, _, _, half, p0, pp = arm_stats(mine)
            worst, best = ((pp - math.exp(m + k * half)) / (pp - p0) for k in (1, -1))
            sides.append(1 if worst > 0.5 else -1 if best < 0.5 else 0)
        else:
            d, both = difference_stats(mine, rand)
            sides.append(1 if d + both < 0 else -1 if d - both > 0 else 0)
    return CERTIFIED if set(sides) == {1} else REFUTED if set(sides) == {-1} else CONTESTED


def _scores(values: list[tuple[float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"head_id": f"L0H{i}", "abl_zero": v, "abl_zero_ci_lo": lo, "abl_zero_ci_hi": hi}
                         for i, (v, lo, hi) in enumerate(values)])


def test_the_costliest_head_is_certified_only_where_its_interval_clears_every_other():
    assert top_head(_scores([(0.3, 0.25, 0.35), (0.2, 0.15, 0.24)])).status == CERTIFIED
    assert top_head(_scores([(0.3, 0.25, 0.35), (0.2, 0.15, 0.26)])).status == CONTESTED


def _layers(test: list[tuple[float, float, float]], chosen: int) -> pd.DataFrame:
    rows = [{"split": "validation", "layer": i, "abl_layer": 1.0 if i == chosen else 0.1, "abl_layer_ci_lo": 0.0,
             "abl_layer_ci_hi": 2.0} for i in range(len(test))]
    rows += [{"split": "test", "layer": i, "abl_layer": v, "abl_layer_ci_lo": lo, "abl_layer_ci_hi": hi}
             for i, (v, lo, hi) in enumerate(test)]
    return pd.DataFrame(rows)


def test_the_layer_is_refuted_where_another_layer_clears_it_on_test():
    assert top_layer(_layers([(1.0, 0.9, 1.1), (0.5, 0.4, 0.6)], chosen=0)).status == CERTIFIED
    assert top_layer(_layers([(1.0, 0.9, 1.1), (0.95, 0.7, 1.2)], chosen=0)).status == CONTESTED
    assert top_layer(_layers([(0.5, 0.4, 0.6), (1.0, 0.9, 1.1)], chosen=0)).status == REFUTED


def test_a_ranking_worse_than_random_is_refuted():
    def row(method, delta, lo, hi, fraction):
        return {"method": method, "compensation": "none", "fraction": fraction, "heads_pruned": round(10 * fraction),
                "params": 100, "nll": 3 + delta, "ppl": 20.0, "delta_nll": delta, "delta_ppl": 0.0, "nll_std": 0.1,
                "ppl_std": 0.1, "delta_nll_ci_lo": lo, "delta_nll_ci_hi": hi,
                "n_seeds": 10 if method == "random" else 1}
    curves = pd.DataFrame([row("a", 0.0, 0.0, 0.0, 0.0), row("random", 0.0, 0.0, 0.0, 0.0),
                           row("a", 2.0, 1.8, 2.2, 0.3), row("random", 1.0, 0.8, 1.2, 0.3)])
    assert versus_random(curves, 0.3).status == REFUTED
    curves.loc[2, ["delta_nll", "delta_nll_ci_lo", "delta_nll_ci_hi"]] = [0.5, 0.4, 0.6]
    assert versus_random(curves, 0.3).status == CERTIFIED


def test_a_table_without_intervals_certifies_nothing():
    nan = float("nan")
    assert top_head(_scores([(0.3, nan, nan), (0.2, nan, nan)])).status == CONTESTED
    layers = _layers([(1.0, 0.9, 1.1), (0.5, 0.4, 0.6)], chosen=0)
    layers.loc[layers["split"] == "test", ["abl_layer_ci_lo", "abl_layer_ci_hi"]] = nan
    assert top_layer(layers).status == CONTESTED
    assert top_layer(_layers([(1.0, 0.9, 1.1)], chosen=0)) is None  # one layer: nothing to compare


def test_a_cheap_score_whose_interval_lies_below_0_is_refuted():
    def pred(lo, hi):
        return pd.DataFrame([{"method": "wo_fro", "kind": "importance", "spearman_rho": (lo + hi) / 2, "n": 48,
                              "spearman_ci_lo": lo, "spearman_ci_hi": hi}])
    assert [best_cheap(pred(*i)).status for i in ((0.1, 0.5), (-0.1, 0.5), (-0.5, -0.1))] == [
        CERTIFIED, CONTESTED, REFUTED]


def test_distillation_statuses_on_randomised_tables():
    from analyses.study_status import distillation
    from tests.report.test_claims import random_recovery

    seen = set()
    for seed in range(40):
        rec = random_recovery(seed)
        rows = distillation(rec)
        assert len(rows) == 4  # two fractions, two claims each
        for row in rows:
            assert row.status == distilled_status(row.finding, rec), (seed, row)
            seen.add((row.finding.split(" ")[0], row.status))
    assert seen == {(w, s) for w in ("distillation", "distilled,") for s in (CERTIFIED, CONTESTED, REFUTED)}
