"""The findings' secondary facts, recomputed here from the scores table: the layer that matters next (and its
total), with ties and a layer of negative total, independently of headprune.report."""

import pandas as pd
import pytest

from headprune.report.findings import findings, layer_sentence


def _scores(per_layer: dict[int, list[float]]) -> pd.DataFrame:
    rows = [(l, h, v) for l, vs in per_layer.items() for h, v in enumerate(vs)]
    return pd.DataFrame({"layer": [r[0] for r in rows], "head": [r[1] for r in rows],
                         "head_id": [f"L{l}H{h}" for l, h, _ in rows], "abl_zero": [r[2] for r in rows]})


def _hand(per_layer):
    totals = {l: sum(vs) for l, vs in per_layer.items()}
    order = sorted(totals, key=lambda l: (-totals[l], l))  # largest first, ties: the smaller layer
    return order, totals


@pytest.mark.parametrize("per_layer", [
    {0: [0.1, 0.2], 1: [0.5, 0.4], 2: [0.3, 0.25], 3: [0.05, 0.0]},  # next is layer 2, not 0 (not by index)
    {0: [0.2, 0.2], 1: [0.1, 0.0], 2: [0.3, 0.1], 3: [0.9, 0.0]},   # layers 0 and 2 tie at 0.4: 0 comes next
    {0: [0.7, 0.1], 1: [-0.2, 0.0], 2: [0.3, 0.2]},                 # a negative total: no share of the total
])
def test_next_layer_and_its_total_are_the_second_largest_sum(per_layer):
    order, totals = _hand(per_layer)
    sentence = layer_sentence(_scores(per_layer))
    top, second = order[0], order[1]
    assert sentence.startswith(f"Layer {top} matters most")
    assert f"sum to {totals[top]:.3f} nats/token" in sentence
    assert sentence.endswith(f"; next is layer {second} ({totals[second]:.3f}).")
    assert "(a sum of single ablations: the layer's heads were not removed together)" in sentence
    positive = all(t >= 0 for t in totals.values())
    assert ("of all heads' total" in sentence) == positive
    if positive:
        assert f", {totals[top] / sum(totals.values()):.0%} of all heads' total" in sentence


def test_one_layer_has_no_next():
    sentence = findings(_scores({0: [0.1, 0.3]}), pd.DataFrame(columns=["method", "compensation"]), pd.DataFrame())
    assert sentence == [("Layer 0 matters most: its heads' abl_zero (NLL increase when one head is zero-ablated) sum "
                         "to 0.400 nats/token (a sum of single ablations: the layer's heads were not removed "
                         "together), 100% of all heads' total.")]
