"""Issue 38, degenerate patching inputs beyond the zero gap: a pair file (one line on stderr naming the problem,
exit 2, nothing written) and pairs or options built in Python (a HeadpruneError naming the bad value, before any
patched forward)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from headprune.cli.main import main
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.patching import exact
from headprune.patching.pairs import PromptPairs
from headprune.patching.study import StudyOptions, patch_study

GOOD = {"clean_ids": [1, 2, 3], "corrupt_ids": [4, 5, 6], "answer_id": 7, "wrong_id": 8}
OTHER = {"clean_ids": [9, 2, 3], "corrupt_ids": [4, 5, 10], "answer_id": 7, "wrong_id": 8}


def line(**edit) -> str:
    return json.dumps({**GOOD, **edit})


FILES = {  # id: (the file's lines, the refusal's words)
    "empty file": ([], "holds no prompt pairs"),
    "blank lines only": (["", "  "], "holds no prompt pairs"),
    "lengths differ": ([json.dumps(OTHER), line(corrupt_ids=[4, 5])], "line 2: the clean prompt is 3 tokens"),
    "answer out of vocabulary": ([line(answer_id=50257)], "line 1: answer_id holds a token id outside"),
    "wrong negative": ([line(wrong_id=-1)], "line 1: wrong_id holds a token id outside"),
    "answer not one id": ([line(answer_id=[7, 8])], "line 1: answer_id must be"),
    "duplicate pair": ([line(), json.dumps(OTHER), line()], "lines 1 and 3 hold the same pair"),
    "longer than the positions": ([line(clean_ids=[1] * 65, corrupt_ids=[2] * 65)],
                                  "a prompt has 65 tokens, more than the model's 64 positions"),
    "answer and wrong the same": ([line(wrong_id=7), json.dumps({**OTHER, "wrong_id": 7})], "gap 0 in every pair"),
}


@pytest.mark.parametrize("lines, words", FILES.values(), ids=FILES.keys())
def test_a_degenerate_pair_file_is_one_line(tiny_dir, tmp_path, capsys, monkeypatch, lines, words):
    """Refused before any patched forward (the exact sweep is never entered), with nothing written."""
    def no_sweep(*args, **kwargs):
        raise AssertionError("the exact patching ran")

    monkeypatch.setattr("headprune.patching.study.patch", no_sweep)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(f"{row}\n" for row in lines))
    out = tmp_path / "patch.csv"
    assert main(["patch", "--model", str(tiny_dir), "--pairs", str(pairs), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("headprune: error:") and words in err[0], err
    assert not list(tmp_path.glob("patch*"))


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


def pairs(**edit) -> PromptPairs:
    fields = {"clean": [[5, 6, 7, 8], [9, 10, 11, 12]], "corrupt": [[5, 6, 17, 8], [9, 10, 21, 12]],
              "lengths": [4, 4], "answer": [30, 31], "wrong": [40, 41], **edit}
    return PromptPairs(**{k: torch.as_tensor(v) for k, v in fields.items()})


BUILT = {  # id: (the pairs' edit, the refusal's words)
    "no pairs": ({"clean": torch.zeros(0, 4, dtype=torch.long), "corrupt": torch.zeros(0, 4, dtype=torch.long),
                  "lengths": [], "answer": [], "wrong": []}, "no prompt pairs"),
    "1-D prompts": ({"clean": [5, 6, 7, 8], "corrupt": [5, 6, 17, 8]}, "must be \\(pairs, tokens\\) tensors"),
    "a length past the tokens": ({"lengths": [5, 4]}, "length 4..5 lies outside 1..4"),
    "a length 0": ({"lengths": [0, 4]}, "length 0..4 lies outside 1..4"),
    "one answer for two pairs": ({"answer": [30]}, "answer has shape \\(1,\\); it must hold one entry for each"),
    "clean and corrupt shapes differ": ({"corrupt": [[5, 6, 17], [9, 10, 21]]}, "clean \\(2, 4\\) and corrupt"),
    "float token ids": ({"clean": [[5.0, 6, 7, 8], [9, 10, 11, 12]]}, "clean must hold integers"),
    "answer out of vocabulary": ({"answer": [50257, 31]}, "an answer id lies outside the model's vocabulary"),
    "token out of vocabulary": ({"clean": [[5, 6, 7, 50257], [9, 10, 11, 12]]}, "a token id lies outside"),
}


@pytest.mark.parametrize("edit, words", BUILT.values(), ids=BUILT.keys())
def test_pairs_built_in_python_that_do_not_hold_together(model, edit, words):
    with pytest.raises(HeadpruneError, match=words):
        patch_study(model, pairs(**edit), StudyOptions(bootstrap=0))


OPTIONS = {  # id: (StudyOptions fields, the refusal's words)
    "bootstrap 1": ({"bootstrap": 1}, "bootstrap 1: give 0"),
    "bootstrap negative": ({"bootstrap": -5}, "bootstrap -5: give 0"),
    "seed negative": ({"seed": -1}, "seed -1 must be a whole number"),
    "rows 0": ({"rows": 0}, "rows 0 must be a whole number ≥ 1"),
    "verify negative": ({"verify": -1, "bound_subsets": 0}, "verify -1 must be a whole number of heads"),
    "an unknown activation": ({"activations": ("zz",)}, "activation 'zz' is not one of"),
    "an unknown approximation": ({"approximations": ("atp2",)}, "approximation 'atp2' is not one of"),
    "an unknown metric": ({"metric": "bogus"}, "unknown metric 'bogus'"),
}


@pytest.mark.parametrize("fields, words", OPTIONS.values(), ids=OPTIONS.keys())
def test_study_options_out_of_range(model, monkeypatch, fields, words):
    def no_run(*args, **kwargs):
        raise AssertionError("the pairs were run")

    monkeypatch.setattr("headprune.patching.study.run_pairs", no_run)
    with pytest.raises(HeadpruneError, match=words):
        patch_study(model, pairs(), StudyOptions(**fields))


def test_patch_refuses_an_unknown_activation_name(model):
    with pytest.raises(HeadpruneError, match="unknown activation 'Z'; choose from z, q, k, v, pattern"):
        exact.patch(model, pairs(), "Z")


def test_a_model_whose_logits_are_nan_is_refused_before_the_sweep(model, monkeypatch):
    """A NaN metric (here: one NaN gain in the final norm) would give NaN effects and an arbitrary ranking."""
    def no_sweep(*args, **kwargs):
        raise AssertionError("the exact patching ran")

    monkeypatch.setattr("headprune.patching.study.patch", no_sweep)
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.ln_f.weight[0] = float("nan")
    with pytest.raises(HeadpruneError, match="the clean run's logit_diff is nan in pair 0"):
        patch_study(broken, pairs(), StudyOptions(bootstrap=0))
