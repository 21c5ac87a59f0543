"""The study's last section, "What holds at this budget": each headline finding of the run and the study rated from
the 95% intervals in its own table. Certified: the intervals separate the way the finding says (more tokens would
not change it, at that confidence); contested: they overlap (more tokens could go either way); refuted: they
separate the other way. Every rule reads one table; nothing here loads a model.

- any finding whose table has no intervals: contested;
- the costliest head: certified where its abl_zero interval lies above every other head's;
- the top 5 heads: certified where each of them lies above every head outside them;
- which heads help at all: certified where every head's interval excludes 0 (their sign is decided);
- the layer that matters most (chosen on validation; a model of more than one layer): on the test split, certified
  where its interval lies above every other layer's, refuted where another layer's lies above its own;
- the best cheap score: certified where its Spearman ρ interval lies above 0, refuted where below;
- the best ranking's choice: certified where the even and the odd windows choose it alike;
- the best ranking against random at 30% and 50%: certified where its ΔNLL interval lies below random's (over
  seeds and windows), refuted where above;
- where the best ranking breaks: certified where the points' intervals locate it between the same two points as
  the values do (no intervals, or none wholly above the line: contested);
- query heads against whole KV groups by the same score (abl_zero, summed over a group), at each head count the units
  are compared at: certified where the query heads' ΔNLL interval lies below the groups', refuted where above;
- distillation: contested while it has no control run and one seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analyses.study_recovery import (
    arms_at,
    controlled,
    corpora,
    difference_text,
    gap_text,
    ranking_fractions,
    ranking_of,
    wins_most,
)
from analyses.study_recovery import verdict as distilled_verdict
from analyses.study_units import GROUP, QUERY, at_count, compared_counts, verdict
from headprune.report.breaks import BREAK_NATS, find_break, uncompensated
from headprune.report.choice import choose
from headprune.report.layers import CHOSEN_ON, REPORTED_ON, pick_layer, read_layers
from headprune.report.tables import nearest_row

CERTIFIED, CONTESTED, REFUTED = "certified", "contested", "refuted"
TOP = 5
TARGETS = (0.3, 0.5)


@dataclass(frozen=True)
class Status:
    finding: str
    evidence: str
    status: str


def _interval(value: float, lo: float, hi: float, sign: str = "") -> str:
    return f"{value:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"


def _above(lo: float, hi: float, floor_lo: float, floor_hi: float) -> str:
    """The claim "the interval [lo, hi] lies above [floor_lo, floor_hi]": certified where it does, refuted where it
    lies below, else contested."""
    if lo > floor_hi:
        return CERTIFIED
    return REFUTED if hi < floor_lo else CONTESTED


def _unmeasured(*frames: pd.DataFrame) -> bool:
    """Whether any interval column of ``frames`` is empty (a run with --bootstrap 0): nothing can be certified."""
    return any(f.isna().any().any() for f in frames)


def _heads(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def top_head(scores: pd.DataFrame) -> Status:
    ranked = scores.sort_values("abl_zero", ascending=False, kind="stable")
    top, rest = ranked.iloc[0], ranked.iloc[1:]
    if _unmeasured(ranked[["abl_zero_ci_lo", "abl_zero_ci_hi"]]):
        return Status(f"{top['head_id']} is the costliest head to zero-ablate", "no intervals", CONTESTED)
    overlap = rest[rest["abl_zero_ci_hi"] >= top["abl_zero_ci_lo"]]
    evidence = f"{top['head_id']} {_interval(top['abl_zero'], top['abl_zero_ci_lo'], top['abl_zero_ci_hi'])}"
    evidence += (f"; its interval overlaps {len(overlap)} other heads' ({_heads(list(overlap['head_id']))})"
                 if len(overlap) else "; above every other head's interval")
    return Status(f"{top['head_id']} is the costliest head to zero-ablate", evidence,
                  CONTESTED if len(overlap) else CERTIFIED)


def top_five(scores: pd.DataFrame) -> Status:
    ranked = scores.sort_values("abl_zero", ascending=False, kind="stable")
    inside, outside = ranked.iloc[:TOP], ranked.iloc[TOP:]
    finding = f"the top {TOP} heads by abl_zero are {_heads(list(inside['head_id']), TOP)}"
    if _unmeasured(ranked[["abl_zero_ci_lo", "abl_zero_ci_hi"]]) or outside.empty:
        return Status(finding, "no intervals, or no head outside them", CONTESTED)
    ceiling = float(outside["abl_zero_ci_hi"].max())
    sure = list(inside.loc[inside["abl_zero_ci_lo"] > ceiling, "head_id"])
    named = f" ({_heads(sure, TOP)})" if sure else ""
    return Status(finding,
                  f"certified members: {len(sure)} of {TOP}{named}, whose interval lies above every interval outside "
                  f"the top {TOP} (the highest upper end outside: {ceiling:.3f})",
                  CERTIFIED if len(sure) == TOP else CONTESTED)


def signs(scores: pd.DataFrame) -> Status:
    if _unmeasured(scores[["abl_zero_ci_lo", "abl_zero_ci_hi"]]):
        return Status("which heads help (zero-ablating them raises the NLL)", "no intervals", CONTESTED)
    helps = int((scores["abl_zero_ci_lo"] > 0).sum())
    hurts = int((scores["abl_zero_ci_hi"] < 0).sum())
    open_ = len(scores) - helps - hurts
    width = float((scores["abl_zero_ci_hi"] - scores["abl_zero_ci_lo"]).median())
    size = float(scores["abl_zero"].abs().median())
    evidence = (f"{helps} of {len(scores)} heads help, {hurts} hurt, {open_} have an interval that includes 0 "
                f"(median interval width {width:.3f} against a median absolute abl_zero of {size:.3f})")
    return Status("which heads help (zero-ablating them raises the NLL)",
                  evidence + (": their sign is open at this budget" if open_ else ""),
                  CONTESTED if open_ else CERTIFIED)


def top_layer(layers: pd.DataFrame) -> Status | None:
    pick = pick_layer(layers)
    layer, row = pick.layer, pick.test
    test = layers[layers["split"] == REPORTED_ON].set_index("layer")
    others = test.drop(layer)
    if others.empty:
        return None  # one layer: nothing to compare it with
    if _unmeasured(test[["abl_layer_ci_lo", "abl_layer_ci_hi"]]):
        return Status(f"layer {layer}'s heads, removed together, cost most", "no intervals", CONTESTED)
    value = _interval(row["abl_layer"], row["abl_layer_ci_lo"], row["abl_layer_ci_hi"], "+")
    evidence = (f"layer {layer} (chosen on {CHOSEN_ON}) {value} on {REPORTED_ON}; the highest other upper end: layer "
                f"{int(others['abl_layer_ci_hi'].idxmax())} {others['abl_layer_ci_hi'].max():+.3f}")
    status = _above(row["abl_layer_ci_lo"], row["abl_layer_ci_hi"], others["abl_layer_ci_lo"].max(),
                    others["abl_layer_ci_hi"].max())
    return Status(f"layer {layer}'s heads, removed together, cost most", evidence, status)


def best_cheap(pred: pd.DataFrame) -> Status:
    cheap = pred[(pred["kind"] == "importance") & ~pred["method"].str.startswith("abl_")]
    best = cheap.sort_values("spearman_rho", ascending=False, kind="stable").iloc[0]
    finding = f"{best['method']}, the best cheap score, ranks heads like abl_zero"
    if _unmeasured(cheap[["spearman_ci_lo", "spearman_ci_hi"]].iloc[:1]):
        return Status(finding, f"Spearman ρ {best['spearman_rho']:+.3f}, no interval", CONTESTED)
    rho = _interval(best["spearman_rho"], best["spearman_ci_lo"], best["spearman_ci_hi"], "+")
    return Status(finding, f"Spearman ρ {rho} over {int(best['n'])} heads",
                  _above(best["spearman_ci_lo"], best["spearman_ci_hi"], 0.0, 0.0))


def choice(curves: pd.DataFrame) -> Status:
    picked = choose(curves)
    if not picked.held_out:
        return Status(f"{picked.pick} is the best ranking", "no held-out choice (no even/odd halves)", CONTESTED)
    evidence = (f"the even windows choose {picked.on_even}, the odd ones {picked.on_odd}"
                + (" alike" if picked.agree else ""))
    return Status(f"{picked.pick} is the best ranking", evidence, CERTIFIED if picked.agree else CONTESTED)


def versus_random(curves: pd.DataFrame, target: float) -> Status:
    pick = choose(curves).pick
    mine, rand = (nearest_row(uncompensated(curves, m), target) for m in (pick, "random"))
    if _unmeasured(pd.DataFrame([mine, rand])[["delta_nll_ci_lo", "delta_nll_ci_hi"]]):
        return Status(f"{pick} prunes {target:.0%} of heads better than random", "no intervals", CONTESTED)
    ours, theirs = (_interval(r["delta_nll"], r["delta_nll_ci_lo"], r["delta_nll_ci_hi"]) for r in (mine, rand))
    evidence = (f"ΔNLL {ours} at {mine['fraction']:.1%}; random {theirs} (over {int(rand['n_seeds'])} seeds and the "
                "windows)")
    status = _above(rand["delta_nll_ci_lo"], rand["delta_nll_ci_hi"], mine["delta_nll_ci_lo"], mine["delta_nll_ci_hi"])
    return Status(f"{pick} prunes {target:.0%} of heads better than random", evidence, status)


def breaks(curves: pd.DataFrame) -> Status | None:
    pick = choose(curves).pick
    found = find_break(curves, pick)
    if found is None:
        return None
    where = f"between {found.before:.1%} and {found.after:.1%} of heads"
    if found.hi is None:
        return Status(f"{pick} breaks {where}", f"no point's interval lies wholly above {BREAK_NATS} nats/token (or "
                      "the points have no intervals)", CONTESTED)
    sure = f"{(found.lo or 0.0):.1%} to {found.hi:.1%}"
    same = (found.lo or 0.0, found.hi) == (found.before, found.after)
    return Status(f"{pick} breaks {where}", f"with each point's 95% interval: {sure}",
                  CERTIFIED if same else CONTESTED)


def distillation(recovery: pd.DataFrame) -> list[Status]:
    """Per fraction: the ranking's prune, distilled, wins back more than half its gap, and ends below a random prune
    distilled the same way, on every evaluation corpus (:mod:`analyses.study_recovery`); one contested row for a
    table of one seed and no control."""
    if not controlled(recovery):
        shares = ", ".join(f"{r.gap_recovered:.0%} at {r.fraction:.0%}" for r in recovery.itertuples())
        return [Status("distillation wins back most of the gap", f"{shares}; one seed, no control run (a random prune "
                       "or the unpruned model trained the same way), measured on the corpus it trained on", CONTESTED)]
    rows, best = [], ranking_of(recovery)
    for f in ranking_fractions(recovery):
        pairs = {c: arms_at(recovery, f, c) for c in corpora(recovery)}
        gaps = {wins_most(mine) for mine, _ in pairs.values()}
        rows.append(Status(f"distillation wins back most of {best}'s gap at {f:.0%}",
                           "; ".join(f"{gap_text(mine)} on {c}" for c, (mine, _) in pairs.items()),
                           CERTIFIED if gaps == {"yes"} else REFUTED if gaps == {"no"} else CONTESTED))
        said = {distilled_verdict(mine, rand) for mine, rand in pairs.values()}
        rows.append(Status(f"distilled, {best}'s prune ends below a random prune at {f:.0%}",
                           "; ".join(f"ΔNLL {difference_text(*pair)} on {c}" for c, pair in pairs.items()),
                           CERTIFIED if said == {"ends below"} else REFUTED if said == {"ends above"} else CONTESTED))
    return rows


def query_vs_group(units: pd.DataFrame, n: int, n_heads: int) -> Status:
    """At ``n`` heads removed: removing query heads costs less than removing whole KV groups, both by abl_zero."""
    query, group = at_count(units, QUERY, n), at_count(units, GROUP, n)
    assert query is not None and group is not None
    finding = f"query heads cost less than whole KV groups at {n} heads removed ({n / n_heads:.0%}), by one score"
    if _unmeasured(pd.DataFrame([query, group])[["delta_nll_ci_lo", "delta_nll_ci_hi"]]):
        return Status(finding, "no intervals", CONTESTED)
    ours, theirs = (_interval(r["delta_nll"], r["delta_nll_ci_lo"], r["delta_nll_ci_hi"], "+") for r in (query, group))
    status = {"cost less than": CERTIFIED, "cost more than": REFUTED}.get(verdict(query, group), CONTESTED)
    return Status(finding, f"ΔNLL {ours} by query heads, {theirs} by KV groups (abl_zero summed)", status)


def statuses(run: Path) -> list[Status]:
    """Every rated finding of the run folder ``run``, in the study's order."""
    scores, curves = pd.read_csv(run / "scores.csv"), pd.read_csv(run / "curves.csv")
    layers = read_layers(run)
    rows = [top_head(scores), top_five(scores), signs(scores)]
    rows += [s for s in (top_layer(layers) if layers is not None else None,) if s is not None]
    rows += [best_cheap(pd.read_csv(run / "predictiveness.csv")), choice(curves)]
    rows += [versus_random(curves, t) for t in TARGETS]
    rows += [s for s in (breaks(curves),) if s is not None]
    units = pd.read_csv(run / "study_units.csv")
    rows += [query_vs_group(units, n, len(scores)) for n in compared_counts(units, len(scores))]
    rows += distillation(pd.read_csv(run / "study_recovery.csv"))
    return rows


def status_section(run: Path) -> str:
    """The markdown section: a line on the rules, then one table row per finding."""
    rows = statuses(run)
    counts = {s: sum(r.status == s for r in rows) for s in (CERTIFIED, CONTESTED, REFUTED)}
    rules = ("Each finding rated from the 95% intervals in its own table (the rules: `analyses/study_status.py`): "
             "certified where they separate as the finding says, contested where they overlap, refuted where they "
             f"separate the other way. Here {counts[CERTIFIED]} certified, {counts[CONTESTED]} contested, "
             f"{counts[REFUTED]} refuted.")
    lines = ["## What holds at this budget", "", rules, "", "| finding | evidence | status |", "|---|---|---|"]
    lines += [f"| {r.finding} | {r.evidence} | {r.status} |" for r in rows]
    return "\n".join(lines) + "\n"
