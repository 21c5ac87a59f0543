"""Where a pruning curve breaks: the first measured share of heads removed at which its uncompensated ΔNLL rises
above :data:`BREAK_NATS`, and how finely the measured points locate it.

A curve on a 10% grid only says the break lies between two grid points; ``run`` measures the ranking it prunes by
again at the midpoint of that bracket (:func:`next_fraction`) until the bracket is at most :data:`REFINE_STEP`
wide or no head count lies inside it. With each point's 95% data-noise interval (``delta_nll_ci_lo/hi``: a paired
bootstrap over the test windows) the break lies, at that confidence point by point, after the last point certainly
below the line and before the first point certainly above it (:class:`Break`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

BREAK_NATS = 0.1  # a curve "breaks" where ΔNLL first exceeds this (perplexity +10.5%)
REFINE_STEP = 0.025  # run refines its pick's break bracket down to this width


@dataclass(frozen=True)
class Break:
    """``before``/``after``: the measured fractions around the break (``before`` the last at or below the line, 0
    for the unpruned model); ``lo``/``hi``: the last point whose 95% interval lies at or below the line (0: none
    before the break) and the first whose interval lies wholly above it (None: none measured, or no intervals);
    ``heads_before``/``heads_after``: the heads removed at ``before``/``after``."""

    before: float
    after: float
    heads_before: int
    heads_after: int
    lo: float | None
    hi: float | None


def uncompensated(curves: pd.DataFrame, method: str) -> pd.DataFrame:
    """``method``'s uncompensated points, by fraction."""
    rows = curves[(curves["method"] == method) & (curves["compensation"] == "none")]
    return rows.sort_values("fraction").reset_index(drop=True)


def find_break(curves: pd.DataFrame, method: str) -> Break | None:
    """The :class:`Break` of ``method``'s curve (None: it never rises above :data:`BREAK_NATS`)."""
    c = uncompensated(curves, method)
    over = c[c["delta_nll"] > BREAK_NATS]
    if over.empty:
        return None
    after = over.iloc[0]
    below = c[c["fraction"] < after["fraction"]]
    before = below.iloc[-1] if len(below) else None
    lo = hi = None
    if {"delta_nll_ci_lo", "delta_nll_ci_hi"} <= set(c.columns) and c["delta_nll_ci_hi"].notna().any():
        sure_below = below[below["delta_nll_ci_hi"] <= BREAK_NATS]
        lo = float(sure_below["fraction"].iloc[-1]) if len(sure_below) else 0.0
        sure_above = c[(c["fraction"] >= after["fraction"]) & (c["delta_nll_ci_lo"] > BREAK_NATS)]
        hi = float(sure_above["fraction"].iloc[0]) if len(sure_above) else None
    return Break(float(before["fraction"]) if before is not None else 0.0, float(after["fraction"]),
                 int(before["heads_pruned"]) if before is not None else 0, int(after["heads_pruned"]), lo, hi)


def next_fraction(curves: pd.DataFrame, method: str, heads_at: Callable[[float], int]) -> float | None:
    """The fraction to measure ``method`` at next to narrow its break: the midpoint of (before, after) while that
    bracket is wider than :data:`REFINE_STEP` and the midpoint removes a head count neither end removes
    (``heads_at(f)``: how many heads the ranking removes at ``f``); None when the break is located (or there is
    none)."""
    found = find_break(curves, method)
    if found is None or found.after - found.before <= REFINE_STEP + 1e-9:
        return None
    mid = round((found.before + found.after) / 2, 6)
    return mid if found.heads_before < heads_at(mid) < found.heads_after else None


def break_sentence(curves: pd.DataFrame, method: str) -> str | None:
    """Where ``method``'s curve breaks, between which measured points, and within what interval; None where it has
    no uncompensated points."""
    c = uncompensated(curves, method)
    if c.empty:
        return None
    line = f"ΔNLL above {BREAK_NATS} nats/token, perplexity +{math.expm1(BREAK_NATS):.1%}"
    found = find_break(curves, method)
    if found is None:
        return f"{method} does not break ({line}) up to {float(c['fraction'].max()):.1%} of heads removed."
    text = (f"{method} breaks ({line}) between {found.before:.1%} and {found.after:.1%} of heads removed "
            f"({found.heads_before} and {found.heads_after} heads)")
    if found.lo is not None:
        last = float(c["fraction"].max())
        upper = f"{found.hi:.1%}" if found.hi is not None else f"past {last:.1%} (no point is surely above the line)"
        text += f"; with each point's 95% interval, between {found.lo:.1%} and {upper}"
    return text + "."
