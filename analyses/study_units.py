"""The study's units part: query heads, KV groups and uniform shapes compared at equal head counts and by the same
score, against random query heads and random KV groups.

At each count n of heads removed (each of :data:`UNIT_FRACTIONS` of the heads rounded to whole KV groups of r query
heads, and each count a loadable uniform shape removes, up to :data:`UNIFORM_UP_TO` of the heads):

- ``query:abl_zero``: the n query heads of lowest abl_zero;
- ``group:abl_zero``: the n/r KV groups of lowest abl_zero summed over their query heads: the same score as
  ``query:abl_zero``, so the two differ in the unit alone;
- ``group:joint``: the n/r KV groups whose joint ablation (all their heads at once) costs least: another score;
- ``uniform:abl_zero``, ``uniform:{best}``: the best uniform prune (what stock transformers loads at smaller shapes)
  nearest n, stated only at the counts a shape removes exactly;
- ``query:random#s``, ``group:random#s``: n random query heads and n/r random KV groups, s < :data:`RANDOM_SEEDS`.

Each row has ``params_removed``: a KV group takes its K and V rows with it, so at equal heads the units differ in
parameters, and the figure shows both axes. The sentences (:func:`unit_sentences`) are generated from the table.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

UNIT_FRACTIONS = (0.1, 0.2, 0.3, 0.5)
COMPARED = (0.3, 0.5)  # fractions whose counts the sentences compare at, beside the uniform shapes' counts
UNIFORM_UP_TO = 0.6  # uniform shapes removing more than this share of heads are left out
RANDOM_SEEDS = 10
QUERY, GROUP, JOINT = "query:abl_zero", "group:abl_zero", "group:joint"


def group_count(fraction: float, n_heads: int, group_size: int) -> int:
    """round(fraction · n_heads) rounded to whole KV groups (at least one group)."""
    return group_size * max(1, round(fraction * n_heads / group_size))


def unit_counts(n_heads: int, group_size: int, uniform_counts: Iterable[int]) -> list[int]:
    """The head counts the units are compared at: :data:`UNIT_FRACTIONS` in whole groups, and the uniform shapes'
    counts (multiples of the group size up to :data:`UNIFORM_UP_TO`)."""
    counts = {group_count(f, n_heads, group_size) for f in UNIT_FRACTIONS}
    counts |= {n for n in uniform_counts if 0 < n <= UNIFORM_UP_TO * n_heads and n % group_size == 0}
    return sorted(counts)


def compared_counts(units: pd.DataFrame, n_heads: int) -> list[int]:
    """Counts the sentences state: the measured count nearest each of :data:`COMPARED` of the heads, and each count
    a uniform shape removes exactly."""
    measured = sorted(set(units.loc[units["method"] == QUERY, "heads_pruned"].astype(int)))
    if not measured:
        return []
    uniform = set(units.loc[units["method"].str.startswith("uniform:"), "heads_pruned"].astype(int))
    wanted = {min(measured, key=lambda n: (abs(n - f * n_heads), n)) for f in COMPARED} | (uniform & set(measured))
    return sorted(wanted)


def at_count(units: pd.DataFrame, method: str, n: int) -> pd.Series | None:
    """``method``'s row removing exactly ``n`` heads (None where it has none)."""
    rows = units[(units["method"] == method) & (units["heads_pruned"] == n)]
    return rows.iloc[0] if len(rows) else None


def _value(row: pd.Series) -> str:
    return f"{row.delta_nll:+.3f} [{row.delta_nll_ci_lo:+.3f}, {row.delta_nll_ci_hi:+.3f}]"


def _band(units: pd.DataFrame, prefix: str, n: int) -> str | None:
    """'+m (mean of S seeds, range a to b)' of the random rows ``prefix#s`` removing ``n`` heads."""
    rows = units[units["method"].str.startswith(prefix + "#") & (units["heads_pruned"] == n)]
    if rows.empty:
        return None
    d = rows["delta_nll"]
    return f"{d.mean():+.3f} (mean of {len(d)} seeds, range {d.min():+.3f} to {d.max():+.3f})"


def verdict(query: pd.Series, group: pd.Series) -> str:
    """Query heads against KV groups by the same score, from their intervals: 'cost less than', 'cost more than'
    (intervals apart) or 'are not told apart from' (they overlap)."""
    if query.delta_nll_ci_hi < group.delta_nll_ci_lo:
        return "cost less than"
    if query.delta_nll_ci_lo > group.delta_nll_ci_hi:
        return "cost more than"
    return "are not told apart from"


def unit_sentence(units: pd.DataFrame, n: int, n_heads: int) -> str:
    """The units compared at ``n`` heads removed (see the module docstring)."""
    query, group, joint = (at_count(units, m, n) for m in (QUERY, GROUP, JOINT))
    assert query is not None and group is not None
    uniform = sorted(m for m in units["method"].unique() if m.startswith("uniform:"))
    exact = [(m, row) for m in uniform if (row := at_count(units, m, n)) is not None]
    parts = [f"query heads by abl_zero {_value(query)}", f"KV groups by the same score (summed) {_value(group)}"]
    if joint is not None:
        parts.append(f"KV groups by their joint ablation {_value(joint)}")
    parts += [f"uniform by {m.split(':', 1)[1]} {_value(row)}" for m, row in exact]
    for prefix, label in (("query:random", "random query heads"), ("group:random", "random KV groups")):
        if (band := _band(units, prefix, n)) is not None:
            parts.append(f"{label} {band}")
    shape = "; the count a uniform shape removes" if exact else ""
    return (f"At {n} of {n_heads} heads removed ({n / n_heads:.0%}{shape}), ΔNLL in nats/token [95% interval over "
            f"windows]: " + "; ".join(parts) + f". Query heads {verdict(query, group)} KV groups by the same score, "
            f"removing {int(query.params_removed):,} parameters against {int(group.params_removed):,}.")


def unit_sentences(units: pd.DataFrame, n_heads: int) -> list[str]:
    """One sentence per compared count (:func:`compared_counts`)."""
    return [unit_sentence(units, n, n_heads) for n in compared_counts(units, n_heads)]


def random_sets(ids: list, k: int, seeds: int, seed: int) -> list[list]:
    """``seeds`` draws of ``k`` of ``ids`` without replacement, from one generator seeded by ``seed``."""
    rng = np.random.default_rng(seed)
    return [[ids[i] for i in rng.permutation(len(ids))[:k]] for _ in range(seeds)]
