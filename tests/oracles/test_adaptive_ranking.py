"""The adaptive exact ranking (headprune.scoring.adaptive): each head's ΔL against transformers with the head's
c_proj input slice zeroed, on exactly the windows the seeded order gave it; with every head kept open to the last
window, the exact sweep's abl_zero; the intervals, rank intervals and statuses against hand calculations; resuming
from the progress file; the refusals; the ``rank`` command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import t as student_t
from transformers import GPT2LMHeadModel

from headprune.cli.main import main
from headprune.data.tokens import corpus_ids
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.io.work.files import read_table
from headprune.io.work.progress import Progress
from headprune.perplexity import Windowing
from headprune.scoring import ScoringOptions, score_heads
from headprune.scoring.adaptive import AdaptiveOptions, adaptive_ranking, adaptive_rounds
from headprune.scoring.adaptive_stats import decide, half_width, key_interval, window_estimate, window_schedule

from helpers import TINY, hf_zeroed_sums, random_tokens

WINDOWS = Windowing.resolve(TINY["n_positions"], seq_len=16, batch_size=4)
N_WINDOWS = 40  # 640 tokens in windows of 16
E, D_HEAD = TINY["n_embd"], TINY["n_embd"] // TINY["n_head"]


@pytest.fixture(scope="module")
def steered_dir(tiny_dir, tmp_path_factory):
    """The tiny GPT-2 with L2H1 made to predict token 7 everywhere (and L1H2, weaker, token 9): the head's first
    value dimension ignores the input and is 1 (the attention weights sum to 1), and W_O^(i) maps it to
    c · wte[t]/|wte[t]|. On text where every other token is 7, removing L2H1 costs nats in every window; the other
    heads stay random (effects near 0, either sign)."""
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    with torch.no_grad():
        for layer, head, token, c in [(2, 1, 7, 40.0), (1, 2, 9, 10.0)]:
            attn, u = hf.transformer.h[layer].attn, hf.transformer.wte.weight[token]
            attn.c_attn.weight[:, 2 * E + head * D_HEAD] = 0
            attn.c_attn.bias[2 * E + head * D_HEAD] = 1.0
            attn.c_proj.weight[head * D_HEAD] = c * u / u.norm()
    folder = tmp_path_factory.mktemp("steered")
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model(steered_dir):
    return load_model(steered_dir)


@pytest.fixture(scope="module")
def ids():
    ids = random_tokens(B=1, T=16 * N_WINDOWS, seed=7).view(-1)
    ids[1::2], ids[::8] = 7, 9
    return ids


@pytest.fixture(scope="module")
def ranking(model, ids):
    return adaptive_ranking(model, ids, options=AdaptiveOptions(top=2, first_windows=4), windowing=WINDOWS,
                            show_progress=False)


def _seeded_windows(ids, seed: int):
    """Every window of the corpus as (tokens (1, T), mask (1, T−1)), in the order numpy's generator under ``seed``
    permutes them: the order the module documents."""
    rows = [(b.tokens[i : i + 1], b.mask[i : i + 1]) for b in WINDOWS.batches(ids) for i in range(len(b.tokens))]
    return [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]


def test_each_head_is_measured_exactly_on_the_first_windows_of_the_seeded_order(ranking, ids, steered_dir):
    """ΔL = Σ_w (ablated − unablated NLL sum) / Σ_w scored tokens over the head's first W windows, transformers
    computing both sums; se is the ratio estimator's, and the interval at most ΔL ± t·se (Bonferroni over 12 heads
    and the rounds of the schedule 4, 8, 16, 32, 40)."""
    hf = GPT2LMHeadModel.from_pretrained(steered_dir).eval()
    windows = _seeded_windows(ids, 0)
    table = ranking.table
    assert set(table["windows"]) <= {4, 8, 16, 32, 40} and table["windows"].nunique() >= 3  # heads stopped apart
    tests = 12 * len(window_schedule(4, N_WINDOWS, 2.0))
    for _, row in table.iterrows():
        first = windows[: row["windows"]]
        base = np.array([hf_zeroed_sums(hf, t, m, [])[0] for t, m in first])
        ablated = np.array([hf_zeroed_sums(hf, t, m, [(row["layer"], row["head"])])[0] for t, m in first])
        tokens = np.array([float(m.sum()) for _, m in first])
        delta = (ablated - base).sum() / tokens.sum()
        residual = (ablated - base) - delta * tokens
        se = np.sqrt(len(first) / (len(first) - 1) * (residual**2).sum()) / tokens.sum()
        assert row["delta"] == pytest.approx(delta, rel=0, abs=5e-7)  # float32 sums of ~16 tokens each
        assert row["se"] == pytest.approx(se, rel=1e-3)
        assert row["tokens"] == tokens.sum()
        half = student_t.ppf(1 - 0.05 / tests / 2, len(first) - 1) * se
        slack = 1e-5  # float32 sums: the interval's ends agree to ~1e-6 and move with BLAS's last bits
        assert delta - half - slack <= row["ci_lo"] <= row["delta"] <= row["ci_hi"] <= delta + half + slack
        if row["windows"] == 4:  # one round, one interval: exactly ΔL ± t·se
            assert (row["ci_lo"], row["ci_hi"]) == pytest.approx((delta - half, delta + half), rel=1e-3)


def test_heads_open_to_the_last_window_carry_the_exact_sweeps_values(tiny_dir):
    """On the random tiny GPT-2 at a confidence so high that no interval decides anything, every head is measured on
    every window: the exact sweep of abl_zero on the same tokens, computed by another path (one unit per layer,
    every head of it)."""
    model, ids = load_model(tiny_dir), random_tokens(B=1, T=16 * N_WINDOWS, seed=7).view(-1)
    result = adaptive_ranking(model, ids, options=AdaptiveOptions(top=3, level=1 - 1e-12, first_windows=4),
                              windowing=WINDOWS, show_progress=False)
    exact = score_heads(model, ids, "abl_zero", windowing=WINDOWS, options=ScoringOptions(bootstrap=0),
                        show_progress=False)
    assert (result.table["windows"] == N_WINDOWS).all() and (result.table["status"] == "contested").all()
    np.testing.assert_allclose(result.table["delta"], exact.table["abl_zero"], rtol=0, atol=1e-10)
    assert result.baseline_nll == pytest.approx(exact.baseline["nll"], abs=1e-12)
    assert result.rounds["windows"].tolist() == [4, 8, 16, 32, 40] and result.rounds["heads"].tolist() == [12] * 5
    assert result.head_windows == 12 * N_WINDOWS


def test_statuses_and_ranks_follow_the_intervals(ranking):
    """Each row's rank interval and status are decide()'s on the table's own intervals (|ΔL| for the top target):
    the steered head is certified first after the first round, the heads certified out stopped measuring then, the
    contested ones went on to the last window."""
    table = ranking.table
    key_lo = np.where(table["ci_lo"] > 0, table["ci_lo"], np.where(table["ci_hi"] < 0, -table["ci_hi"], 0))
    key_hi = np.maximum(table["ci_lo"].abs(), table["ci_hi"].abs())
    for n in range(len(table)):
        above = int((key_lo > key_hi[n]).sum())
        maybe = int((key_hi >= key_lo[n]).sum()) - 1
        assert (table["rank_lo"][n], table["rank_hi"][n]) == (1 + above, 1 + maybe)
        expected = "in" if 1 + maybe <= 2 else "out" if 1 + above > 2 else "contested"
        assert table["status"][n] == expected
    steered = table.set_index("head_id").loc["L2H1"]
    assert ranking.certified == ["L2H1"] and steered["windows"] == 4 and steered["delta"] > 1 and steered["sign"] == "+"
    assert (table["status"] == "out").any() and set(table.loc[table["status"] == "out", "windows"]) < {8, 16, 32}
    assert set(table.loc[table["status"] == "contested", "windows"]) == {N_WINDOWS}
    assert ranking.open_places == 1 and len(ranking.contested) == (table["status"] == "contested").sum()
    assert ranking.rounds["heads"].iloc[0] == 12 and ranking.rounds["heads"].iloc[1] == 11


def test_decide_by_hand():
    """Key intervals A [5, 6], B [4, 4.5], C [3.9, 4.2], D [0, 1], E [0, 0.5]: A ranks 1st for sure; B and C rank
    2nd or 3rd (each may pass the other); D and E rank 4th or 5th."""
    lo, hi = np.array([5, 4, 3.9, 0, 0]), np.array([6, 4.5, 4.2, 1, 0.5])
    two = decide(lo, hi, 2)
    assert two.rank_lo.tolist() == [1, 2, 2, 4, 4] and two.rank_hi.tolist() == [1, 3, 3, 5, 5]
    assert two.status.tolist() == ["in", "contested", "contested", "out", "out"]
    assert decide(lo, hi, 3).status.tolist() == ["in", "in", "in", "out", "out"]
    assert decide(lo, hi, 1).status.tolist() == ["in", "out", "out", "out", "out"]


def test_decide_with_a_margin_by_hand():
    """Key intervals A [5, 6], B [4, 4.5], C [3.9, 4.2], D [0, 1], E [0, 0.5], K = 2, B in the point top 2. With
    margin 0.25 (or 0.5), B is in: of the others only A may exceed it by the margin (6 ≥ 4.25; C: 4.2 < 4.25); C is
    out: A and B surely exceed it less the margin (5 > 3.95, 4 > 3.95). With margin 0.1 both stay contested: C may
    exceed B by 0.1 (4.2 ≥ 4.1), and B need not exceed C less 0.1 (4 > 4.1 fails)."""
    lo, hi = np.array([5, 4, 3.9, 0, 0]), np.array([6, 4.5, 4.2, 1, 0.5])
    half = decide(lo, hi, 2, margin=0.5)
    assert half.status.tolist() == ["in", "in", "out", "out", "out"]
    assert half.rank_lo.tolist() == decide(lo, hi, 2).rank_lo.tolist()  # rank intervals take no margin
    quarter = decide(lo, hi, 2, margin=0.25)
    assert quarter.status.tolist() == ["in", "in", "out", "out", "out"]
    tenth = decide(lo, hi, 2, margin=0.1)  # C's 4.2 ≥ 4.1: B contested; B's 4 > 4.1 fails: C contested
    assert tenth.status.tolist() == ["in", "contested", "contested", "out", "out"]
    with pytest.raises(HeadpruneError, match="margin -1"):
        decide(lo, hi, 2, margin=-1)


def test_key_intervals_by_hand():
    lo, hi = np.array([0.2, -0.3, -0.5]), np.array([0.4, 0.1, -0.1])
    top_lo, top_hi = key_interval(lo, hi, "top")  # |ΔL|: an interval holding 0 starts at 0
    assert top_lo.tolist() == [0.2, 0.0, 0.1] and top_hi.tolist() == [0.4, 0.3, 0.5]
    prune_lo, prune_hi = key_interval(lo, hi, "prune")  # −ΔL: the smallest ΔL ranks first
    assert prune_lo.tolist() == [-0.4, -0.1, 0.1] and prune_hi.tolist() == [-0.2, 0.3, 0.5]


def test_window_estimate_by_hand():
    """d = [1, 2, 4] over t = [10, 10, 20]: ΔL = 7/40; residuals −0.75, 0.25, 0.5; se = sqrt(3/2 · 0.875)/40."""
    change, se = window_estimate(np.array([1.0, 2.0, 4.0]), np.array([10.0, 10.0, 20.0]))
    assert change == pytest.approx(0.175, abs=1e-15)
    assert se == pytest.approx(np.sqrt(1.5 * 0.875) / 40, rel=1e-12)
    assert window_estimate(np.array([1.0]), np.array([10.0]))[1] == np.inf


def test_the_quantiles_docs_methods_quotes():
    """methods.md: over 270 heads and 5 rounds at 95%, Student's quantile is 9.2 at 8 windows, 4.8 at 32, 4.3 at
    128 (half_width of se 1)."""
    quantiles = half_width(np.ones(3), np.array([8, 32, 128]), 0.95, 270 * 5)
    assert np.round(quantiles, 1).tolist() == [9.2, 4.8, 4.3]
    text = (Path(__file__).parents[2] / "docs" / "methods.md").read_text()
    assert "at 8 windows Student's quantile is 9.2 (df 7), at 32 windows 4.8,\nat 128 windows 4.3" in text


def test_window_schedule():
    assert window_schedule(4, 40, 2.0) == [4, 8, 16, 32, 40]
    assert window_schedule(8, 8, 2.0) == [8]
    assert window_schedule(3, 10, 1.5) == [3, 5, 8, 10]


def test_the_prune_target_certifies_the_smallest_changes(model, ids):
    """For the prune target the key is −ΔL: a head certified in has, within the intervals, one of the K smallest
    ΔL; checked against the exact sweep on every window (the intervals' truth here)."""
    result = adaptive_ranking(model, ids, options=AdaptiveOptions(top=10, target="prune", first_windows=4),
                              windowing=WINDOWS, show_progress=False)
    exact = score_heads(model, ids, "abl_zero", windowing=WINDOWS, options=ScoringOptions(bootstrap=0),
                        show_progress=False).table["abl_zero"]
    smallest = set(exact.nsmallest(10).index)
    certified = set(result.table.index[result.table["status"] == "in"])
    assert certified and certified <= smallest
    assert set(result.table.index[result.table["status"] == "out"]).isdisjoint(smallest)


def _synthetic(means: np.ndarray, spread: float, seed: int):
    """A measure for adaptive_rounds: window w of head n changes the NLL sum by t·μ_n + noise, t = 100 scored
    tokens, the noise normal with sd ``spread``·√t, drawn once for every head and window (so a head measured in a
    later round sees the same windows as if it had been measured at once)."""
    noise = np.random.default_rng(seed).normal(0, spread * 10, (len(means), 512))

    def measure(active, start, end):
        t = np.full(end - start, 100.0)
        return means[active, None] * t + noise[active, start:end], t, [0.0] * (end - start)

    return measure


def test_certified_heads_are_right_at_the_stated_level():
    """30 heads with ΔL spaced 0.01 apart and window noise of sd 0.5 nats/token: over 200 corpora, the certified
    top 5 holds only true top-5 heads and the certified-out heads none of them in at least 95% of runs (Bonferroni
    makes it nearer 100%); each decides at least 3 heads, and a head far from the boundary stops early."""
    means = np.linspace(0.3, 0.0, 30)
    wrong, decided, early = 0, [], []
    for seed in range(200):
        measured, decision, _ = adaptive_rounds(_synthetic(means, 0.5, seed), 30, 5, window_schedule(8, 512, 2))
        wrong += bool(set(np.flatnonzero(decision.status == "in")) - set(range(5))
                      or set(np.flatnonzero(decision.status == "out")) & set(range(5)))
        decided.append(int((decision.status != "contested").sum()))
        early.append(measured.windows[-1] < 512)
    assert wrong <= 10 and min(decided) >= 3 and all(early)


def test_a_margin_decides_a_dense_boundary_and_keeps_its_promise():
    """Heads 3 to 8 share ΔL 0.1 (a tie across the boundary of the top 5): without a margin they stay contested to
    the last window; with a margin of 0.02 every head is decided, each head in within 0.02 of the K-th true ΔL or
    above, each head out at most 0.02 above it, in at least 95% of 100 corpora."""
    means = np.r_[0.5, 0.4, np.full(6, 0.1), np.zeros(22)]
    exact = adaptive_rounds(_synthetic(means, 0.3, 0), 30, 5, window_schedule(8, 512, 2))[1]
    assert (exact.status == "contested").sum() >= 6
    broken, contested = 0, 0
    for seed in range(100):
        _, decision, _ = adaptive_rounds(_synthetic(means, 0.3, seed), 30, 5, window_schedule(8, 512, 2), margin=0.02)
        mu_k = np.sort(means)[::-1][4]
        broken += bool((means[decision.status == "in"] < mu_k - 0.02).any()
                       or (means[decision.status == "out"] > mu_k + 0.02).any())
        contested += int((decision.status == "contested").sum())
    assert broken <= 5 and contested == 0


def test_well_separated_heads_are_decided_in_the_first_round():
    """Five heads at 1.0, 25 at 0, little noise: one round of 8 windows decides every head."""
    means = np.r_[np.ones(5), np.zeros(25)]
    measured, decision, rounds = adaptive_rounds(_synthetic(means, 0.05, 0), 30, 5, window_schedule(8, 512, 2))
    assert decision.status.tolist() == ["in"] * 5 + ["out"] * 25 and len(rounds) == 1
    assert (measured.windows == 8).all() and rounds["contested"].tolist() == [0]


def test_a_cost_cap_stops_before_the_round_that_would_pass_it():
    """A tie at the boundary keeps rounds going; a cap of the first three rounds' head-windows (plus less than the
    fourth needs) gives exactly those three rounds, each head's ΔL the mean of its own windows' changes."""
    means = np.r_[0.5, 0.4, np.full(6, 0.1), np.zeros(22)]
    schedule = window_schedule(8, 512, 2)
    full = adaptive_rounds(_synthetic(means, 0.3, 0), 30, 5, schedule)[2]
    spent = int((full["heads"] * np.diff(np.r_[0, full["windows"]])).iloc[:3].sum())
    fourth = int(full["heads"].iloc[3] * (full["windows"].iloc[3] - full["windows"].iloc[2]))
    measured, _, rounds = adaptive_rounds(_synthetic(means, 0.3, 0), 30, 5, schedule, cap=spent + fourth - 1)
    assert rounds.drop(columns="seconds").equals(full.drop(columns="seconds").iloc[:3])
    assert int(measured.windows.sum()) == spent
    noise = np.random.default_rng(0).normal(0, 0.3 * 10, (30, 512))
    expected = [means[n] + noise[n, :w].sum() / (100 * w) for n, w in enumerate(measured.windows)]
    np.testing.assert_allclose(measured.delta, expected, rtol=0, atol=1e-12)


def test_resumed_from_its_progress_file_without_recomputing(model, ids, tmp_path, monkeypatch):
    settings = {"test": "adaptive"}
    options = AdaptiveOptions(top=3, first_windows=4, seed=3)
    first = adaptive_ranking(model, ids, options=options, windowing=WINDOWS,
                             progress=Progress(tmp_path / "p.jsonl", settings), show_progress=False)

    def fail(*args, **kwargs):
        raise AssertionError("a finished unit was computed again")

    monkeypatch.setattr("headprune.scoring.set_sweep.ablated_sums", fail)
    monkeypatch.setattr("headprune.scoring.set_sweep.batch_caches", lambda *a: fail)
    again = adaptive_ranking(model, ids, options=options, windowing=WINDOWS,
                             progress=Progress(tmp_path / "p.jsonl", settings), show_progress=False)
    assert again.table.equals(first.table) and again.rounds.drop(columns="seconds").equals(
        first.rounds.drop(columns="seconds"))


@pytest.mark.parametrize(("options", "method", "message"), [
    (AdaptiveOptions(top=12), "abl_zero", "top 12 of 12 heads"),
    (AdaptiveOptions(target="middle"), "abl_zero", "unknown target 'middle'"),
    (AdaptiveOptions(first_windows=64), "abl_zero", "first_windows 64: the corpus holds only 40 windows"),
    (AdaptiveOptions(level=1.0), "abl_zero", "level 1.0 must lie strictly between 0 and 1"),
    (AdaptiveOptions(growth=1.0), "abl_zero", "growth 1.0 must exceed 1"),
    (AdaptiveOptions(), "taylor", "cannot rank 'taylor' adaptively"),
    (AdaptiveOptions(first_windows=4, max_head_windows=47), "abl_zero", "less than the first round, 12 heads × 4"),
])
def test_refusals(model, ids, options, method, message):
    with pytest.raises(HeadpruneError, match=message):
        adaptive_ranking(model, ids, method, options=options, windowing=WINDOWS, show_progress=False)


def test_rank_command(tiny_dir, corpus, tmp_path, capsys):
    """The command's table is the library's on the same tokens; bad input is one line and no output."""
    out = tmp_path / "rank.csv"
    window = ["--seq-len", "16", "--batch-size", "4", "--max-tokens", "640"]
    assert main(["rank", "--model", str(tiny_dir), "--data", str(corpus), *window, "--top", "3", "--first-windows",
                 "4", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "first round, every head on 4 of 40 windows" in printed and "certified in the top 3" in printed
    model = load_model(tiny_dir)
    ids = corpus_ids(str(corpus), "test", model_tokenizer(model), 640)
    library = adaptive_ranking(model, ids, options=AdaptiveOptions(top=3, first_windows=4), windowing=WINDOWS,
                               show_progress=False)
    table = read_table(out)
    np.testing.assert_allclose(table["delta"], library.table["delta"], rtol=0, atol=1e-12)
    assert table["status"].tolist() == library.table["status"].tolist()
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["top"] == 3 and summary["certified"] == library.certified
    assert not out.with_name(out.name + ".progress.jsonl").exists()
    assert main(["rank", "--model", str(tiny_dir), "--data", str(corpus), *window, "--target", "prune", "--top", "3",
                 "--margin", "0.01", "--first-windows", "4", "--quiet", "--out", str(tmp_path / "prune.csv")]) == 0
    printed = capsys.readouterr().out
    assert "certified in the 3 heads a prune removes first by abl_zero at 95%, ties within 0.01" in printed
    bad = tmp_path / "bad.csv"
    assert main(["rank", "--model", str(tiny_dir), "--data", str(corpus), *window, "--first-windows", "1",
                 "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("headprune: error: --first-windows 1: give at least 2")
    assert not bad.exists()


def test_rank_command_under_a_cost_cap(tiny_dir, corpus, tmp_path, capsys):
    """--max-head-windows 48 (12 heads × the first 4 windows) stops after one round and says so; --max-minutes that
    buys less than the first round is one line."""
    out = tmp_path / "capped.csv"
    window = ["--seq-len", "16", "--batch-size", "4", "--max-tokens", "640"]
    common = ["rank", "--model", str(tiny_dir), "--data", str(corpus), *window, "--top", "3", "--first-windows", "4"]
    assert main([*common, "--max-head-windows", "48", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "capped at 48 head-windows" in printed and "1 round (stopped by the cost cap), up to 4 windows;" in printed
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["stopped"] == "cap" and summary["head_windows"] == 48 and summary["contested"]
    assert summary["max_head_windows"] == 48
    assert main([*common, "--max-minutes", "1e-9", "--out", str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-minutes 1e-09 buys about 0 head-window ablations here" in err
    assert not (tmp_path / "none.csv").exists()
