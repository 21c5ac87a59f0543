"""``--standardize`` on layers of unequal size (a pruned model): z-scores with the population standard deviation
(docs/methods.md, Pruning), computed here by hand; the sample deviation would choose other heads."""

import math

import pandas as pd

from headprune.pruning.options import Selection
from headprune.pruning.selection import rank_heads, select_heads

# a pruned model's scores: layer 0 kept 4 heads, layer 1 kept heads 0 and 3, layer 2 kept 1, 2 and 3
KEPT = {0: {0: 0.0, 1: 0.01, 2: 0.5, 3: 1.0}, 1: {0: 0.0, 3: 1.0}, 2: {1: 5.0, 2: 5.01, 3: 6.0}}


def _table() -> pd.DataFrame:
    rows = [(l, h, v) for l, heads in KEPT.items() for h, v in heads.items()]
    return pd.DataFrame({"layer": [r[0] for r in rows], "head": [r[1] for r in rows],
                         "head_id": [f"L{l}H{h}" for l, h, _ in rows], "imp": [r[2] for r in rows]})


def _z(ddof: int) -> dict[tuple[int, int], float]:
    out = {}
    for layer, heads in KEPT.items():
        n = len(heads)
        mean = sum(heads.values()) / n
        sd = math.sqrt(sum((v - mean) ** 2 for v in heads.values()) / (n - ddof))
        out |= {(layer, h): (v - mean) / sd for h, v in heads.items()}
    return out


def _order(z: dict) -> list[tuple[int, int]]:
    return sorted(z, key=lambda h: (z[h], KEPT[h[0]][h[1]], h))


def test_standardize_uses_the_population_std_on_unequal_layers():
    population, sample = _order(_z(0)), _order(_z(1))
    # by hand: layer 0's lowest z is -0.91 (population) or -0.79 (sample); layer 1's is -1 or -0.71
    assert population[0] == (1, 0) and sample[0] == (0, 0)  # the two definitions disagree here
    assert population != sample
    assert rank_heads(_table(), "imp", Selection(standardize=True)) == population
    assert select_heads(_table(), "imp", count=1, selection=Selection(standardize=True)) == [(1, 0)]
    assert select_heads(_table(), "imp", count=3, selection=Selection(standardize=True)) == population[:3]
