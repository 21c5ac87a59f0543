"""The best ranking, chosen on one half of the evaluation windows and measured on the other.

A ranking's merit is its mean ΔNLL over its uncompensated points 0 < f ≤ 50% (the lowest wins; ties: by name),
read three ways: on every window (``delta_nll``), on the even windows alone and on the odd ones
(``delta_nll_even`` / ``delta_nll_odd``: :func:`headprune.pruning.curves.half_deltas`). The pick is the even
windows' choice, so what the odd windows measure of it is held out; the odd windows' own choice is the check
(cross-fitting). Where both halves choose the same ranking, each half's measure of it is held out from the other
half's choice, and the numbers on every window stand for it. Curves without both halves (a single window, tables
written before the halves were recorded) fall back to the choice on every window, and say so.

The halves interleave windows of the same documents: "held out" means other windows, not other documents (and with
overlapping windows, ``stride`` < ``seq_len``, neighbouring windows share context tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.report.numbers import names
from headprune.report.tables import methods_by_curves, read_at
from headprune.schema import CURVE_HALVES, LAYER_NORMALIZED

EVEN, ODD = CURVE_HALVES
RULE = "lowest mean ΔNLL up to 50%"  # the merit every choice uses, as the report says it


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

    @property
    def label(self) -> str:
        """How the pick is named beside its numbers: best on the even windows where the odd ones chose another."""
        return f"best on the even windows: {RULE} there" if self.held_out and not self.agree else f"best: {RULE}"


def choose(curves: pd.DataFrame) -> Choice:
    """The :class:`Choice` among the non-random rankings of ``curves``: the halves choose among the rankings that
    have a merit on both halves. HeadpruneError if none has a point with compensation none and 0 < fraction ≤ 50%."""
    ranked = methods_by_curves(curves)
    if not ranked:
        raise HeadpruneError("no non-random method has curve points with compensation none and 0 < fraction <= 0.5")
    if any(column not in curves for column in CURVE_HALVES):
        return Choice(ranked[0])
    halves = [methods_by_curves(curves, column) for column in CURVE_HALVES]
    both = set(halves[0]) & set(halves[1])
    if not both:  # no ranking has both halves: no held-out choice
        return Choice(ranked[0])
    even, odd = ([m for m in h if m in both] for h in halves)
    return Choice(ranked[0], even[0], odd[0])


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


def choice_sentences(choices: list[Choice], curves: pd.DataFrame, targets: tuple[float, ...]) -> list[str]:
    """How each of ``choices`` was made: those chosen alike by both halves in one sentence, those chosen without
    halves in one, and each that the halves chose differently in its own (:func:`choice_sentence`)."""
    alike = [c.pick for c in choices if c.agree]
    plain = [c.on_all for c in choices if not c.held_out]
    out = []
    if alike:
        out.append(f"{names(alike)} {'was' if len(alike) == 1 else 'were each'} chosen on the even windows and on "
                   f"the odd ones alike ({RULE}), so each half's measure of {'it' if len(alike) == 1 else 'them'} "
                   "is held out from the other half's choice.")
    out += [choice_sentence(c, curves, targets) for c in choices if c.held_out and not c.agree]
    if plain:
        one = len(plain) == 1
        out.append(f"{names(plain)} {'was' if one else 'were'} chosen on the curves that measure "
                   f"{'it' if one else 'them'}: no held-out choice.")
    return out


def held_out_points(choice: Choice, curves: pd.DataFrame, targets: tuple[float, ...]
                    ) -> list[tuple[float, float, float]]:
    """(fraction, the pick's ΔNLL on the odd windows, the odd windows' choice's on the even ones) at each distinct
    point nearest one of ``targets`` where both rankings have a finite value."""
    points: list[tuple[float, float, float]] = []
    for at in dict.fromkeys(r[0] for t in targets if (r := read_at(curves, choice.pick, ODD, t)) is not None):
        pick, other = read_at(curves, choice.pick, ODD, at), read_at(curves, str(choice.on_odd), EVEN, at)
        if pick is not None and other is not None and other[0] == at and math.isfinite(pick[1] + other[1]):
            points.append((at, pick[1], other[1]))
    return points


def choice_sentence(choice: Choice, curves: pd.DataFrame, targets: tuple[float, ...]) -> str:
    """How one ranking the halves chose differently was chosen, with each choice's ΔNLL on the half that did not
    choose it at the points nearest ``targets`` (other choices: :func:`choice_sentences`)."""
    if not choice.held_out or choice.agree:
        return choice_sentences([choice], curves, targets)[0]
    parts = [f"at {at:.0%}, {choice.pick} {pick:+.3f} on the odd windows and {choice.on_odd} {other:+.3f} on the even "
             "ones" for at, pick, other in held_out_points(choice, curves, targets)]
    text = (f"{choice.pick} was chosen on the even windows ({RULE}), but the odd windows chose {choice.on_odd}: the "
            "choice is not stable at this budget.")
    return text + (" Held out, ΔNLL (nats/token) " + "; ".join(parts) + "." if parts else "")
