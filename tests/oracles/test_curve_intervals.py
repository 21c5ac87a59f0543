"""Curve points: paired-bootstrap ΔNLL intervals against rescored resampled corpora; evaluation from the cached
residual stream against full forwards; layer-normalized rankings against selection."""

import numpy as np
import pytest
import torch

import headprune.pruning.curves as curves_module
from headprune.bootstrap import interval, window_counts
from headprune.io.read.loading import load_model
from headprune.perplexity import Windowing, evaluate
from headprune.pruning.curves import pruning_curves
from headprune.pruning.options import Compensation, CurveOptions, Selection
from headprune.pruning.prune import prune_model
from headprune.pruning.selection import select_heads
from headprune.scoring import score_heads

from helpers import TINY

SEQ, WINDOWS, REPLICATES, SEEDS = 16, 5, 8, 3
FRACTIONS = [0.0, 0.25, 0.5]


@pytest.fixture(scope="module")
def setup(tiny_dir):
    model = load_model(tiny_dir)
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, TINY["vocab_size"], (SEQ * WINDOWS,), generator=gen)
    score_ids = torch.randint(0, TINY["vocab_size"], (SEQ * WINDOWS,), generator=gen)
    windowing = Windowing(SEQ, SEQ, 2)
    scored = score_heads(model, score_ids, ["wo_fro", "fluct", "abl_zero"], windowing=windowing, show_progress=False)
    variants = [("abl_zero", "none"), ("wo_fro@layer", "none"), ("random", "none"), ("abl_zero", "mean")]
    curves = pruning_curves(model, ids, scored.table, variants,
                            options=CurveOptions(tuple(FRACTIONS), SEEDS, REPLICATES, Selection(seed=4), windowing),
                            compensation=Compensation(means=scored.means), show_progress=False)
    return model, ids, windowing, scored, variants, curves


def resampled_delta(model, pruned, ids, counts_row):
    windows = ids.view(WINDOWS, SEQ)
    resampled = torch.cat([windows[w] for w in range(WINDOWS) for _ in range(int(counts_row[w]))])
    nll = lambda m: evaluate(m, resampled, Windowing(SEQ, SEQ), progress=False).nll
    return nll(pruned) - nll(model)


def test_intervals_are_percentiles_of_rescored_resampled_corpora(setup):
    model, ids, _, scored, _, curves = setup
    counts = window_counts(WINDOWS, REPLICATES, seed=4).long()
    pick = np.random.default_rng(5).integers(SEEDS, size=REPLICATES)  # random: each replicate draws a seed too
    for (method, comp), fraction in [(("abl_zero", "none"), 0.5), (("abl_zero", "mean"), 0.25),
                                     (("random", "none"), 0.5)]:
        row = curves[(curves.method == method) & (curves.compensation == comp) & (curves.fraction == fraction)].iloc[0]
        deltas = []
        for b in range(REPLICATES):
            seed = 4 + int(pick[b]) if method == "random" else 4
            heads = select_heads(scored.table, method, fraction=fraction, selection=Selection(seed=seed))
            fills = {h: scored.means[h] for h in heads} if comp == "mean" else None
            deltas.append(resampled_delta(model, prune_model(model, heads, fills), ids, counts[b]))
        lo, hi = interval(np.array(deltas))
        assert (row.delta_nll_ci_lo, row.delta_nll_ci_hi) == pytest.approx((float(lo), float(hi)), abs=2e-6)
        assert row.delta_nll_ci_lo < row.delta_nll_ci_hi


def test_fraction_zero_has_a_zero_interval_and_every_point_has_one(setup):
    curves = setup[-1]
    zero = curves[curves.fraction == 0]
    assert (zero.delta_nll_ci_lo == 0).all() and (zero.delta_nll_ci_hi == 0).all()
    assert curves[["delta_nll_ci_lo", "delta_nll_ci_hi"]].notna().all().all()


def test_cached_residual_start_equals_full_forwards(setup, monkeypatch):
    model, ids, windowing, scored, variants, curves = setup
    monkeypatch.setattr(curves_module, "CACHE_BYTES", 0)  # no cache: every point runs the whole model
    full = pruning_curves(model, ids, scored.table, variants,
                            options=CurveOptions(tuple(FRACTIONS), SEEDS, REPLICATES, Selection(seed=4), windowing),
                            compensation=Compensation(means=scored.means), show_progress=False)
    np.testing.assert_array_equal(full[["nll", "delta_nll_ci_lo", "delta_nll_ci_hi"]].to_numpy(),
                                  curves[["nll", "delta_nll_ci_lo", "delta_nll_ci_hi"]].to_numpy())  # bit for bit
    # and both equal the plain sliding-window perplexity of the physically pruned model
    heads = select_heads(scored.table, "abl_zero", fraction=0.5)
    expected = evaluate(prune_model(model, heads), ids, Windowing(SEQ, SEQ), progress=False).nll
    row = curves[(curves.method == "abl_zero") & (curves.compensation == "none") & (curves.fraction == 0.5)]
    assert float(row.nll.iloc[0]) == pytest.approx(expected, abs=1e-6)


def test_layer_normalized_ranking_prunes_what_selection_normalized_by_layer_picks(setup):
    model, ids, _, scored, _, curves = setup
    heads = select_heads(scored.table, "wo_fro", fraction=0.5, selection=Selection(normalize="layer"))
    assert heads != select_heads(scored.table, "wo_fro", fraction=0.5)  # the variant is a different ranking here
    row = curves[(curves.method == "wo_fro@layer") & (curves.fraction == 0.5)].iloc[0]
    pruned_nll = evaluate(prune_model(model, heads), ids, Windowing(SEQ, SEQ), progress=False).nll
    assert row.nll == pytest.approx(pruned_nll, abs=1e-6)


def test_half_deltas_are_the_curves_of_the_even_and_the_odd_windows_alone(setup):
    """delta_nll_even / _odd: the ΔNLL of the same pruned models, rescored on the even (odd) windows' tokens only;
    random: the mean over its seeds."""
    model, ids, _, scored, _, curves = setup
    windows = ids.view(WINDOWS, SEQ)
    halves = {"delta_nll_even": windows[0::2].reshape(-1), "delta_nll_odd": windows[1::2].reshape(-1)}
    for (method, comp), fraction in [(("abl_zero", "none"), 0.5), (("abl_zero", "mean"), 0.25),
                                     (("random", "none"), 0.5), (("wo_fro@layer", "none"), 0.0)]:
        row = curves[(curves.method == method) & (curves.compensation == comp) & (curves.fraction == fraction)].iloc[0]
        for column, half in halves.items():
            nll = lambda m, half=half: evaluate(m, half, Windowing(SEQ, SEQ), progress=False).nll
            deltas = []
            for seed in (range(4, 4 + SEEDS) if method == "random" else [4]):
                name, _, by = method.partition("@")
                heads = select_heads(scored.table, name, fraction=fraction,
                                     selection=Selection(seed=seed, normalize=by or None))
                fills = {h: scored.means[h] for h in heads} if comp == "mean" else None
                deltas.append(nll(prune_model(model, heads, fills)) - nll(model))
            assert row[column] == pytest.approx(float(np.mean(deltas)), abs=2e-6), (method, comp, fraction, column)
    # the halves weigh into the whole by their tokens (3 windows against 2 here)
    row = curves[(curves.method == "abl_zero") & (curves.compensation == "none") & (curves.fraction == 0.5)].iloc[0]
    assert row.delta_nll == pytest.approx((3 * row.delta_nll_even + 2 * row.delta_nll_odd) / 5, abs=1e-9)
