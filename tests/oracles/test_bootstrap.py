"""Bootstrap intervals: every replicate equals the score of the resampled corpus, computed from scratch."""

import numpy as np
import pandas as pd
import pytest
import torch

from headprune.bootstrap import interval, rank_interval, window_counts
from headprune.io.read.loading import load_model
from headprune.models.interventions import fill_tensors, mask_gates
from headprune.perplexity import Windowing, evaluate
from headprune.schema import DATA_METHODS, RANKED, ci_columns, rank_columns
from headprune.scoring import ScoringOptions, score_heads
from headprune.scoring.result import load_scores

from helpers import TINY

SEQ, WINDOWS, REPLICATES = 16, 5, 4


def test_window_counts_are_seeded_multinomial_draws():
    a, b = window_counts(7, 50, seed=3), window_counts(7, 50, seed=3)
    assert torch.equal(a, b) and not torch.equal(a, window_counts(7, 50, seed=4))
    assert (a.sum(1) == 7).all() and a.shape == (50, 7)


def test_window_counts_are_multinomial_draws_with_replacement():
    """Each replicate draws n windows with replacement, uniformly: its counts sum to n, a window's count is
    Binomial(n, 1/n) (zero with probability (1 − 1/n)^n ≈ 0.36, above 1 often; drawing without replacement
    would give every window exactly 1), and every window is drawn equally often over replicates. Chi-square
    tests against those distributions, with a fixed seed."""
    from scipy import stats

    n, b = 20, 4000
    counts = window_counts(n, b, seed=11).numpy()
    assert counts.shape == (b, n) and (counts >= 0).all() and (counts == np.round(counts)).all()
    assert (counts.sum(1) == n).all()
    assert (counts > 1).any(1).mean() > 0.99 and (counts == 0).mean() == pytest.approx((1 - 1 / n) ** n, abs=0.01)
    values = np.minimum(counts, 4).ravel().astype(int)  # pooled counts, 4 or more in one bin
    observed = np.bincount(values, minlength=5)
    pmf = stats.binom.pmf(np.arange(4), n, 1 / n)
    expected = np.append(pmf, 1 - pmf.sum()) * values.size
    p_counts = stats.chisquare(observed, expected).pvalue
    p_windows = stats.chisquare(counts.sum(0)).pvalue  # column totals: uniform over windows
    print(f"\nchi-square p: counts vs Binomial(n, 1/n) {p_counts:.3f}, windows uniform {p_windows:.3f}")
    assert p_counts > 1e-3 and p_windows > 1e-3
    assert counts.mean() == 1.0 and np.abs(counts.mean(0) - 1).max() < 0.1


def test_interval_is_the_percentile_interval():
    x = np.arange(201, dtype=float)  # percentiles 2.5 and 97.5 of 0..200 are 5 and 195
    lo, hi = interval(x)
    assert (float(lo), float(hi)) == pytest.approx((5.0, 195.0), abs=1e-12)
    lo, hi = interval(np.array([[1.0, np.nan], [3.0, np.nan]]))
    assert lo[0] == pytest.approx(1.05) and np.isnan(hi[1])


def test_every_interval_is_the_percentile_interval_of_rescored_resampled_corpora(tiny_dir, tmp_path):
    """Non-overlapping full windows: a replicate drawing window w c_w times is the corpus made of c_w copies of
    each window, so scoring that corpus from scratch must give the replicate's score for every data method
    (abl_mean with its fill held at the full-data mean, as its interval is defined)."""
    model = load_model(tiny_dir)
    ids = torch.randint(0, TINY["vocab_size"], (SEQ * WINDOWS,), generator=torch.Generator().manual_seed(5))
    windowing = Windowing(SEQ, SEQ, 2)
    # abl_opt: a fitted fill, held fixed as abl_mean's;
    # abl_resample: its source windows are drawn from the corpus itself;
    # ctx_retrieval: a resampled corpus of random tokens may hold no long-range copy event to score
    methods = [m for m in DATA_METHODS if m not in ("abl_opt", "abl_resample", "ctx_retrieval")]
    stream = {"stream_sink": 2, "stream_recent": 6}  # the context scores' streaming heads fit 16-token windows
    scored = score_heads(model, ids, methods, windowing=windowing,
                         options=ScoringOptions(bootstrap=REPLICATES, seed=9, **stream), show_progress=False)
    table = scored.table
    assert scored.means is not None and scored.replicates is not None and set(scored.replicates) == set(methods)
    fills = fill_tensors(model, scored.means)  # abl_mean's fill stays the full-data mean in every replicate
    counts = window_counts(WINDOWS, REPLICATES, seed=9)
    windows = ids.view(WINDOWS, SEQ)
    replicates, mean_ablated = [], []
    for row in counts.long():
        resampled = torch.cat([windows[w] for w in range(WINDOWS) for _ in range(int(row[w]))])
        replicates.append(score_heads(model, resampled, methods, windowing=windowing,
                                      options=ScoringOptions(bootstrap=0, **stream), show_progress=False).table)
        base = evaluate(model, resampled, Windowing(SEQ, SEQ), progress=False).nll
        mean_ablated.append([evaluate(model, resampled, Windowing(SEQ, SEQ), progress=False,
                                      gates=mask_gates(model, [head]), fills=fills).nll - base
                             for head in model.head_ids])
    for m in methods:
        values = mean_ablated if m == "abl_mean" else [r[m].to_numpy() for r in replicates]
        lo, hi = interval(np.stack(values))
        # the replicates the scores keep (for the report's joint intervals): row b is the b-th rescored corpus
        np.testing.assert_allclose(scored.replicates[m], np.stack(values), rtol=1e-5, atol=1e-7, err_msg=m)
        np.testing.assert_allclose(table[ci_columns(m)[0]], lo, rtol=1e-5, atol=1e-7, err_msg=m)
        np.testing.assert_allclose(table[ci_columns(m)[1]], hi, rtol=1e-5, atol=1e-7, err_msg=m)
        assert (table[ci_columns(m)[0]] <= table[ci_columns(m)[1]]).all()
        if m in RANKED:  # each head's rank within each rescored corpus (1 = costliest), its lowest and highest
            ranks = [pd.Series(v).rank(ascending=False, method="min").to_numpy() for v in values]
            assert table[list(rank_columns(m))].to_numpy().T.tolist() == [
                np.min(ranks, 0).tolist(), np.max(ranks, 0).tolist()], m  # 2.5% and 97.5% of 4 replicates, whole
    back = load_scores(scored.save(tmp_path / "scores.parquet")).replicates  # saved beside the table, read back
    assert back is not None and all(np.array_equal(back[m], scored.replicates[m]) for m in methods)
    assert set(RANKED) & set(methods) == {"abl_zero", "abl_zero_folded", "abl_mean"}
    assert (table["abl_zero_ci_hi"] - table["abl_zero_ci_lo"]).max() > 1e-4  # the intervals are not degenerate
    assert (table["abl_zero_rank_hi"] > table["abl_zero_rank_lo"]).any()  # and some ranks are uncertain


def test_rank_interval_equals_a_loop_over_the_same_draws():
    """Each head's rank in each replicate (1 = the largest, ties share the best), and the 2.5th percentile rounded
    down, the 97.5th up, to whole ranks."""
    rng = np.random.default_rng(0)
    W, H, B = 12, 9, 40
    tokens = rng.integers(50, 128, W).astype(float)
    per_window = rng.normal(0.02, 0.05, (W, H)) * tokens[:, None] + np.linspace(0, 0.04, H) * tokens[:, None]
    counts = window_counts(W, B, seed=3).numpy()
    values = (counts @ per_window) / (counts @ tokens)[:, None]
    lo, hi = rank_interval(values)
    reps = []
    for row in values:
        reps.append([1 + sum(s > x for s in row) for x in row])
    sorted_ranks = np.sort(np.array(reps), axis=0)  # per head, its B ranks ascending
    k_lo, k_hi = int(np.floor(0.025 * (B - 1))), int(np.ceil(0.975 * (B - 1)))  # numpy's "lower"/"higher" order stats
    assert lo.tolist() == sorted_ranks[k_lo].tolist() and hi.tolist() == sorted_ranks[k_hi].tolist()
    assert lo.dtype.kind == hi.dtype.kind == "i" and (lo <= hi).all() and (hi > lo).any()
    ahead = np.tile([10.0, 1.0, 0.5], (6, 1)) + rng.normal(0, 0.01, (6, 3))  # a head far ahead in every replicate
    assert rank_interval(ahead)[0][0] == rank_interval(ahead)[1][0] == 1


def test_head_bootstrap_matches_scipy_percentile_bootstrap():
    """Our paired percentile bootstrap over heads and scipy.stats.bootstrap (independent draws) agree to Monte-Carlo
    error with many replicates; perfect and reversed rankings give degenerate intervals and the inverse flag."""
    from scipy import stats

    from headprune.report.head_bootstrap import head_bootstrap

    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    y = 0.6 * x + 0.8 * rng.normal(size=60)
    positive = y >= np.sort(y)[-6]
    ours = head_bootstrap(x, y, positive, replicates=4000)
    ref = stats.bootstrap((x, y), lambda a, b: stats.spearmanr(a, b).statistic, paired=True, vectorized=False,
                          n_resamples=4000, method="percentile", random_state=1).confidence_interval
    assert ours["spearman_ci_lo"] == pytest.approx(ref.low, abs=0.02)
    assert ours["spearman_ci_hi"] == pytest.approx(ref.high, abs=0.02)
    same = head_bootstrap(y, y, positive, replicates=50)
    assert (same["spearman_ci_lo"], same["spearman_ci_hi"]) == pytest.approx((1.0, 1.0))
    assert same["roc_auc_ci_lo"] == pytest.approx(1.0)
    reversed_ = head_bootstrap(-y, y, positive, replicates=50)
    assert reversed_["roc_auc_ci_hi"] == pytest.approx(0.0) and reversed_["kendall_ci_hi"] == pytest.approx(-1.0)


def test_predictiveness_flags_an_inverse_ranking():
    import pandas as pd

    from headprune.report.predictiveness import predictiveness

    rng = np.random.default_rng(3)
    truth = rng.gamma(2.0, size=48)
    layer, head = np.repeat(np.arange(4), 12), np.tile(np.arange(12), 4)
    scores = pd.DataFrame({"layer": layer, "head": head, "head_id": [f"L{a}H{b}" for a, b in zip(layer, head)],
                           "model_fingerprint": "f", "abl_zero": truth, "wo_fro": -truth + 0.01 * rng.normal(size=48),
                           "grad": truth + 0.3 * rng.normal(size=48)})
    pred = predictiveness(scores).set_index("method")
    assert bool(pred.loc["wo_fro", "inverse"]) and not bool(pred.loc["grad", "inverse"])
    assert pred.loc["grad", "spearman_ci_lo"] < pred.loc["grad", "spearman_rho"] < pred.loc["grad", "spearman_ci_hi"]


@pytest.mark.parametrize("n", [5, 48, 260])  # 260 heads: beyond MAX_PAIRS, τ-b row by row
def test_rank_replicates_equal_scipy_row_by_row_with_ties(n):
    """Every replicate's ρ, τ-b and ROC-AUC equal scipy's spearmanr, kendalltau and the rank-sum AUC of that row,
    ties (rounded scores, resampled duplicates) and degenerate rows (one value: NaN) included."""
    from scipy import stats

    from headprune.report.head_bootstrap import rank_replicates
    from headprune.report.tables import rank_stats, roc_auc

    rng = np.random.default_rng(n)
    x, y = np.round(rng.normal(size=n), 1), rng.normal(size=n)
    draws = rng.integers(n, size=(6, n))
    X, Y, positive = x[draws], y[draws], (y >= np.quantile(y, 0.9))[draws]
    X[0] = 1.0  # one value: ρ and τ undefined
    got = rank_replicates(X, Y, positive)
    for b in range(len(X)):
        want = [*rank_stats(X[b], Y[b]), roc_auc(X[b], positive[b])]
        np.testing.assert_allclose(got[b], want, rtol=0, atol=1e-12, equal_nan=True)
    assert np.isnan(got[0, :2]).all()
    assert got[1, 1] == pytest.approx(stats.kendalltau(X[1], Y[1]).statistic, abs=1e-12)
