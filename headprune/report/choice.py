"""The best ranking, chosen on one half of the evaluation windows and measured on the other.

A ranking's merit is its mean ΔNLL over its uncompensated points 0 < f ≤ 50% (the lowest wins; ties: by name),
read three ways: on every window (``delta_nll``), on the even windows alone and on the odd ones
(``delta_nll_even`` / ``delta_nll_odd``: :func:`headprune.pruning.curves.half_deltas`). The pick is the even
windows' choice, so what the odd windows measure of it is held out; the odd windows' own choice is the check
(cross-fitting). Where both halves choose the same ranking, each half's measure of it is held out from the other
half's choice, and the numbers on every window stand for it. Curves without both halves (a single window, tables
written before the halves were recorded) fall back to the choice on every window, and say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.report.findings import names
from headprune.report.tables import methods_by_curves, nearest_row
from headprune.schema import CURVE_HALVES, LAYER_NORMALIZED

EVEN, ODD = CURVE_HALVES


@dataclass(frozen=True)
class Choice:
    """The ranking chosen on every window, on the even windows and on the odd ones (None: no halves)."""

    on_all: str
    on_even: str | None = None
    on_odd: str | None = None

    @property
    def held_out(self) -> bool:
        return self.on_even is not None and self.on_odd is not None

    @property
    def pick(self) -> str:
        """The ranking used downstream: the even windows' choice, else (no halves) the choice on every window."""
        return self.on_even if self.on_even is not None else self.on_all

    @property
    def agree(self) -> bool:
        return self.held_out and self.on_even == self.on_odd


def choose(curves: pd.DataFrame) -> Choice:
    """The :class:`Choice` among the non-random rankings of ``curves``. HeadpruneError if none has a point with
    compensation none and 0 < fraction ≤ 50%."""
    ranked = methods_by_curves(curves)
    if not ranked:
        raise HeadpruneError("no non-random method has curve points with compensation none and 0 < fraction <= 0.5")
    if any(column not in curves for column in CURVE_HALVES):
        return Choice(ranked[0])
    halves = [methods_by_curves(curves, column) for column in CURVE_HALVES]
    if any(sorted(h) != sorted(ranked) for h in halves):  # a half missing for some ranking: no held-out choice
        return Choice(ranked[0])
    return Choice(ranked[0], halves[0][0], halves[1][0])


def best_method(curves: pd.DataFrame) -> str:
    """The ranking a run prunes by: :func:`choose`'s pick."""
    return choose(curves).pick


def layer_choice(curves: pd.DataFrame) -> Choice | None:
    """The :class:`Choice` among the ``<method>@layer`` rankings (None: there are none)."""
    layer = curves[curves["method"].str.endswith(LAYER_NORMALIZED)]
    try:
        return choose(layer) if len(layer) else None
    except HeadpruneError:
        return None


def half_delta(curves: pd.DataFrame, method: str, column: str, target: float) -> tuple[float, float]:
    """(fraction read, ΔNLL in ``column``) of ``method``'s uncompensated point nearest ``target``."""
    group = curves[(curves["method"] == method) & (curves["compensation"] == "none")]
    row = nearest_row(group, target)
    return float(row["fraction"]), float(row[column])


def choice_sentences(choices: list[Choice], curves: pd.DataFrame, targets: tuple[float, ...]) -> list[str]:
    """How each of ``choices`` was made: those chosen alike by both halves in one sentence, those chosen without
    halves in one, and each that the halves chose differently in its own (:func:`choice_sentence`)."""
    alike = [c.pick for c in choices if c.agree]
    plain = [c.on_all for c in choices if not c.held_out]
    out = []
    if alike:
        out.append(f"{names(alike)} {'was' if len(alike) == 1 else 'were each'} chosen on the even windows and on "
                   "the odd ones alike (lowest mean ΔNLL up to 50%), so each half's measure of "
                   f"{'it' if len(alike) == 1 else 'them'} is held out from the other half's choice.")
    out += [choice_sentence(c, curves, targets) for c in choices if c.held_out and not c.agree]
    if plain:
        one = len(plain) == 1
        out.append(f"{names(plain)} {'was' if one else 'were'} chosen on the curves that measure "
                   f"{'it' if one else 'them'}: no held-out choice.")
    return out


def choice_sentence(choice: Choice, curves: pd.DataFrame, targets: tuple[float, ...]) -> str:
    """How one ranking the halves chose differently was chosen, with each choice's ΔNLL at ``targets`` on the half
    that did not choose it (other choices: :func:`choice_sentences`)."""
    if not choice.held_out or choice.agree:
        return choice_sentences([choice], curves, targets)[0]
    parts = []  # at each target where both held-out numbers exist
    for target in targets:
        at, even_pick = half_delta(curves, choice.pick, ODD, target)  # at: the fraction read, nearest target
        _, odd_pick = half_delta(curves, str(choice.on_odd), EVEN, at)
        if math.isfinite(even_pick) and math.isfinite(odd_pick):
            parts.append(f"at {at:.0%}, {choice.pick} {even_pick:+.3f} on the odd windows and {choice.on_odd} "
                         f"{odd_pick:+.3f} on the even ones")
    text = (f"{choice.pick} was chosen on the even windows (lowest mean ΔNLL up to 50%), but the odd windows chose "
            f"{choice.on_odd}: the choice is not stable at this budget.")
    return text + (" Held out, ΔNLL (nats/token) " + "; ".join(parts) + "." if parts else "")
