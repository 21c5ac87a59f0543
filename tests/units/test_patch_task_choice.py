"""``run``'s patching task is checked before anything is spent: ``auto`` takes brackets where the model's tokenizer
builds its pairs and induction where not (saying so); an explicit task that cannot be built is refused at once."""

from __future__ import annotations

import pytest

from headprune.cli import main
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.patching import tasks
from headprune.stages.inputs import RunSettings, resolve_patch_task


def _same(pairs, expected):
    """The pairs the run patches are the task's own (same prompts, answers and name)."""
    assert pairs.name == expected.name and len(pairs) == len(expected) == 32
    for field in ("clean", "corrupt", "lengths", "answer", "wrong"):
        assert getattr(pairs, field).equal(getattr(expected, field)), field


def _no_brackets(tokenizer, n_pairs=32, seed=0):
    raise HeadpruneError("brackets: 'f(x' / 'f[x' do not tokenize to equal lengths with one-token answers")


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


def test_auto_is_brackets_where_the_tokenizer_builds_them(model):
    s = RunSettings(model="m")
    assert s.patch_task == "auto"
    pairs, note = resolve_patch_task(s, model, model_tokenizer(model))
    assert note is None and s.patch_task == "brackets"
    _same(pairs, tasks.task_pairs("brackets", model, n_pairs=s.patch_pairs, seed=s.seed))


def test_none_builds_no_pairs(model):
    assert resolve_patch_task(RunSettings(model="m", patch_task="none"), model, None) == (None, None)


def test_auto_falls_back_to_induction_and_says_why(model, monkeypatch):
    monkeypatch.setattr(tasks, "brackets", _no_brackets)
    s = RunSettings(model="m")
    pairs, note = resolve_patch_task(s, model, model_tokenizer(model))
    assert s.patch_task == "induction"
    _same(pairs, tasks.task_pairs("induction", model, n_pairs=s.patch_pairs, seed=s.seed))
    assert note == ("patching task: induction, in place of brackets (brackets: 'f(x' / 'f[x' do not tokenize to "
                    "equal lengths with one-token answers)")


def test_an_explicit_task_that_cannot_be_built_is_refused_before_the_scoring(tiny_dir, corpus, tmp_path, capsys,
                                                                              monkeypatch):
    monkeypatch.setattr(tasks, "brackets", _no_brackets)
    s = RunSettings(model="m", patch_task="brackets")
    with pytest.raises(HeadpruneError, match="--patch-task: brackets: 'f"):
        resolve_patch_task(s, load_model(tiny_dir), None)
    code = main(["run", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "200", "--patch-task",
                 "brackets", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "scoring" not in err and "do not tokenize to equal lengths" in err
    assert len([line for line in err.splitlines() if line.startswith("headprune: error")]) == 1
    assert not (tmp_path / "r" / "scores.csv").exists()
    assert RunSettings(model="m", patch_task="none").patch_task == "none"
