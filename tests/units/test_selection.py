"""Head selection from a scores table: global and per-layer amounts, rescaling, random, ties, errors, and
whether a table belongs to a model."""

import numpy as np
import pandas as pd
import pytest

from headprune.errors import HeadpruneError
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.read.loading import load_model
from headprune.models.heads import head_id
from headprune.pruning.options import Selection
from headprune.pruning.prune import prune_model
from headprune.pruning.selection import check_scores_match, rank_heads, select_heads


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(tiny_dir)


def _scores(values_by_layer, **extra):
    """A scores table: one row per (layer, head), column ``imp`` from ``values_by_layer`` (a list per layer)."""
    rows = [{"layer": l, "head": h, "head_id": head_id(l, h), "imp": v}
            for l, vs in enumerate(values_by_layer) for h, v in enumerate(vs)]
    return pd.DataFrame(rows).assign(**extra)


def test_global_and_per_layer_selection():
    s = _scores([[5, 1, 7, 3], [0.5, 9, 8, 2], [4, 6, 10, 11]])
    assert rank_heads(s, "imp")[:4] == [(1, 0), (0, 1), (1, 3), (0, 3)]
    assert select_heads(s, "imp", count=3) == [(1, 0), (0, 1), (1, 3)]
    assert select_heads(s, "imp", fraction=0.25) == [(1, 0), (0, 1), (1, 3)]  # round(0.25 * 12) = 3
    assert (select_heads(s, "imp", fraction=0.5, selection=Selection(per_layer=True))
            == [(1, 0), (0, 1), (1, 3), (0, 3), (2, 0), (2, 1)])
    assert sorted(select_heads(s, "imp", count=1, selection=Selection(per_layer=True))) == [(0, 1), (1, 0), (2, 0)]
    assert select_heads(s, "imp", fraction=0.0) == [] and len(select_heads(s, "imp", fraction=1.0)) == 12


def test_per_layer_rounding_with_unequal_layers():
    # a pruned model's table: layers hold 4, 2 and 3 heads; fraction 0.5 -> round(2), round(1), round(1.5) = 2, 1, 2
    s = _scores([[4, 3, 2, 1], [1, 2], [3, 2, 1]])
    chosen = select_heads(s, "imp", fraction=0.5, selection=Selection(per_layer=True))
    assert sorted(chosen) == [(0, 2), (0, 3), (1, 0), (2, 1), (2, 2)]


def test_normalize_by_layer_l2_norm():
    s = _scores([[10, 40, 40, 40], [1, 2, 3, 4]])
    assert select_heads(s, "imp", count=2) == [(1, 0), (1, 1)]
    # by hand: 10/√4900 = 0.143, 1/√30 = 0.183, 2/√30 = 0.365, 40/√4900 = 0.571
    assert select_heads(s, "imp", count=2, selection=Selection(normalize="layer")) == [(0, 0), (1, 0)]
    assert rank_heads(s, "imp", selection=Selection(normalize="layer"))[2] == (1, 1)


def test_standardize_per_layer_z_scores():
    s = _scores([[0, 10, 10, 10], [1, 2, 3, 100]])
    # by hand: layer 0 z = (x - 7.5)/4.33 -> -1.73, 0.58 x3; layer 1 mean 26.5, std 42.4 -> -0.60, -0.58, -0.55, 1.73
    assert rank_heads(s, "imp", selection=Selection(standardize=True))[:4] == [(0, 0), (1, 0), (1, 1), (1, 2)]
    expect = s.groupby("layer").imp.transform(lambda v: (v - v.mean()) / v.std(ddof=0))
    order = sorted(zip(expect, s.layer, s["head"]))
    assert rank_heads(s, "imp", selection=Selection(standardize=True)) == [(l, h) for _, l, h in order]


def test_random_is_reproducible_and_needs_no_column():
    s = _scores([[1] * 12] * 12).drop(columns="imp")
    a, b = (select_heads(s, "random", count=20, selection=Selection(seed=1)),
            select_heads(s, "random", count=20, selection=Selection(seed=1)))
    assert a == b and len(set(a)) == 20
    assert select_heads(s, "random", count=20, selection=Selection(seed=2)) != a
    # row order irrelevant
    assert select_heads(s.sample(frac=1, random_state=0), "random", count=20, selection=Selection(seed=1)) == a


def test_ties_are_broken_by_layer_then_head():
    s = _scores([[1, 1, 1], [1, 1, 1]])
    shuffled = s.iloc[[4, 0, 5, 2, 1, 3]]
    assert rank_heads(shuffled, "imp") == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert (select_heads(shuffled, "imp", fraction=0.5, selection=Selection(per_layer=True))
            == [(0, 0), (0, 1), (1, 0), (1, 1)])


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"method": "entropy", "count": 1}, "does not rank importance"),
        ({"method": "nope", "count": 1}, "no column 'nope'"),
        ({"method": "imp", "fraction": -0.1}, r"in \[0, 1\]"),
        ({"method": "imp", "fraction": 1.5}, r"in \[0, 1\]"),
        ({"method": "imp", "fraction": float("nan")}, r"in \[0, 1\]"),
        ({"method": "imp", "count": 13}, "only 12"),
        ({"method": "imp", "count": -1}, ">= 0"),
        ({"method": "imp", "count": 5, "per_layer": True}, "layer 0 has only 4"),
        ({"method": "imp"}, "exactly one"),
        ({"method": "imp", "count": 1, "fraction": 0.5}, "exactly one"),
        ({"method": "imp", "count": 1, "normalize": "global"}, "unknown normalize"),
        ({"method": "imp", "count": 1, "normalize": "layer", "standardize": True}, "choose one"),
        ({"method": "bad", "count": 1}, "NaN"),
    ],
)
def test_selection_errors(kwargs, words):
    s = _scores([[1, 2, 3, 4]] * 3, entropy=1.0, bad=[1.0] * 11 + [np.nan])
    rules = {k: kwargs.pop(k) for k in ("per_layer", "normalize", "standardize") if k in kwargs}
    with pytest.raises(HeadpruneError, match=words):
        select_heads(s, **kwargs, selection=Selection(**rules))


def test_scores_must_match_the_model(tiny):
    bare = _scores([[1, 2, 3, 4]] * 3)
    with pytest.raises(HeadpruneError, match="no model_fingerprint column"):  # issue 26: a deleted column is refused
        check_scores_match(bare, tiny)
    s = bare.assign(model_fingerprint=model_fingerprint(tiny))
    check_scores_match(s, tiny)
    with pytest.raises(HeadpruneError, match="scores file x.csv is from another model.*fingerprint"):
        check_scores_match(s.assign(model_fingerprint="0123456789abcdef"), tiny, "x.csv")
    with pytest.raises(HeadpruneError, match="from another model.*lacks 1"):
        check_scores_match(s.iloc[1:], tiny)
    with pytest.raises(HeadpruneError, match="from another model.*L0H1"):
        check_scores_match(s, prune_model(tiny, [(0, 1)]))
    with pytest.raises(HeadpruneError, match="more than once"):
        check_scores_match(pd.concat([s, s.iloc[:1]]), tiny)
