"""Recovery after pruning: schedule, loss, distillation gradient, resume, the finetune command."""

import copy
import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from headprune.cli.main import main
from headprune.data.sources import load_texts
from headprune.data.tokens import tokenize_corpus
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.perplexity import Windowing, evaluate
from headprune.pruning import finetune as ft
from headprune.pruning.finetune import Recipe, finetune, lr_factor, make_optimizer, recovery_loss
from headprune.pruning.prune import prune_model
from headprune.schema import gap_recovered

RECIPE = {"lr": 1e-3, "batch_size": 2, "seq_len": 16, "checkpoint_every": 2}


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


@pytest.fixture(scope="module")
def ids(model, corpus):
    return tokenize_corpus(load_texts(str(corpus)), model_tokenizer(model))[:1500]


@pytest.fixture(scope="module")
def eval_corpus(tmp_path_factory):
    import pydoc_data.topics

    path = tmp_path_factory.mktemp("eval") / "e.txt"
    path.write_text(" ".join(list(pydoc_data.topics.topics.values())[40:60])[:3000])
    return path


def test_schedule_matches_hand_computed_learning_rates():
    # 10 steps, warmup 2, floor 0.1: f(0) = 1/2, f(1) = 2/2; then 0.1 + 0.9 * (1 + cos(pi (k-2)/8)) / 2
    expected = {0: 0.5, 1: 1.0, 2: 1.0, 6: 0.55, 9: 0.1 + 0.45 * (1 - 0.9238795325112867)}
    for step, value in expected.items():
        assert lr_factor(step, 10, 2, 0.1) == pytest.approx(value, abs=1e-12)
    # the optimiser really uses lr * f(k) for update k
    lin = torch.nn.Linear(2, 2)
    recipe = Recipe(steps=10, lr=0.01, warmup=2, seq_len=8).resolve(8)
    opt, sched = make_optimizer(lin, recipe)  # type: ignore[arg-type]
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    for step, value in expected.items():
        assert seen[step] == pytest.approx(0.01 * value, rel=1e-12)


def test_default_warmup_is_a_tenth_and_bad_recipes_are_refused():
    assert Recipe(steps=50).resolve(64).warmup == 5 and Recipe(steps=5).resolve(64).warmup == 1
    from headprune.errors import HeadpruneError

    for bad in ({"lr": 0}, {"warmup": 11}, {"seq_len": 65}, {"distill_weight": 1.5}, {"temperature": 0},
                {"checkpoint_every": 0}, {"lr": math.nan}):
        with pytest.raises(HeadpruneError):
            Recipe(steps=10, **bad).resolve(64)


def test_recovery_loss_gradient_matches_hand_formula():
    # d loss / d s = [(1-a) (softmax(s) - onehot) + a T (softmax(s/T) - softmax(u/T))] / n, n predictions
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 4, 7, generator=g, dtype=torch.float64).requires_grad_(True)
    u = torch.randn(2, 4, 7, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 7, (2, 4), generator=g)
    a, T = 0.3, 2.5
    loss, ce, kl = recovery_loss(s, tokens, u, a, T)
    loss.backward()
    n = 2 * 3
    onehot = torch.nn.functional.one_hot(tokens[:, 1:], 7).double()
    sd = s.detach()[:, :-1]
    grad = ((1 - a) * (sd.softmax(-1) - onehot) + a * T * ((sd / T).softmax(-1) - (u[:, :-1] / T).softmax(-1))) / n
    assert torch.allclose(s.grad[:, :-1], grad, atol=1e-12) and s.grad[:, -1].abs().max() == 0
    pu, ps = (u[:, :-1] / T).softmax(-1), (sd / T).softmax(-1)
    assert kl is not None and kl.item() == pytest.approx(float((pu * (pu.log() - ps.log())).sum(-1).mean()), abs=1e-12)
    assert loss.item() == pytest.approx((1 - a) * ce.item() + a * T * T * kl.item(), abs=1e-12)


def test_distillation_from_itself_has_zero_gradient(model, ids):
    # float64, so that "zero" means rounding of 1e-16, not the 1e-8 of two float32 forwards on different kernels
    student, teacher = copy.deepcopy(model).double().requires_grad_(True), copy.deepcopy(model).double()
    tokens = ids[:32].view(2, 16)
    with torch.no_grad():
        t_logits = teacher(tokens)
    loss, _, kl = recovery_loss(student(tokens), tokens, t_logits, alpha=1.0, temperature=2.0)
    loss.backward()
    assert kl.item() == pytest.approx(0.0, abs=1e-12)
    assert max(p.grad.abs().max().item() for p in student.parameters() if p.grad is not None) < 1e-12
    # a different teacher pulls: the check can fail
    student.zero_grad()
    with torch.no_grad():
        other = prune_model(teacher, [(0, 0), (1, 2)])(tokens)
    recovery_loss(student(tokens), tokens, other, alpha=1.0, temperature=2.0)[0].backward()
    assert max(p.grad.abs().max().item() for p in student.parameters() if p.grad is not None) > 1e-4


def test_finetuning_lowers_the_loss_on_its_data(model, ids):
    pruned = prune_model(model, [(0, 1), (1, 0), (2, 3)])
    before = evaluate(pruned, ids, Windowing(16, 16), progress=False).nll
    result = finetune(pruned, ids, Recipe(steps=25, **RECIPE), show_progress=False)
    after = evaluate(pruned, ids, Windowing(16, 16), progress=False).nll
    assert after < before - 0.1, (before, after)
    assert len(result.losses) == 25 and not pruned.training and all(not p.requires_grad for p in pruned.parameters())
    assert pruned.cfg.kept_heads == [[0, 2, 3], [1, 2, 3], [0, 1, 2]]  # shapes kept


def test_same_seed_same_weights_other_seed_other_weights(model, ids):
    runs = []
    for seed in (0, 0, 1):
        m = prune_model(model, [(0, 1)])
        finetune(m, ids, Recipe(steps=3, seed=seed, **RECIPE), show_progress=False)
        runs.append(m.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert not all(torch.equal(runs[0][k], runs[2][k]) for k in runs[0])


def test_interrupted_finetune_resumes_to_bit_identical_weights(model, ids, tmp_path, monkeypatch):
    recipe = Recipe(steps=6, **RECIPE)
    whole = prune_model(model, [(0, 1), (2, 2)])
    reference = finetune(whole, ids, recipe, show_progress=False)
    ckpt = tmp_path / "ft.pt"
    real = ft.train_batch

    def stop_at_step_3(ids_, step, *a):
        if step == 3:  # steps 0..2 done, checkpoint at 2: step 2 is lost and redone
            raise KeyboardInterrupt
        return real(ids_, step, *a)

    monkeypatch.setattr(ft, "train_batch", stop_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        finetune(prune_model(model, [(0, 1), (2, 2)]), ids, recipe, checkpoint=ckpt, show_progress=False)
    monkeypatch.setattr(ft, "train_batch", real)
    resumed = prune_model(model, [(0, 1), (2, 2)])
    result = finetune(resumed, ids, recipe, checkpoint=ckpt, show_progress=False)
    assert result.resumed_from == 2 and result.losses == reference.losses
    assert all(torch.equal(resumed.state_dict()[k], whole.state_dict()[k]) for k in whole.state_dict())
    # another recipe refuses the checkpoint
    from headprune.errors import HeadpruneError

    with pytest.raises(HeadpruneError, match="different fine-tune"):
        finetune(prune_model(model, [(0, 1), (2, 2)]), ids, Recipe(steps=7, **RECIPE), checkpoint=ckpt,
                 show_progress=False)


def test_model_without_any_head_still_finetunes(model, ids):
    bare = prune_model(model, model.head_ids)
    mlp_before = bare.h[1].mlp.c_fc.weight.clone()
    before = evaluate(bare, ids, Windowing(16, 16), progress=False).nll
    result = finetune(bare, ids, Recipe(steps=10, **RECIPE), show_progress=False)
    assert bare.head_ids == [] and bare.h[0].attn.c_attn.weight.shape == (32, 0)
    assert all(math.isfinite(x) for x in result.losses) and not torch.equal(mlp_before, bare.h[1].mlp.c_fc.weight)
    assert evaluate(bare, ids, Windowing(16, 16), progress=False).nll < before


def test_gap_recovered():
    assert gap_recovered(100.0, 120.0, 110.0) == pytest.approx(0.5)
    assert gap_recovered(100.0, 120.0, 125.0) == pytest.approx(-0.25)
    assert math.isnan(gap_recovered(100.0, 100.0, 90.0))


# ---------------------------------------------------------------- the command


def _prune(tiny_dir, out, fmt="native", heads="L0H1,L1H0,L2H3"):
    assert main(["prune", "--model", str(tiny_dir), "--heads", heads, "--out", str(out), "--format", fmt,
                 "--device", "cpu", "--quiet"]) == 0
    return out


def _ft_args(pruned, out, corpus, eval_corpus, *extra):
    return ["finetune", str(pruned), "--steps", "3", "--out", str(out), "--train-data", str(corpus), "--data",
            str(eval_corpus), "--seq-len", "16", "--batch-size", "2", "--lr", "1e-3", "--device", "cpu", "--quiet",
            *extra]


@pytest.mark.parametrize("fmt", ["native", "hf"])
def test_finetune_command_keeps_format_and_pruned_shapes(fmt, tiny_dir, corpus, eval_corpus, tmp_path, capsys):
    pruned = _prune(tiny_dir, tmp_path / "pruned", fmt)
    capsys.readouterr()
    out = tmp_path / "recovered"
    assert main(_ft_args(pruned, out, corpus, eval_corpus, "--json", "--teacher", str(tiny_dir))) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == fmt and summary["recipe"]["distill_weight"] == 0.5
    assert summary["after"]["tokens"] == summary["before"]["tokens"] > 0
    marker = json.loads((out / "headprune_export.json").read_text())
    assert marker["format"] == fmt and marker["removed_heads"] == ["L0H1", "L1H0", "L2H3"] and "finetune" in marker
    assert marker["heads"] == "L0H1,L1H0,L2H3"  # the pruning record is carried over
    reloaded, _ = ft.load_pruned(out)
    assert reloaded.cfg.kept_heads == [[0, 2, 3], [1, 2, 3], [0, 1, 2]]
    if fmt == "hf":  # the removed heads stay exactly zero (they were removed again before training)
        w = load_file(out / "model.safetensors")["transformer.h.0.attn.c_attn.weight"]  # [32, 3*4*8]
        assert w[:, 8:16].abs().max() == 0 and w[:, 32 + 8:32 + 16].abs().max() == 0
        assert w[:, :8].abs().max() > 0
    assert not (tmp_path / ("recovered" + ".finetune-checkpoint.pt")).exists()
    ev = evaluate(reloaded, tokenize_corpus(load_texts(str(eval_corpus)), model_tokenizer(reloaded)), Windowing(64, 64),
                  progress=False)
    assert ev.ppl == pytest.approx(summary["after"]["ppl"], rel=1e-5)


@pytest.mark.parametrize("extra, message", [
    (["--train-data", "SAME"], "contains the evaluation data"),
    (["--steps", "0"], "--steps 0 must be at least 1"),
    (["--distill-weight", "0.5"], "--distill-weight needs --teacher"),
    (["--teacher", "TEACHER", "--distill-weight", "2"], "--distill-weight 2.0 must lie in [0, 1]"),
    (["--lr", "0"], "--lr 0.0 must be a positive number"),
    (["--temperature", "-1", "--teacher", "TEACHER"], "--temperature -1.0 must be a positive number"),
    (["--seq-len", "65"], "--seq-len 65 must lie in 2..n_positions (64)"),
    (["--warmup", "9"], "--warmup 9 must lie in 0..steps (3)"),
    (["--checkpoint-every", "0"], "--checkpoint-every 0 must be at least 1"),
])
def test_finetune_bad_input_one_line_exit_2_nothing_written(extra, message, tiny_dir, corpus, eval_corpus, tmp_path,
                                                            capsys):
    pruned = _prune(tiny_dir, tmp_path / "pruned")
    capsys.readouterr()
    extra = [str(eval_corpus) if e == "SAME" else str(tiny_dir) if e == "TEACHER" else e for e in extra]
    out = tmp_path / "recovered"
    assert main(_ft_args(pruned, out, corpus, eval_corpus, *extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("headprune: error: ") and message in err, err
    assert not out.exists() and not list(tmp_path.glob("*.finetune-checkpoint.pt"))


def test_finetune_command_on_a_model_without_heads(tiny_dir, corpus, eval_corpus, tmp_path, capsys):
    every = ",".join(f"L{layer}H{head}" for layer in range(3) for head in range(4))
    pruned = _prune(tiny_dir, tmp_path / "bare", "native", every)
    capsys.readouterr()
    assert main(_ft_args(pruned, tmp_path / "out", corpus, eval_corpus, "--json")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["after"]["nll"] < summary["before"]["nll"]
    assert load_model(tmp_path / "out").head_ids == []
    assert main(_ft_args(pruned, pruned, corpus, eval_corpus)) == 2  # never over its own input
    assert "PRUNED_DIR itself" in capsys.readouterr().err


def test_finetune_missing_model_is_one_line(tmp_path, corpus, eval_corpus, capsys):
    assert main(_ft_args(tmp_path / "nope", tmp_path / "out", corpus, eval_corpus)) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
def test_sigkilled_finetune_resumes_to_bit_identical_weights(tiny_dir, corpus, eval_corpus, tmp_path):
    pruned = _prune(tiny_dir, tmp_path / "pruned")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = lambda out: [sys.executable, "-m", "headprune", *_ft_args(pruned, out, corpus, eval_corpus, "--steps", "5",
                                                                    "--checkpoint-every", "2")]
    subprocess.run(cmd(tmp_path / "whole"), env=env, check=True, capture_output=True, timeout=300)
    killed = subprocess.run(cmd(tmp_path / "resumed"), check=False, env={**env, ft.KILL_ENV: "3"}, capture_output=True,
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL and (tmp_path / "resumed.finetune-checkpoint.pt").is_file()
    assert not (tmp_path / "resumed").exists()
    subprocess.run(cmd(tmp_path / "resumed"), env=env, check=True, capture_output=True, timeout=300)
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "resumed" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "resumed.finetune-checkpoint.pt").exists()


# ---------------------------------------------------------------- curve --recover and the report


def test_curve_recover_adds_recovered_points_and_the_report_shows_them(tiny_dir, corpus, eval_corpus, tmp_path, capsys):
    import pandas as pd

    from headprune.io.work.files import read_scores, read_table
    from headprune.pruning.selection import select_heads

    scores, curves, report = tmp_path / "s.csv", tmp_path / "c.csv", tmp_path / "report"
    common = ["--model", str(tiny_dir), "--device", "cpu", "--quiet", "--max-tokens", "400"]
    assert main(["score", *common, "--data", str(corpus), "--methods", "wo_fro", "--out", str(scores)]) == 0
    assert main(["curve", *common, "--data", str(eval_corpus), "--scores", str(scores), "--methods", "wo_fro",
                 "--fractions", "0,0.5", "--seeds", "2", "--recover", "2", "--train-data", str(corpus),
                 "--out", str(curves)]) == 0
    table = read_table(curves)
    rec = table[table.recover_steps == 2]
    assert sorted(table.recover_steps.unique()) == [0, 2] and set(rec.method) == {"wo_fro"} and len(rec) == 2
    # an independent reproduction of the 50% point: prune, fine-tune 2 default steps (seed 0), evaluate
    model = load_model(tiny_dir)
    tok = model_tokenizer(model)
    ids = tokenize_corpus(load_texts(str(eval_corpus)), tok, limit=400)
    pruned = prune_model(model, select_heads(read_scores(scores), "wo_fro", fraction=0.5))
    finetune(pruned, tokenize_corpus(load_texts(str(corpus)), tok), Recipe(steps=2), show_progress=False)
    expected = evaluate(pruned, ids, Windowing(64, 64), progress=False).ppl
    assert float(rec[rec.fraction == 0.5].ppl.iloc[0]) == pytest.approx(expected, rel=1e-9)
    before = table[(table.recover_steps == 0) & (table.method == "wo_fro")]
    assert float(rec[rec.fraction == 0].ppl.iloc[0]) != float(before[before.fraction == 0].ppl.iloc[0])
    capsys.readouterr()
    assert main(["report", "--scores", str(scores), "--curves", str(curves), "--out", str(report)]) == 0
    shown = pd.read_csv(report / "recovery.csv")
    p0 = float(before[before.fraction == 0].ppl.iloc[0])
    p_pruned = float(before[before.fraction == 0.5].ppl.iloc[0])
    share = float(shown[shown.fraction == 0.5].gap_recovered.iloc[0])
    if p_pruned > p0:
        assert share == pytest.approx((p_pruned - expected) / (p_pruned - p0), rel=1e-6)
    else:  # a random-init model can get better by losing heads: no gap to recover
        assert math.isnan(share)
    assert float(shown[shown.fraction == 0.5].ppl_recovered.iloc[0]) == pytest.approx(expected, rel=1e-9)
    assert "Recovery after pruning" in (report / "summary.md").read_text()
    assert (report / "recovery.png").is_file() and len(read_table(report / "curves.csv")) == len(table)
    # the same corpus to train and to evaluate on is refused
    assert main(["curve", *common, "--data", str(eval_corpus), "--scores", str(scores), "--methods", "wo_fro",
                 "--fractions", "0,0.5", "--recover", "2", "--train-data", str(eval_corpus),
                 "--out", str(tmp_path / "c2.csv")]) == 2
    assert "contains the evaluation data" in capsys.readouterr().err and not (tmp_path / "c2.csv").exists()


def test_check_curves_keeps_recovered_rows_apart():
    import pandas as pd

    from headprune.errors import HeadpruneError
    from headprune.schema import CURVE_COLUMNS
    from headprune.table_checks import check_curves

    row = dict.fromkeys(CURVE_COLUMNS, 0.0) | {"method": "grad", "compensation": "none", "fraction": 0.5,
                                              "heads_pruned": 2, "params": 10, "n_seeds": 1, "model_fingerprint": "ab"}
    both = pd.DataFrame([row | {"recover_steps": 5}, row | {"recover_steps": 0}])
    assert check_curves(both).recover_steps.tolist() == [0, 5]
    with pytest.raises(HeadpruneError, match="two rows"):
        check_curves(pd.DataFrame([row | {"recover_steps": 5}, row | {"recover_steps": 5}]))


def test_recovery_table_share_of_the_gap_by_hand():
    import pandas as pd

    from headprune.report.recovery_section import recovery_sentence, recovery_table

    base = {"method": "grad", "compensation": "none", "heads_pruned": 4}
    before = pd.DataFrame([base | {"fraction": 0.0, "ppl": 100.0}, base | {"fraction": 0.5, "ppl": 140.0}])
    rec = pd.DataFrame([base | {"fraction": 0.0, "ppl": 98.0, "recover_steps": 7},
                        base | {"fraction": 0.5, "ppl": 110.0, "recover_steps": 7}])
    table = recovery_table(before, rec, {"ppl": 100.0})
    assert math.isnan(table.gap_recovered[0]) and table.gap_recovered[1] == pytest.approx(30 / 40)
    assert recovery_sentence(table) == ("7 fine-tuning steps recover this share of the perplexity gap at 50% of heads "
                                        "pruned: grad 75%.")
