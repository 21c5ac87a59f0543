"""Property tests (hypothesis) for head selection over arbitrary score tables."""

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from headprune.pruning.options import Selection
from headprune.pruning.selection import rank_heads, select_heads


@st.composite
def tables(draw):
    n_layers = draw(st.integers(1, 5))
    n_heads = draw(st.integers(1, 6))
    values = draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=n_layers * n_heads,
                           max_size=n_layers * n_heads))
    layers, heads = np.divmod(np.arange(n_layers * n_heads), n_heads)
    return pd.DataFrame({"layer": layers, "head": heads, "head_id": [f"L{l}H{h}" for l, h in zip(layers, heads)],
                         "score": values})


@settings(max_examples=150, deadline=None)
@given(tables(), st.floats(0, 1))
def test_global_selection_takes_the_lowest(table, fraction):
    chosen = select_heads(table, "score", fraction=fraction)
    assert len(chosen) == round(fraction * len(table)) == len(set(chosen))
    score = {(r.layer, r.head): r.score for r in table.itertuples()}
    rest = set(score) - set(chosen)
    if chosen and rest:
        assert max(score[h] for h in chosen) <= min(score[h] for h in rest)


@settings(max_examples=150, deadline=None)
@given(tables(), st.floats(0, 1), st.sampled_from([(None, False), ("layer", False), (None, True)]))
def test_per_layer_selection_counts_and_order(table, fraction, rescale):
    normalize, standardize = rescale
    chosen = select_heads(table, "score", fraction=fraction,
                          selection=Selection(per_layer=True, normalize=normalize, standardize=standardize))
    for layer, group in table.groupby("layer"):
        mine = [h for l, h in chosen if l == layer]
        assert len(mine) == round(fraction * len(group))
        # rescaling within a layer never changes the order inside that layer
        order = group.sort_values(["score", "head"])["head"].tolist()
        assert sorted(mine, key=order.index) == order[: len(mine)]


@settings(max_examples=60, deadline=None)
@given(tables(), st.integers(0, 2**31 - 1))
def test_random_is_a_seeded_permutation(table, seed):
    a, b = (rank_heads(table, "random", selection=Selection(seed=seed)),
            rank_heads(table, "random", selection=Selection(seed=seed)))
    assert a == b and sorted(a) == sorted(zip(table.layer, table["head"]))
