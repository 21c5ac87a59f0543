"""Rank intervals of named heads over resampled evaluation windows (issue 53, item 1), against a loop."""

from __future__ import annotations

import numpy as np

from headprune.report.head_bootstrap import rank_intervals


def test_rank_intervals_equal_a_loop_over_the_same_window_draws():
    rng = np.random.default_rng(0)
    W, H = 12, 9
    tokens = rng.integers(50, 128, W).astype(float)
    per_window = rng.normal(0.02, 0.05, (W, H)) * tokens[:, None] + np.linspace(0, 0.04, H) * tokens[:, None]
    rank, lo, hi = rank_intervals(per_window, tokens, replicates=40, seed=3)
    mean = per_window.sum(0) / tokens.sum()
    assert list(rank) == [1 + int((mean > m).sum()) for m in mean]  # 1 = largest
    draw = np.random.default_rng(3)
    counts = draw.multinomial(W, np.full(W, 1 / W), size=40)
    reps = []
    for c in counts:
        score = [sum(c[w] * per_window[w, h] for w in range(W)) / sum(c[w] * tokens[w] for w in range(W))
                 for h in range(H)]
        reps.append([1 + sum(s > x for s in score) for x in score])
    want_lo, want_hi = np.percentile(np.array(reps, float), [2.5, 97.5], axis=0)
    assert np.allclose(lo, want_lo) and np.allclose(hi, want_hi)
    assert np.all(lo <= rank) and np.all(rank <= hi)


def test_a_head_far_ahead_on_every_window_has_a_point_interval():
    tokens = np.full(6, 100.0)
    per_window = np.tile([10.0, 1.0, 0.5], (6, 1)) + np.random.default_rng(1).normal(0, 0.01, (6, 3))
    rank, lo, hi = rank_intervals(per_window, tokens, replicates=30)
    assert rank[0] == lo[0] == hi[0] == 1
