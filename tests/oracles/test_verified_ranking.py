"""The verified ablation ranking (headprune.scoring.verified): ablating a head set together against Hugging Face's
GPT-2 with those heads' c_proj input slices zeroed, the verified heads' exact values against the exact sweep, the
control-variate estimates and the certified recall against hand calculations, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import t as student_t
from transformers import GPT2LMHeadModel

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.patching.missed import subsample_estimates
from headprune.perplexity import Windowing
from headprune.scoring import ScoringOptions, score_heads
from headprune.scoring.ablation import cache_batch
from headprune.scoring.set_sweep import ablated_sums
from headprune.scoring.verified import Verification, verify_ranking
from headprune.scoring.verified_stats import certified_recall, corrected_estimates, draw_subsets, recall_at_k

from helpers import TINY, hf_zeroed_sums, random_tokens

WINDOWS = Windowing.resolve(TINY["n_positions"], seq_len=16, batch_size=2)


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


@pytest.fixture(scope="module")
def ids():
    return random_tokens(B=1, T=64, seed=5).view(-1)


@pytest.fixture(scope="module")
def scored(model, ids):
    return score_heads(model, ids, "taylor,abl_zero,abl_mean", windowing=WINDOWS, options=ScoringOptions(bootstrap=0),
                       show_progress=False)


def test_head_sets_ablated_together_equal_transformers(model, ids, tiny_dir):
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    batch = WINDOWS.batches(ids)[0]
    sets = [[(0, 1)], [(1, 0), (2, 3)], [(0, 2), (1, 1), (1, 3), (2, 0)], [(2, 2)]]  # lowest layer first
    resid_pre, _ = cache_batch(model, batch)
    got = ablated_sums(model, batch, resid_pre, sets, rows=4)  # two sets per forward, zero ablation
    for heads, sums in zip(sets, got, strict=True):
        np.testing.assert_allclose(sums, hf_zeroed_sums(hf, batch.tokens, batch.mask, heads), rtol=2e-6, atol=0)


@pytest.mark.parametrize("method", ["abl_zero", "abl_mean"])
def test_verified_heads_carry_the_exact_sweeps_values(model, ids, scored, method):
    result = verify_ranking(model, ids, scored.table["taylor"], method,
                            verification=Verification(3, 16, 0.25, rounds=1), windowing=WINDOWS,
                            show_progress=False)
    table = result.table
    top3 = np.argsort(-scored.table["taylor"].abs().to_numpy(), kind="stable")[:3]
    assert sorted(np.flatnonzero(table["verified"])) == sorted(top3) == sorted(np.flatnonzero(table["top"]))
    np.testing.assert_allclose(table.loc[top3, "exact"], scored.table.loc[top3, method], rtol=0, atol=1e-9)
    assert result.baseline_nll == pytest.approx(scored.baseline["nll"], abs=1e-12)
    assert table["upper"].isna().sum() == 3 and result.bound == pytest.approx(table["upper"].max())
    assert result.threshold == pytest.approx(scored.table.loc[top3, method].abs().min(), abs=1e-9)


def test_a_second_round_verifies_the_heads_the_bound_leaves_most_open(model, ids, scored):
    """Round 2 ablates the 3 heads with the largest upper bounds after round 1 (the same subsets, so the same
    bounds); the claimed top 3 are the 3 largest |exact| of the 6 verified; the bound, threshold and certified recall
    follow from the heads left."""
    taylor = scored.table["taylor"]
    one = verify_ranking(model, ids, taylor, verification=Verification(3, 16, 0.25, rounds=1), windowing=WINDOWS,
                         show_progress=False).table
    result = verify_ranking(model, ids, taylor, verification=Verification(3, 16, 0.25), windowing=WINDOWS,
                            show_progress=False)
    table = result.table
    first = np.flatnonzero(one["verified"])
    second = one["upper"].nlargest(3).index.to_numpy()
    assert sorted(np.flatnonzero(table["round"] == 1)) == sorted(first)
    assert sorted(np.flatnonzero(table["round"] == 2)) == sorted(second)
    np.testing.assert_allclose(table["upper"], one["upper"], rtol=0, atol=0)  # bounds from the same subsets
    verified = np.concatenate([first, second])
    np.testing.assert_allclose(table.loc[verified, "exact"], scored.table.loc[verified, "abl_zero"], rtol=0, atol=1e-9)
    exact = scored.table.loc[verified, "abl_zero"].abs()
    assert sorted(np.flatnonzero(table["top"])) == sorted(exact.nlargest(3).index)
    assert result.threshold == pytest.approx(exact.nlargest(3).min(), abs=1e-9)
    left = one["upper"].drop(index=verified)
    assert result.bound == pytest.approx(left.max(), abs=0)
    assert result.recall_lower == max(0, 3 - int((left >= result.threshold).sum())) / 3
    assert result.unresolved == int((left >= result.threshold).sum())


def test_subset_changes_feed_the_estimates(model, ids, scored):
    """The unverified heads' estimates are corrected_estimates of the subsets' corpus NLL changes, each measured here
    one set per forward in the drawn order (the ranking batches them, lowest layer first, in resumable chunks)."""
    v = Verification(2, 12, 0.3, seed=4)
    result = verify_ranking(model, ids, scored.table["taylor"], verification=v, windowing=WINDOWS, show_progress=False)
    rest = np.flatnonzero(result.table["round"].to_numpy() != 1)  # the subsets hold every head round 1 left
    masks = draw_subsets(len(rest), 12, 0.3, 4)
    heads = model.head_ids
    sets = [[heads[rest[j]] for j in np.flatnonzero(row)] for row in masks]
    total, base, n = np.zeros(len(sets)), 0.0, 0
    for batch in WINDOWS.batches(ids):
        resid_pre, base_sums = cache_batch(model, batch)
        for i, heads_i in enumerate(sets):  # one set per forward, in the drawn order
            total[i] += sum(ablated_sums(model, batch, resid_pre, [heads_i], rows=1)[0])
        base += sum(base_sums)
        n += int(batch.mask.sum())
    changes = (total - base) / n
    est, se, upper = corrected_estimates(masks, changes, scored.table["taylor"].to_numpy()[rest])
    np.testing.assert_allclose(result.table.loc[rest, "sub_estimate"], est, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.table.loc[rest, "se"], se, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.table.loc[rest, "upper"], upper, rtol=0, atol=1e-9)


def test_corrected_estimates_by_hand():
    rng = np.random.default_rng(0)
    masks = draw_subsets(6, 20, 0.3, seed=1)
    truth = rng.normal(size=6)
    additive = masks.astype(float) @ truth
    # an exact estimate leaves residuals of zero: the estimate itself, with no spread
    est, se, upper = corrected_estimates(masks, additive, truth)
    np.testing.assert_allclose(est, truth, atol=1e-12)
    np.testing.assert_allclose(se, 0, atol=1e-12)
    # no estimate: the plain subsampling estimates (with Welch's t)
    plain = subsample_estimates(masks, additive, welch=True)
    for got, want in zip(corrected_estimates(masks, additive, np.zeros(6)), plain, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12)
    # head 0 by hand: mean of d_r over the subsets holding it minus over the others, and the Bonferroni z
    e = rng.normal(size=6)
    changes = additive + rng.normal(scale=0.1, size=20)
    est, se, upper = corrected_estimates(masks, changes, e, level=0.9)
    d = changes - masks.astype(float) @ e
    inside, outside = d[masks[:, 0]], d[~masks[:, 0]]
    assert est[0] == pytest.approx(e[0] + inside.mean() - outside.mean(), abs=1e-12)
    se0 = np.sqrt(inside.var(ddof=1) / len(inside) + outside.var(ddof=1) / len(outside))
    assert se[0] == pytest.approx(se0, abs=1e-12)
    a, b = inside.var(ddof=1) / len(inside), outside.var(ddof=1) / len(outside)
    dof = (a + b) ** 2 / (a**2 / (len(inside) - 1) + b**2 / (len(outside) - 1))
    assert upper[0] == pytest.approx(abs(est[0]) + student_t.ppf(1 - 0.1 / 12, dof) * se0, abs=1e-12)


def test_bound_covers_additive_effects_at_its_level():
    """Seeded simulation with the default subsets: additive heavy-tailed effects plus noise, an estimate with its
    own error; the bound covers every head's true |effect| in at least 95% of the draws."""
    rng = np.random.default_rng(3)
    truth = rng.standard_t(2, size=40) * 0.01
    v = Verification()
    covered = 0
    for trial in range(200):
        masks = draw_subsets(40, v.subsets, v.inclusion, seed=trial)
        changes = masks.astype(float) @ truth + rng.normal(scale=0.002, size=v.subsets)
        _, _, upper = corrected_estimates(masks, changes, truth + rng.normal(scale=0.005, size=40), v.level)
        covered += bool((upper >= np.abs(truth)).all())
    assert covered >= 190


def test_certified_recall_and_recall_by_hand():
    # verified |exact| 0.5, 0.2, -0.3: threshold 0.2; two unverified heads could still reach it
    assert certified_recall(np.array([0.5, 0.2, -0.3]), np.array([0.25, 0.2, 0.19, 0.01])) == pytest.approx(1 / 3)
    assert certified_recall(np.array([0.5, 0.2]), np.array([0.1, 0.19])) == 1.0
    assert certified_recall(np.array([0.5]), np.array([0.6, 0.7])) == 0.0
    # four verified, top 2 claimed (0.5 and -0.3): threshold 0.3, one unverified head (0.35) could reach it
    assert certified_recall(np.array([0.5, 0.01, -0.3, 0.2]), np.array([0.35, 0.29, 0.1]), k=2) == 0.5
    # true top 2 by |value|: heads 3 (-0.9) and 0 (0.5); the verified set {0, 1} holds one of them
    assert recall_at_k([0.5, 0.4, 0.1, -0.9], [True, True, False, False]) == 0.5


def test_draw_subsets_puts_each_head_in_the_same_number():
    masks = draw_subsets(200, 16, 0.1, seed=0)  # round(1.6) = 2 subsets per head
    assert (masks.sum(0) == 2).all() and masks.sum(1).std() > 0  # the subsets' sizes vary
    np.testing.assert_array_equal(masks, draw_subsets(200, 16, 0.1, seed=0))
    assert (draw_subsets(50, 32, 0.25, seed=1).sum(0) == 8).all()
    assert (draw_subsets(50, 8, 0.99, seed=1).sum(0) == 6).all()  # at most R - 2: out of two
    with pytest.raises(HeadpruneError, match="3 subsets"):
        draw_subsets(10, 3, 0.5, seed=0)


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "abl_opt"}, "cannot verify 'abl_opt'"),
    ({"estimate": [0.1] * 5}, "5 values for 12 heads"),
    ({"estimate": [float("nan")] * 12}, "NaN"),
    ({"verification": Verification(verified=11)}, "verified 11 of 12 heads"),
    ({"verification": Verification(subsets=4)}, "subsets 4"),
    ({"verification": Verification(inclusion=1.0)}, "inclusion 1.0"),
    ({"verification": Verification(rounds=0)}, "rounds 0"),
    ({"verification": Verification(verified=4, rounds=3)}, "3 rounds of 4 verified heads"),
])
def test_refusals_name_the_bad_value(model, ids, kwargs, match):
    args = {"estimate": [0.1] * 12} | kwargs
    with pytest.raises(HeadpruneError, match=match):
        verify_ranking(model, ids, windowing=WINDOWS, show_progress=False, **args)
