"""Within-layer ρ (issue 53, item 4): heads compared with the heads of their own layer only, against scipy."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from headprune.report.head_bootstrap import within_layer
from headprune.report.predictiveness import predictiveness

from report_tables import make_scores


def per_layer_mean(x, y, layers):
    return float(np.mean([stats.spearmanr(x[layers == la], y[layers == la]).statistic for la in np.unique(layers)]))


def test_equal_layers_without_ties_give_the_mean_of_the_per_layer_rho():
    rng = np.random.default_rng(3)
    layers = np.repeat(np.arange(5), 7)
    x, y = rng.normal(size=35), rng.normal(size=35)
    rho, lo, hi = within_layer(x, y, layers)
    assert abs(rho - per_layer_mean(x, y, layers)) < 1e-12
    assert lo <= rho <= hi


def test_a_cross_layer_scale_difference_is_inverse_globally_but_not_within():
    """Each layer: y = within-layer signal; x = the same signal plus a layer offset that runs against y's layer
    level. Global ρ is strongly negative; within each layer x orders heads exactly as y: within-layer ρ = 1."""
    layers = np.repeat(np.arange(4), 6)
    signal = np.tile(np.arange(6, dtype=float), 4)
    y = signal + 100.0 * layers
    x = signal - 100.0 * layers
    assert stats.spearmanr(x, y).statistic < -0.8
    rho, lo, hi = within_layer(x, y, layers)
    assert rho == 1.0 and lo == hi == 1.0


def test_the_interval_is_a_bootstrap_of_heads_within_each_layer():
    """A loop of scipy's spearmanr over the same within-layer resamples (same seed and draw order)."""
    rng = np.random.default_rng(5)
    layers = np.repeat(np.arange(3), 8)
    x, y = rng.normal(size=24), rng.normal(size=24)
    _, lo, hi = within_layer(x, y, layers, replicates=50, seed=9)
    draw = np.random.default_rng(9)
    members = [np.flatnonzero(layers == la) for la in range(3)]
    reps = []
    for _ in range(50):
        idx = [draw.choice(m, size=len(m)) for m in members]
        a = np.concatenate([stats.rankdata(x[i]) - stats.rankdata(x[i]).mean() for i in idx])
        b = np.concatenate([stats.rankdata(y[i]) - stats.rankdata(y[i]).mean() for i in idx])
        reps.append(np.sum(a * b) / np.sqrt(np.sum(a * a) * np.sum(b * b)))
    assert np.allclose((lo, hi), np.nanpercentile(reps, [2.5, 97.5]), atol=1e-12)


def test_predictiveness_carries_the_within_layer_rho_of_each_score():
    scores = make_scores(layers=4, heads=6, seed=2)
    pred = predictiveness(scores).set_index("method")
    for m in ("wo_fro", "taylor"):
        want = per_layer_mean(scores[m].to_numpy(), scores["abl_zero"].to_numpy(), scores["layer"].to_numpy())
        got = pred.loc[m, "within_layer_rho"]
        assert abs(got - want) < 1e-12 and pred.loc[m, "within_layer_ci_lo"] <= got <= pred.loc[m, "within_layer_ci_hi"]
    assert isinstance(pred, pd.DataFrame)
