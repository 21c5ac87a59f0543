"""Learned hard-concrete head gates (headprune.pruning.gates): the distribution against its closed form, training, the
sparsity target, resume, and the learn-gates / prune / curve commands."""

import math
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest
import torch

from headprune.cli.main import main
from headprune.io.read.loading import load_model
from headprune.io.work.files import read_table
from headprune.io.work.progress import Progress
from headprune.perplexity import Windowing
from headprune.pruning.gates import (
    GateOptions,
    deterministic_gates,
    gate_cdf,
    gate_head_sets,
    gate_objective,
    learn_gates,
    prob_open,
    sample_gates,
)
from headprune.pruning.selection import select_heads
from headprune.schema import ALL_METHODS, METHODS, method_family, parse_methods
from headprune.table_checks import check_scores

from helpers import random_tokens


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Training loops of tiny models: one thread is as fast, and far faster on a shared, busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(tiny_dir, device="cpu")


@pytest.fixture(scope="module")
def batches():
    ids = random_tokens(B=1, T=8 * 32, seed=3).view(-1)
    return Windowing.resolve(64, 32, 32, 2).batches(ids)  # 8 windows of 32 tokens, 2 a batch


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ---------------------------------------------------------------- the distribution


@pytest.mark.parametrize("log_alpha", [-2.0, 0.0, 1.5])
def test_hard_concrete_samples_match_the_analytic_cdf(log_alpha):
    n = 400_000
    u = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    z = sample_gates(torch.tensor(log_alpha, dtype=torch.float64), u)
    beta, gamma, zeta = 2 / 3, -0.1, 1.1
    # By hand: z = 0 iff the stretched s = σ((L + log α)/β)(ζ − γ) + γ <= 0 with L ~ Logistic(0, 1), i.e.
    # L <= β log(−γ/ζ) − log α; z = 1 iff L >= β log((1 − γ)/(ζ − 1)) − log α.
    p_zero = _sigmoid(beta * math.log(-gamma / zeta) - log_alpha)
    p_one = 1 - _sigmoid(beta * math.log((1 - gamma) / (zeta - 1)) - log_alpha)
    c = (0.5 - gamma) / (zeta - gamma)
    p_half = _sigmoid(beta * math.log(c / (1 - c)) - log_alpha)  # P(z <= 0.5)
    tol = 5 * math.sqrt(0.25 / n)  # five standard errors of a proportion
    assert abs(float((z == 0).double().mean()) - p_zero) < tol
    assert abs(float((z == 1).double().mean()) - p_one) < tol
    assert abs(float((z <= 0.5).double().mean()) - p_half) < tol
    la = torch.tensor(log_alpha, dtype=torch.float64)
    assert float(gate_cdf(la, 0.0)) == pytest.approx(p_zero, abs=1e-12)
    assert float(gate_cdf(la, 0.5)) == pytest.approx(p_half, abs=1e-12)
    assert float(prob_open(la)) == pytest.approx(1 - p_zero, abs=1e-12)
    assert float(deterministic_gates(la)) == pytest.approx(min(1, max(0, _sigmoid(log_alpha) * 1.2 - 0.1)), abs=1e-12)


def test_gate_cdf_refuses_x_outside_its_range():
    with pytest.raises(ValueError):
        gate_cdf(torch.tensor(0.0), 1.0)


# ---------------------------------------------------------------- training


def test_training_reduces_the_objective(tiny, batches):
    penalty = 0.05
    result = learn_gates(tiny, batches, options=GateOptions(40, penalty=penalty, lr=0.1, seed=0), show_progress=False)
    start = torch.full((len(tiny.head_ids),), 3.0)  # the initial log α
    before = gate_objective(tiny, batches, start, penalty)
    after = gate_objective(tiny, batches, torch.tensor(result.log_alpha), penalty)
    assert after < before - 0.05, (before, after)
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert result.closed == [] and result.lambdas == [penalty] and result.steps_run == 40


@pytest.mark.slow
def test_without_penalty_no_gate_closes_and_with_one_they_shut():
    """On the shipped model (trained heads), NLL alone keeps every gate open; the same training with a penalty
    drives them towards shut: closing is the penalty's doing."""
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.tokenizer import model_tokenizer

    model = load_model("stdlib-gpt2-mini", device="cpu")
    ids = corpus_ids("default", "validation", model_tokenizer(model), 4 * 32)
    data = Windowing.resolve(256, 32, 32, 2).batches(ids)
    free = learn_gates(model, data, options=GateOptions(20, penalty=0.0, seed=0), show_progress=False)
    assert (free.table["gate"] > 0.5).all() and (deterministic_gates(torch.tensor(free.log_alpha)) > 0).all()
    assert free.closed == []
    taxed = learn_gates(model, data, options=GateOptions(20, penalty=0.05, seed=0), show_progress=False)
    assert all(t < f for t, f in zip(taxed.log_alpha, free.log_alpha))
    assert sum(taxed.log_alpha) / len(taxed.log_alpha) < sum(free.log_alpha) / len(free.log_alpha) - 0.25


@pytest.mark.parametrize("sparsity", [0.25, 0.3, 0.5, 0.75])
def test_sparsity_target_is_met_exactly_after_thresholding(tiny, batches, sparsity):
    result = learn_gates(tiny, batches, options=GateOptions(12, sparsity=sparsity, seed=1), show_progress=False)
    n = len(tiny.head_ids)
    assert len(result.closed) == round(sparsity * n)  # 3, 4 (3.6), 6, 9 of 12
    table = check_scores(result.table)
    assert result.closed == select_heads(table, "gate", fraction=sparsity)  # what prune --method gate removes
    gate = dict(zip(zip(table["layer"], table["head"]), table["gate"]))
    assert max(gate[h] for h in result.closed) <= min(g for h, g in gate.items() if h not in result.closed)


@pytest.mark.slow
def test_the_lagrangian_drives_the_expected_sparsity_to_the_target(tiny, batches):
    result = learn_gates(tiny, batches, options=GateOptions(150, sparsity=0.5, seed=0, checkpoint_every=25),
                         show_progress=False)
    opened = [h["open"] for h in result.history]
    assert opened[0] > 10  # the gates start open (12 heads)
    assert abs(opened[-1] - 6) < 2.0, opened  # near 50% of 12 heads expected open at the end (6)


def test_a_resumed_training_is_bit_identical(tiny, batches, tmp_path):
    settings = {"what": "test"}
    options = GateOptions(25, sparsity=0.5, seed=2, checkpoint_every=5)
    whole = learn_gates(tiny, batches, options=options, progress=Progress(tmp_path / "a.jsonl", settings),
                        show_progress=False)
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 5  # header and a checkpoint every 5 steps
    (tmp_path / "b.jsonl").write_text("\n".join(lines[:3]) + "\n")  # as if killed after step 10
    resumed = learn_gates(tiny, batches, options=options, progress=Progress(tmp_path / "b.jsonl", settings),
                          show_progress=False)
    assert resumed.steps_run == 15
    assert resumed.log_alpha == whole.log_alpha and resumed.lambdas == whole.lambdas
    assert resumed.history == whole.history
    pd.testing.assert_frame_equal(resumed.table, whole.table, check_exact=True)
    # the same checkpoints, byte for byte
    assert (tmp_path / "b.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()
    other_seed = learn_gates(tiny, batches, options=GateOptions(25, sparsity=0.5, seed=3), show_progress=False)
    assert other_seed.log_alpha != whole.log_alpha  # the seed matters: the comparison above can fail


def test_gate_head_sets_train_only_where_the_fraction_leaves_a_choice(tiny, batches):
    sets = gate_head_sets(tiny, batches, [0.0, 0.5, 1.0], 5, show_progress=False)
    assert sets[("gate", 0.0)] == [] and sets[("gate", 1.0)] == tiny.head_ids
    assert len(sets[("gate", 0.5)]) == 6


def test_gate_is_a_learned_method_that_score_never_computes():
    from headprune.scoring import FAMILY_SCORERS

    assert "gate" in ALL_METHODS and "gate" not in METHODS and "gate" not in parse_methods("all")
    assert all("gate" not in f.methods for f in FAMILY_SCORERS.values())
    assert method_family("gate") == "learned"


# ---------------------------------------------------------------- commands


def _learn(tiny_dir, corpus, out, *extra):
    return main(["learn-gates", "--model", str(tiny_dir), "--data", str(corpus), "--sparsity", "0.5",
                 "--gate-steps", "6", "--max-tokens", "300", "--seq-len", "32", "--batch-size", "2",
                 "--device", "cpu", "--quiet", "--out", str(out), *extra])


def test_learn_gates_writes_a_scores_table_that_prune_uses(tiny_dir, corpus, tmp_path, capsys):
    out = tmp_path / "gates.csv"
    assert _learn(tiny_dir, corpus, out) == 0
    first = capsys.readouterr().out.splitlines()[0]
    table = check_scores(read_table(out))
    assert list(table.columns) == ["layer", "head", "head_id", "model_fingerprint", "gate"]
    assert table["gate"].between(0, 1).all()
    closed = select_heads(table, "gate", fraction=0.5)
    assert first == f"closed 6 of 12 heads: {','.join(f'L{l}H{h}' for l, h in closed)}"
    assert not (tmp_path / "gates.csv.progress.jsonl").exists()
    assert main(["prune", "--model", str(tiny_dir), "--scores", str(out), "--method", "gate", "--fraction", "0.5",
                 "--out", str(tmp_path / "pruned"), "--device", "cpu", "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == first.replace("closed 6 of 12 heads", "heads removed (6)")
    again = tmp_path / "again.csv"
    assert _learn(tiny_dir, corpus, again) == 0
    assert again.read_bytes() == out.read_bytes()  # seeded: identical runs, identical files


def test_curve_learns_one_gate_set_per_fraction(tiny_dir, corpus, tmp_path, capsys):
    scores = tmp_path / "scores.csv"
    assert main(["score", "--model", str(tiny_dir), "--data", str(corpus), "--methods", "wo_fro", "--out", str(scores),
                 "--device", "cpu", "--quiet"]) == 0
    out = tmp_path / "curves.csv"
    assert main(["curve", "--model", str(tiny_dir), "--data", str(corpus), "--score-data", str(corpus), "--scores",
                 str(scores), "--methods", "gate,wo_fro", "--fractions", "0,0.5", "--seeds", "1", "--gate-steps", "4",
                 "--max-tokens", "300", "--seq-len", "32", "--batch-size", "2", "--device", "cpu", "--quiet",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    curves = read_table(out)
    gate = curves[curves["method"] == "gate"].set_index("fraction")
    assert list(gate["heads_pruned"]) == [0, 6]
    # the learned set at 0.5, pruned and evaluated by hand, gives the curve's NLL
    model = load_model(tiny_dir, device="cpu")
    from headprune.cli.common import data_from_args
    from headprune.cli.main import build_parser
    from headprune.pruning.prune import prune_model

    args = build_parser().parse_args(["curve", "--scores", "x", "--data", str(corpus), "--max-tokens", "300",
                                      "--out", "x.csv"])
    w = Windowing.resolve(64, 32, None, 2)
    heads = gate_head_sets(model, w.batches(data_from_args(args, model, str(corpus), "validation")), [0.5], 4,
                           show_progress=False)[("gate", 0.5)]
    from headprune.perplexity import evaluate

    nll = evaluate(prune_model(model, heads), data_from_args(args, model), Windowing(32, 32, 2), progress=False).nll
    assert gate.loc[0.5, "nll"] == pytest.approx(nll, abs=1e-9)


@pytest.mark.parametrize("option, value, message", [
    ("--sparsity", "1.5", "--sparsity 1.5 must lie in [0, 1]"),
    ("--sparsity", "-0.1", "--sparsity -0.1 must lie in [0, 1]"),
    ("--sparsity", "nan", "--sparsity nan must lie in [0, 1]"),
    ("--gate-steps", "0", "--gate-steps 0 must be at least 1"),
    ("--gate-steps", "-3", "--gate-steps -3 must be at least 1"),
    ("--lr", "0", "--lr 0.0 must be a positive number"),
])
def test_learn_gates_bad_input_is_one_line_and_exit_2(tiny_dir, corpus, tmp_path, capsys, option, value, message):
    args = {"--sparsity": "0.5", "--gate-steps": "3", "--lr": "0.1", option: value}
    out = tmp_path / "g.csv"
    code = main(["learn-gates", "--model", str(tiny_dir), "--data", str(corpus), "--out", str(out),
                 *[x for kv in args.items() for x in kv]])
    err = capsys.readouterr().err
    assert code == 2 and err == f"headprune: error: {message}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_killed_learn_gates_resumes_to_identical_gates(tiny_dir, corpus, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def cmd(out):
        return [sys.executable, "-m", "headprune", "learn-gates", "--model", str(tiny_dir), "--data", str(corpus),
                "--sparsity", "0.5", "--gate-steps", "30", "--max-tokens", "300", "--seq-len", "32",
                "--batch-size", "2", "--device", "cpu", "--quiet", "--out", str(out)]

    subprocess.run(cmd(tmp_path / "whole.csv"), env=env, check=True, capture_output=True, timeout=300)
    out = tmp_path / "killed.csv"
    progress = tmp_path / "killed.csv.progress.jsonl"
    proc = subprocess.run(cmd(out), check=False, env={**env, "HEADPRUNE_TEST_KILL_AFTER_UNITS": "2"},
                          capture_output=True, timeout=300)  # SIGKILL right after the second checkpoint
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert len(progress.read_text().splitlines()) == 1 + 2  # header, checkpoints at steps 10 and 20
    subprocess.run(cmd(out), env=env, check=True, capture_output=True, timeout=300)
    assert out.read_bytes() == (tmp_path / "whole.csv").read_bytes()
    assert not progress.exists()
