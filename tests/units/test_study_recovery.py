"""The study's distillation against its controls (analyses.study_recovery): the intervals by hand, each sentence and
status against a table built by hand, and the arms trained on a tiny model (heads, determinism, resume)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analyses.study_recovery import (
    RANDOM,
    RANKING,
    UNPRUNED,
    arms,
    difference,
    distill_arm,
    recovery_sentences,
    recovery_table,
    summarise,
)
from analyses.study_status import CERTIFIED, CONTESTED, REFUTED, distillation

T2 = 4.302652729911275  # Student's t, 97.5%, 2 degrees of freedom
Z = 1.959963984540054  # the normal 97.5% quantile


def _rows(arm: str, fraction: float, nlls, corpus: str = "default", pruned: float = 2.0, se: float = 0.05,
          heads: int = 6) -> list[dict]:
    return [{"arm": arm, "method": {RANKING: "grad", RANDOM: "random"}.get(arm, "none"), "fraction": fraction,
             "seed": k, "measured_on": corpus, "heads_pruned": heads if arm != UNPRUNED else 0,
             "nll_pruned": pruned if arm != UNPRUNED else 0.5, "nll_distilled": x, "nll_distilled_se": se,
             "steps": 50, "train_tokens": 25600, "nll_unpruned": 0.5, "seconds": 1.0} for k, x in enumerate(nlls)]


def _table(random_nlls=(1.5, 1.6, 1.7)) -> pd.DataFrame:
    t = pd.DataFrame(_rows(RANKING, 0.3, (1.0, 1.1, 1.2)) + _rows(RANDOM, 0.3, random_nlls, pruned=2.5)
                     + _rows(RANKING, 0.3, (1.0, 1.1, 1.2), corpus="code") + _rows(RANDOM, 0.3, random_nlls,
                                                                                     corpus="code", pruned=2.5)
                     + _rows(UNPRUNED, 0.0, (0.49, 0.5, 0.51)) + _rows(UNPRUNED, 0.0, (0.5, 0.5, 0.5), corpus="code"))
    for c in ("unpruned", "pruned", "distilled"):
        t[f"ppl_{c}"] = np.exp(t[f"nll_{c}"])
    return t


def test_an_arms_interval_holds_the_seeds_spread_and_the_window_noise():
    s = summarise(_table(), RANKING, 0.3, "default")
    half = math.sqrt(T2**2 * 0.01 / 3 + Z**2 * 0.05**2)  # s² = 0.01 over 3 seeds; se 0.05, the same windows in each
    assert s.ppl == pytest.approx((math.exp(1.1), math.exp(1.1 - half), math.exp(1.1 + half)), rel=1e-9)
    p0, pp = math.exp(0.5), math.exp(2.0)
    assert s.gap == pytest.approx(tuple((pp - x) / (pp - p0) for x in (math.exp(1.1), math.exp(1.1 + half),
                                                                       math.exp(1.1 - half))), rel=1e-9)
    d = difference(s, summarise(_table(), RANDOM, 0.3, "default"))
    both = math.sqrt(T2**2 * 2 * 0.01 / 3 + Z**2 * 2 * 0.05**2)
    assert d == pytest.approx((-0.5, -0.5 - both, -0.5 + both), rel=1e-9)
    assert summarise(_table(), RANKING, 0.5, "default") is None


def test_the_sentences_state_each_arm_and_the_verdict_from_the_interval():
    lines = recovery_sentences(_table())
    assert lines[0].startswith("Distillation from the unpruned model (50 steps, 25,600 training tokens of the default "
                               "corpus' train split, 3 seeds each)")
    half = math.sqrt(T2**2 * 0.01 / 3 + Z**2 * 0.05**2)
    both = math.sqrt(T2**2 * 2 * 0.01 / 3 + Z**2 * 2 * 0.05**2)
    p0, pp = math.exp(0.5), math.exp(2.0)
    g = [(pp - x) / (pp - p0) for x in (math.exp(1.1), math.exp(1.1 + half), math.exp(1.1 - half))]
    assert lines[1] == (
        f"At 30% (6 heads), on the default corpus' test split (other text of the corpus it trained on): grad's prune "
        f"{pp:.2f} → {math.exp(1.1):.2f} [{math.exp(1.1 - half):.2f}, {math.exp(1.1 + half):.2f}] ({g[0]:.0%} "
        f"[{g[1]:.0%}, {g[2]:.0%}] of the gap won back; seeds {math.exp(1.0):.2f}–{math.exp(1.2):.2f}); random prunes "
        f"{math.exp(2.5):.2f} → {math.exp(1.6):.2f} [{math.exp(1.6 - half):.2f}, {math.exp(1.6 + half):.2f}] "
        f"({(math.exp(2.5) - math.exp(1.6)) / (math.exp(2.5) - p0):.0%} "
        f"[{(math.exp(2.5) - math.exp(1.6 + half)) / (math.exp(2.5) - p0):.0%}, "
        f"{(math.exp(2.5) - math.exp(1.6 - half)) / (math.exp(2.5) - p0):.0%}] of the gap won back; seeds "
        f"{math.exp(1.5):.2f}–{math.exp(1.7):.2f}). Distilled, grad's prune ends below the random prunes' (ΔNLL "
        f"-0.500 [{-0.5 - both:+.3f}, {-0.5 + both:+.3f}] nats/token).")
    assert "the code corpus' test split (a corpus it never trained on)" in lines[2]
    assert lines[3].startswith("The unpruned model trained the same way") and f"{p0:.2f} → {p0:.2f}" in lines[3]
    close = recovery_sentences(_table(random_nlls=(1.3, 1.4, 1.5)))[1]
    assert "grad's prune is not told apart from the random prunes'" in close  # -0.3 ± 0.465
    above = recovery_sentences(_table(random_nlls=(0.4, 0.5, 0.6)))[1]
    assert "grad's prune ends above the random prunes'" in above


def test_the_status_rows_follow_the_intervals():
    most, below = distillation(_table())
    assert most.finding == "distillation wins back most of grad's gap at 30%" and most.status == CERTIFIED
    assert below.finding == "distilled, grad's prune ends below a random prune at 30%" and below.status == CERTIFIED
    assert distillation(_table(random_nlls=(1.3, 1.4, 1.5)))[1].status == CONTESTED
    assert distillation(_table(random_nlls=(0.4, 0.5, 0.6)))[1].status == REFUTED
    weak = _table()
    weak.loc[weak["arm"] == RANKING, "nll_distilled"] += 0.9  # 2.0 ± 0.33 of a gap from 2.0 to 0.5: under 36% won back
    assert distillation(weak)[0].status == REFUTED
    half = _table()
    half.loc[(half["arm"] == RANKING) & (half["measured_on"] == "code"), "nll_distilled"] += 0.55
    assert distillation(half)[0].status == CONTESTED  # most on one corpus, not on the other
    old = pd.DataFrame([{"method": "grad", "fraction": 0.3, "gap_recovered": 0.7}])
    assert [s.status for s in distillation(old)] == [CONTESTED]


# --- the arms on a tiny model ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tiny_dir, corpus):
    from headprune.data.sources import load_texts
    from headprune.data.tokens import tokenize_corpus
    from headprune.io.read.loading import load_model
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.perplexity import Windowing

    model = load_model(tiny_dir)
    ids = tokenize_corpus(load_texts(str(corpus)), model_tokenizer(model))
    return model, ids[:600], {"a": ids[600:900], "b": ids[900:1200]}, Windowing.for_model(model, seq_len=16)


def _scores(model) -> pd.DataFrame:
    n = model.cfg.n_heads
    return pd.DataFrame([{"layer": layer, "head": h, "head_id": f"L{layer}H{h}", "grad": float((7 * layer + 3 * h) % 5)}
                         for layer in range(model.cfg.n_layers) for h in range(n)])


def test_the_arms_prune_the_rankings_heads_random_ones_as_many_and_none(tiny):
    from headprune.pruning.selection import select_heads

    model = tiny[0]
    scores = _scores(model)
    todo = arms(scores, "grad", seed=5, seeds=3, fractions=(0.5,))
    ranking = [a for a in todo if a.kind == RANKING]
    drawn = [a for a in todo if a.kind == RANDOM]
    assert [a.seed for a in ranking] == [5, 6, 7] == [a.seed for a in drawn]
    assert {a.heads for a in ranking} == {tuple(select_heads(scores, "grad", fraction=0.5))}
    assert all(len(a.heads) == 6 for a in drawn) and len({a.heads for a in drawn}) == 3
    assert [(a.kind, a.heads) for a in todo[-3:]] == [(UNPRUNED, ())] * 3
    assert arms(scores, "grad", seed=5, seeds=3, fractions=(0.5,)) == todo  # drawn from the seed alone


def test_a_distilled_arm_is_measured_as_an_independent_evaluation_and_resumes(tiny, tmp_path):
    from headprune.io.work.progress import Progress
    from headprune.perplexity import evaluate
    from headprune.pruning.prune import prune_model

    model, train, evals, w = tiny
    todo = [a for a in arms(_scores(model), "grad", seed=0, seeds=2, fractions=(0.5,)) if a.kind != RANDOM]
    rows = distill_arm(model, todo[0], train, evals, w, steps=3)
    pruned = prune_model(model, list(todo[0].heads))
    for r in rows:  # before training: the pruned model as evaluate measures it here
        assert r["nll_pruned"] == pytest.approx(evaluate(pruned, evals[r["measured_on"]], w, progress=False).nll,
                                                abs=1e-6)
        assert abs(r["nll_distilled"] - r["nll_pruned"]) > 1e-4  # the three steps moved it
    again = distill_arm(model, todo[0], train, evals, w, steps=3)
    assert [r | {"seconds": 0} for r in again] == [r | {"seconds": 0} for r in rows]  # deterministic under its seed
    other = distill_arm(model, todo[1], train, evals, w, steps=3)
    assert other[0]["nll_distilled"] != rows[0]["nll_distilled"]  # another seed, other batches

    calls = []

    def run_with(progress, stop_after=None):
        def run_arm(arm):
            def compute():
                if stop_after is not None and len(calls) == stop_after:
                    raise KeyboardInterrupt
                calls.append(arm.unit)
                return distill_arm(model, arm, train, evals, w, steps=3)
            return progress.get_or_compute(arm.unit, compute)
        return recovery_table(model, "grad", todo, evals, w, 3, run_arm)

    path = tmp_path / "p.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_with(Progress(path, {"k": 1}), stop_after=2)
    table = run_with(Progress(path, {"k": 1}))
    assert calls == [a.unit for a in todo]  # each arm trained once over the interrupted run and its resume
    whole = recovery_table(model, "grad", todo, evals, w, 3, lambda a: distill_arm(model, a, train, evals, w, 3))
    cols = ["arm", "fraction", "seed", "measured_on", "nll_pruned", "nll_distilled", "gap_recovered"]
    pd.testing.assert_frame_equal(table[cols], whole[cols])
    assert (table.loc[table["arm"] == UNPRUNED, "heads_pruned"] == 0).all()
