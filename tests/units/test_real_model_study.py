"""The real-model study's sentences (analyses.real_model) against tables built by hand, and the committed study.md
against its own tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyses.real_model import ranking_key
from analyses.study_findings import (
    curve_sentences,
    findings,
    recovery_sentence,
    role_sentences,
    serving_sentence,
    task_sentences,
)

REPORTS = Path(__file__).resolve().parents[2] / "reports"
STUDIES = [REPORTS / name for name in ("smollm2-135m-instruct", "gemma-3-270m")]


def _curve(method: str, fractions, deltas, heads) -> list[dict]:
    return [{"method": method, "compensation": "none", "fraction": f, "delta_nll": d, "heads_pruned": h}
            for f, d, h in zip(fractions, deltas, heads)]


def test_the_break_sentence_names_the_measured_points_around_it():
    curves = pd.DataFrame(_curve("grad", [0.0, 0.1, 0.125, 0.2, 0.5], [0.0, 0.05, 0.09, 0.1000001, 0.4],
                                 [0, 1, 2, 3, 5])
                          + _curve("random", [0.0, 0.1, 0.3, 0.5], [0.0, 0.09, 0.1, 0.1], [0, 1, 3, 5]))
    units = pd.DataFrame(columns=["method", "fraction", "heads_pruned"])
    said = curve_sentences(curves, units, "grad", 10)[0]
    assert "grad between 12.5% and 20% of heads, random not up to 50%." in said  # 0.1 is not above 0.1


def test_roles_rank_against_the_ablation_cost_on_both_corpora():
    """Six heads: the induction scores put L0H0 first and L1H1 second; prose ablation ranks them 6th and 1st, code
    ablation 1st and 6th."""
    ids = ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]
    prose = pd.DataFrame({"head_id": ids, "abl_zero": [0.01, 0.02, 0.03, 0.04, 0.06, 0.05]})
    code = pd.DataFrame({"head_id": ids, "abl_zero": [0.9, 0.5, 0.4, 0.3, 0.1, 0.2]})
    anatomy = pd.DataFrame({"head_id": ids, "induction": [0.9, 0.1, 0.2, 0.3, 0.8, 0.4],
                            "previous_token": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]})
    induction, previous, versus = role_sentences(prose, code, anatomy)
    # top 5 by induction: L0H0 (0.9), L1H1 (0.8), L1H2 (0.4), L1H0 (0.3), L0H2 (0.2)
    assert "L0H0 (0.90), L1H1 (0.80), L1H2 (0.40), L1H0 (0.30) and L0H2 (0.20)" in induction
    assert "rank 6, 1, 2, 3 and 4 of 6 by zero-ablation cost (1 = costliest) on prose and 1, 6, 5, 4 and 3 on code" \
        in induction
    assert "(median ranks 3 and 4)" in induction
    # previous-token increases with the prose cost except the last two, so ρ = 1 - 6·(1+1)/(6·35) = 0.94
    assert "+0.94 [" in previous
    assert "rank-correlate at ρ -1.00" in versus  # code reverses prose exactly
    assert "total over all heads is 0.210 nats/token on prose and 2.400 on code" in versus


def test_ranking_key_follows_the_head_orders_not_the_last_bits():
    scores = pd.DataFrame({"head_id": ["L0H0", "L0H1", "L1H0"], "layer": [0, 0, 1], "head": [0, 1, 0],
                           "abl_zero": [0.3, 0.1, 0.2], "out_norm": [1.0, 2.0, 3.0]})
    key = ranking_key(scores, "out_norm@layer")
    nudged = scores.assign(abl_zero=scores["abl_zero"] * (1 + 1e-7), out_norm=scores["out_norm"] + 1e-6)
    assert ranking_key(nudged, "out_norm@layer") == key
    assert ranking_key(scores.assign(out_norm=[3.0, 2.0, 1.0]), "out_norm@layer") != key
    assert ranking_key(scores.assign(abl_zero=[0.1, 0.3, 0.2]), "out_norm@layer") != key
    assert ranking_key(scores, "abl_zero") != key  # another best ranking


def test_recovery_is_the_share_of_the_gap_won_back():
    rec = pd.DataFrame([{"method": "grad", "fraction": 0.3, "heads_pruned": 81, "steps": 50, "train_tokens": 25600,
                         "ppl_unpruned": 10.0, "ppl_pruned": 20.0, "ppl_distilled": 12.5, "gap_recovered": 0.75},
                        {"method": "grad", "fraction": 0.5, "heads_pruned": 135, "steps": 50, "train_tokens": 25600,
                         "ppl_unpruned": 10.0, "ppl_pruned": 10.0, "ppl_distilled": 10.5, "gap_recovered": np.nan}])
    text = recovery_sentence(rec)
    assert "(50 steps, 25,600 training tokens, grad's prunes)" in text
    assert "at 30% (81 heads) perplexity 10.00 → 20.00, distilled 12.50 (75% of the gap recovered)" in text
    assert "at 50% (135 heads) perplexity 10.00 → 10.00, distilled 10.50 (no gap to recover)" in text
    assert text.endswith("Measured on the test split of the corpus it trained on (the train split), one seed, no "
                         "control (no random prune or unpruned model trained the same way).")


def test_a_speed_up_only_where_the_ranges_separate():
    def row(removed, prefill, lo, hi):
        return {"fraction": removed / 10, "removed": removed, "query_heads": 2, "kv_heads": 1, "parameters": 1e6,
                "ppl": 10.0, "prefill_tokens_per_s": prefill, "prefill_tokens_per_s_min": lo,
                "prefill_tokens_per_s_max": hi, "decode_b32_tokens_per_s": 50.0, "decode_b32_tokens_per_s_min": 45.0,
                "decode_b32_tokens_per_s_max": 55.0}

    text = serving_sentence(pd.DataFrame([row(0, 100, 90, 110), row(2, 130, 111, 140), row(4, 130, 105, 140),
                                          row(6, 80, 70, 89)]))
    parts = text.split("; ")
    assert parts[1].endswith("against unpruned: prefill faster, decode no difference shown (ranges overlap)")
    assert parts[2].endswith("against unpruned: prefill no difference shown (ranges overlap), decode no difference "
                             "shown (ranges overlap)")  # 105 < 110: the ranges overlap though the median is higher
    assert "against unpruned: prefill slower," in parts[3] and "against" not in parts[0]


def test_a_task_is_performed_from_four_in_five_prompts():
    tasks = pd.DataFrame([
        {"task": "induction", "pairs": 32, "accuracy": 0.8, "logit_diff_clean": 3.0, "logit_diff_corrupt": -1.0,
         "performs": True, "note": ""},
        {"task": "brackets", "pairs": 32, "accuracy": 0.78125, "logit_diff_clean": 0.5, "logit_diff_corrupt": -2.0,
         "performs": False, "note": ""},
        {"task": "ioi", "pairs": 0, "accuracy": np.nan, "logit_diff_clean": np.nan, "logit_diff_corrupt": np.nan,
         "performs": False, "note": "names are not one token"}])
    patched = pd.DataFrame({"head_id": ["L1H1", "L2H2", "L3H1", "L4H0"], "patch_z": [-0.5, 0.1, 0.4, 0.2]})
    lines = task_sentences(tasks, {"induction": patched, "brackets": patched})
    assert lines[0] == ("induction: the model performs it: 80% of 32 clean prompts rank the answer above the wrong "
                        "token, logit difference +3.00 clean, -1.00 corrupt; exact patching: L3H1 0.40, L4H0 0.20 and "
                        "L2H2 0.10 of the gap each, the largest of 4 heads (single-head effects need not add up: 0.70 "
                        "together).")
    assert "does not perform it (below 80%): 78%" in lines[1] and "patching" not in lines[1]
    assert lines[2] == "ioi: not run (names are not one token)"


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_the_committed_study_is_its_tables_findings(study: Path):
    if not (study / "study.md").is_file():
        pytest.skip(f"{study.name}'s committed study is not in this checkout")
    text = (study / "study.md").read_text()
    for line in findings(study):
        assert f"- {line}" in text


def test_a_part_is_recomputed_only_when_its_settings_changed(tmp_path):
    import json

    from analyses.real_model import _fresh

    (tmp_path / "part.csv").write_text("a\n1\n")
    assert _fresh(tmp_path, "part", {"seed": 0})  # no record
    (tmp_path / "part.json").write_text(json.dumps({"seed": 0}))
    assert not _fresh(tmp_path, "part", {"seed": 0})
    assert not _fresh(tmp_path, "part", {"seed": 0, "bos": None})  # a key added later, at the old tables' value
    assert _fresh(tmp_path, "part", {"seed": 0, "bos": 2})
    assert _fresh(tmp_path, "part", {"seed": 1})
    (tmp_path / "part.json").write_text(json.dumps({"seed": 0, "old": 1}))
    assert _fresh(tmp_path, "part", {"seed": 0})  # a setting the part no longer has
