"""Recovered curves keep the curve's options (issue class: one settings object travels with the curve into recovery):
the bootstrap setting, the compensation fills and where they came from, and the learned head sets; a gate curve
without compensation names no fill data."""

import math

import pytest
import torch

from headprune.cli.main import main
from headprune.data.sources import load_texts
from headprune.data.tokens import tokenize_corpus
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.perplexity import Windowing, evaluate
from headprune.pruning.curves import pruning_curves
from headprune.pruning.finetune import Recipe, finetune
from headprune.pruning.options import Compensation, CurveOptions, RecoveryData, Selection
from headprune.pruning.prune import prune_model
from headprune.pruning.recovered_curves import recovered_curves
from headprune.scoring import head_means, score_heads


@pytest.fixture(scope="module")
def setup(tiny_dir, corpus):
    model = load_model(tiny_dir)
    ids = tokenize_corpus(load_texts(str(corpus)), model_tokenizer(model), limit=320)
    w = Windowing.resolve(model.cfg.n_positions, 64, 64, 4)
    scores = score_heads(model, ids, ["wo_fro"], windowing=w, show_progress=False).table
    return model, ids, w, scores


def test_recovered_rows_have_the_curves_bootstrap_fills_and_learned_sets(setup):
    model, ids, w, scores = setup
    learned = [(0, 1), (2, 3), (1, 0), (1, 2), (0, 0), (2, 1)]  # a set no scores column ranks (no gate column)
    options = CurveOptions((0.0, 0.5), seeds=2, bootstrap=0, selection=Selection(seed=1), windowing=w,
                           head_sets={("gate", 0.5): learned, ("gate", 0.0): []})
    means = head_means(model, ids, w, show_progress=False)
    compensation = Compensation(means=means, fill_data="the means' corpus, 320 tokens")
    variants = [("wo_fro", "none"), ("wo_fro", "mean"), ("gate", "none"), ("random", "none")]
    recovered = recovered_curves(model, RecoveryData(ids, ids, 2), scores, variants=variants, options=options,
                                 compensation=compensation, show_progress=False)
    assert set(recovered.method) == {"wo_fro", "gate"}  # random is left out
    assert recovered[["delta_nll_ci_lo", "delta_nll_ci_hi"]].isna().all().all()  # --bootstrap 0 holds
    mean_rows = recovered[recovered.compensation == "mean"]
    assert (mean_rows.fill_data == "the means' corpus, 320 tokens").all()
    assert (recovered[recovered.compensation == "none"].fill_data == "").all()
    gate = recovered[(recovered.method == "gate") & (recovered.fraction == 0.5)].iloc[0]
    assert gate.heads_pruned == len(learned)
    # the learned set, pruned, fine-tuned with the curve's seed and evaluated by hand
    pruned = prune_model(model, learned)
    finetune(pruned, ids, Recipe(steps=2, seed=1), show_progress=False)
    assert gate.ppl == pytest.approx(evaluate(pruned, ids, Windowing(64, 64, 4), progress=False).ppl, rel=1e-9)
    # the mean-compensated recovered point starts from the compensated prune
    chosen = sorted(scores.sort_values(["wo_fro", "layer", "head"]).head(6)[["layer", "head"]].itertuples(index=False,
                                                                                                          name=None))
    compensated = prune_model(model, [tuple(h) for h in chosen], {h: means[h] for h in chosen})
    finetune(compensated, ids, Recipe(steps=2, seed=1), show_progress=False)
    row = mean_rows[mean_rows.fraction == 0.5].iloc[0]
    assert row.ppl == pytest.approx(evaluate(compensated, ids, Windowing(64, 64, 4), progress=False).ppl, rel=1e-9)
    with_intervals = pruning_curves(model, ids, scores, variants[:1],
                                    options=CurveOptions((0.5,), bootstrap=5, windowing=w), show_progress=False)
    assert not math.isnan(with_intervals.delta_nll_ci_lo.iloc[0])  # the intervals exist when asked for


def test_a_gate_curve_without_compensation_names_no_fill_data(tiny_dir, corpus, tmp_path, capsys):
    scores, curves = tmp_path / "s.csv", tmp_path / "c.csv"
    common = ["--model", str(tiny_dir), "--quiet", "--max-tokens", "300", "--seq-len", "32", "--batch-size", "4"]
    assert main(["score", *common, "--data", str(corpus), "--methods", "wo_fro", "--out", str(scores)]) == 0
    capsys.readouterr()
    assert main(["curve", *common, "--data", str(corpus), "--score-data", str(corpus), "--scores", str(scores),
                 "--methods", "gate", "--gate-steps", "2", "--fractions", "0,0.5", "--seeds", "1", "--bootstrap", "0",
                 "--out", str(curves)]) == 0
    printed = capsys.readouterr().out
    assert "fills fitted" not in printed and torch.tensor(0).item() == 0
