"""Perplexity and taylor at several window lengths over the same tokens (headprune.scoring.window_length and the
stage's statistics): each length's NLL against a hand loop over its windows, taylor against a finite difference of
the NLL in a head's gate, the spans' sums, the paired intervals, and the section's sentences against its tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from headprune.io.work.progress import NoProgress
from headprune.report.window_length_section import (
    RANKS_FILE,
    WINDOWS_FILE,
    length_sentence,
    long_section,
    moves,
    rank_sentence,
)
from headprune.scoring.window_length import SpanSums, span_pass, window_lengths
from headprune.stages.window_length import length_table, rank_table, span_counts

LENGTHS = [4, 16]


@pytest.fixture(scope="module")
def tiny(tiny_dir, corpus):
    from headprune.data.sources import load_texts
    from headprune.data.tokens import tokenize_corpus
    from headprune.io.read.loading import load_model
    from headprune.io.read.tokenizer import model_tokenizer

    model = load_model(tiny_dir)
    ids = tokenize_corpus(load_texts(str(corpus)), model_tokenizer(model))[:64]  # 4 spans of 16
    return model, ids


def hand_nll(model, ids, seq_len: int, gates=None) -> tuple[np.ndarray, np.ndarray]:
    """Per span of 16: the NLL sum and count over the targets not at a multiple of 4, window by window."""
    from headprune.models.nll import model_nll

    sums, counts = np.zeros(len(ids) // 16), np.zeros(len(ids) // 16)
    for begin in range(0, len(ids), seq_len):
        window = ids[begin:begin + seq_len].unsqueeze(0)
        with torch.no_grad():
            nll = model_nll(model, window, gates=gates)[0].double()  # targets begin+1 .. begin+seq_len-1
        for j, value in enumerate(nll.tolist(), start=1):
            if (begin + j) % 4:
                sums[(begin + j) // 16] += value
                counts[(begin + j) // 16] += 1
    return sums, counts


def test_lengths_grow_by_four_within_the_context():
    assert window_lengths(128, 8191, 2048) == [128, 512, 2048]
    assert window_lengths(128, 1023, 2048) == [128, 512]
    assert window_lengths(128, 511, 2048) == [128]
    assert window_lengths(100, 32767, 2048) == [100, 400, 1600]


@pytest.mark.parametrize("seq_len", LENGTHS)
def test_each_length_scores_the_common_targets_of_each_span(tiny, seq_len):
    model, ids = tiny
    p = span_pass(model, ids, seq_len, LENGTHS, batch_size=3, bos=None, progress=NoProgress(), show_progress=False)
    sums, counts = hand_nll(model, ids, seq_len)
    assert p.n.tolist() == counts.tolist() == [12, 12, 12, 12]  # 16 targets less the 4 at multiples of 4
    np.testing.assert_allclose(p.nll, sums, rtol=1e-5)


def test_taylor_is_the_first_order_change_from_zeroing_a_gate(tiny):
    model, ids = tiny
    p = span_pass(model, ids, 16, LENGTHS, batch_size=2, bos=None, progress=NoProgress(), show_progress=False)
    taylor = p.taylor.sum(0) / p.n.sum()
    n_heads = model.h[0].attn.n_heads
    for layer, head in ((0, 1), (2, 3)):
        eps = 1e-2
        gates = [torch.ones(1, n_heads) for _ in model.h]
        gates[layer][0, head] = 1 - eps
        up = hand_nll(model, ids, 16, gates)[0].sum()
        gates[layer][0, head] = 1 + eps
        down = hand_nll(model, ids, 16, gates)[0].sum()
        # −∂L/∂g by a central difference of the mean NLL
        assert taylor[layer * n_heads + head] == pytest.approx((up - down) / (2 * eps) / p.n.sum(), rel=2e-3, abs=1e-5)


def _pass(seq_len, nll, taylor) -> SpanSums:
    return SpanSums(seq_len, np.array([10.0, 10.0, 20.0]), np.asarray(nll, float), np.asarray(taylor, float))


def test_the_length_table_pairs_the_lengths_on_the_same_spans():
    passes = [_pass(4, [30.0, 40.0, 70.0], np.eye(3)), _pass(16, [20.0, 35.0, 60.0], np.eye(3))]
    counts = span_counts(3, 200, 0)
    t = length_table(passes, counts)
    assert t["nll"].tolist() == pytest.approx([140 / 40, 115 / 40])
    assert t["ppl"].tolist() == pytest.approx([math.exp(3.5), math.exp(115 / 40)])
    assert t["delta_nll"].tolist() == pytest.approx([0.0, -25 / 40])
    reps = (counts @ np.array([20.0, 35.0, 60.0]) - counts @ np.array([30.0, 40.0, 70.0])) / (counts @ [10, 10, 20.0])
    assert t.loc[1, "delta_ci_lo"] == pytest.approx(np.percentile(reps, 2.5))
    assert t.loc[1, "delta_ci_hi"] == pytest.approx(np.percentile(reps, 97.5))
    assert t.loc[1, "delta_ci_hi"] < 0  # every span is lower
    assert t["windows"].tolist() == [12, 3] and t["tokens"].tolist() == [40, 40]
    with pytest.raises(Exception, match="different targets"):
        length_table([passes[0], SpanSums(16, np.array([9.0, 10, 20]), passes[1].nll, passes[1].taylor)], counts)


def test_rank_agreement_between_lengths_and_corpora():
    rng = np.random.default_rng(0)
    H = 40
    base = rng.normal(size=(3, H))
    passes = [_pass(4, [30.0, 40.0, 70.0], base), _pass(16, [20.0, 35.0, 60.0], base[::-1] * 2 + 0.01)]
    t = rank_table(passes, span_counts(3, 200, 0), run_taylor=-base.sum(0), run_replicates=None, seed=0)
    assert t["x"].tolist() == ["longdocs, 4", "the run's corpus, 4"] and t["y"].tolist() == ["longdocs, 16"] * 1 + \
        ["longdocs, 4"]
    from scipy.stats import spearmanr

    x4, x16 = base.sum(0) / 40, (base[::-1] * 2 + 0.01).sum(0) / 40
    assert t.loc[0, "spearman_rho"] == pytest.approx(spearmanr(x4, x16).statistic)
    assert t.loc[1, "spearman_rho"] == pytest.approx(-1.0)
    assert t.loc[0, "top"] == 4
    assert (t["spearman_ci_lo"] <= t["spearman_rho"] + 1e-12).all() and (t["spearman_rho"] <= t["spearman_ci_hi"]
                                                                        + 1e-12).all()


def _tables() -> dict[str, pd.DataFrame]:
    windows = pd.DataFrame([
        {"seq_len": 128, "tokens": 16000, "spans": 8, "windows": 128, "nll": 2.0, "ppl": math.exp(2.0),
         "ppl_ci_lo": 6.5, "ppl_ci_hi": 8.5, "delta_nll": 0.0, "delta_ci_lo": 0.0, "delta_ci_hi": 0.0},
        {"seq_len": 512, "tokens": 16000, "spans": 8, "windows": 32, "nll": 1.8, "ppl": math.exp(1.8),
         "ppl_ci_lo": 5.5, "ppl_ci_hi": 7.0, "delta_nll": -0.2, "delta_ci_lo": -0.25, "delta_ci_hi": -0.15},
        {"seq_len": 2048, "tokens": 16000, "spans": 8, "windows": 8, "nll": 1.79, "ppl": math.exp(1.79),
         "ppl_ci_lo": 5.4, "ppl_ci_hi": 7.0, "delta_nll": -0.21, "delta_ci_lo": -0.3, "delta_ci_hi": 0.01}])
    row = {"top": 27, "top_shared": 0.7, "top_shared_ci_lo": 0.5, "top_shared_ci_hi": 0.8}
    ranks = pd.DataFrame([
        {"x": "longdocs, 128", "y": "longdocs, 512", "x_len": 128, "y_len": 512, "spearman_rho": 0.9,
         "spearman_ci_lo": 0.85, "spearman_ci_hi": 0.95, **row},
        {"x": "longdocs, 128", "y": "longdocs, 2048", "x_len": 128, "y_len": 2048, "spearman_rho": 0.8,
         "spearman_ci_lo": 0.7, "spearman_ci_hi": 0.86, **row},
        {"x": "the run's corpus, 128", "y": "longdocs, 128", "x_len": 128, "y_len": 128, "spearman_rho": 0.5,
         "spearman_ci_lo": 0.4, "spearman_ci_hi": 0.6, **row}])
    return {WINDOWS_FILE: windows, RANKS_FILE: ranks}


def test_the_sentences_say_what_the_tables_say():
    t = _tables()
    said = length_sentence(t[WINDOWS_FILE])
    assert said == ("On 16,000 tokens of the long documents (test split; 8 spans of 2,048 tokens, the bootstrap's "
                    f"units), perplexity in windows of 128 tokens is {math.exp(2):.2f} [6.50, 8.50]; in windows of "
                    f"512: {math.exp(1.8):.2f} [5.50, 7.00], ΔNLL -0.200 [-0.250, -0.150] nats/token (lower); in "
                    f"windows of 2,048: {math.exp(1.79):.2f} [5.40, 7.00], ΔNLL -0.210 [-0.300, +0.010] nats/token "
                    "(not told apart).")
    ranks = rank_sentence(t[RANKS_FILE])
    assert ("2,048 against 128 tokens on the same text: ρ +0.80 [+0.70, +0.86], 70% [50%, 80%] of the top 27 in "
            "common") in ranks
    assert ranks.endswith("Going from 128 to 2,048 tokens moves the ranking less than the change of corpus does.")
    r = t[RANKS_FILE]
    assert moves(r.iloc[1], r.iloc[2].replace(0.6, 0.75)) == "not told apart from"
    assert moves(r.iloc[1], r.iloc[2].replace({0.4: 0.9, 0.6: 0.95})) == "more than"
    section = long_section(t)
    assert section.title.startswith("Long documents")
