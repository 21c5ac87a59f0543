"""``headprune context`` on the shipped model (long-window NLL only: it performs no retrieval task): the files it
writes, every sentence of its summary.md recomputed from the tables it cites, the pattern read back by
``eval --pattern`` (= the library's evaluation with the pattern's streaming heads), an interrupted run resumed to
the same tables, and bad input in one line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from context_claims import check_summary

from headprune.cli.main import main
from headprune.context.pattern import read_pattern
from headprune.data.tokens import tokens
from headprune.io.read.loading import load_model
from headprune.io.work.files import read_table
from headprune.models.streaming import streaming
from headprune.perplexity import Windowing, evaluate
from headprune.schema import DEFAULT_MODEL

ARGS = ["context", "--long-task", "none", "--score-windows", "1", "--curve-windows", "2", "--random-seeds", "2",
        "--shares", "0.25,0.5,1", "--bootstrap", "40", "--quiet"]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("context") / "study"
    assert main([*ARGS, "--out", str(out)]) == 0
    return out


def test_files_and_every_sentence(study):
    names = {p.name for p in study.iterdir()}
    assert {"context_scores.csv", "streaming_curve.csv", "streaming_shares.csv", "cross_fit.csv", "points.json",
            "settings.json", "summary.md", "pattern"} <= names
    assert {p.name for p in (study / "pattern").iterdir()} == {"kv_pattern.json", "config.json",
                                                                 "full_attention_heads.tsv"}
    assert check_summary(study) >= 12
    curve = read_table(study / "streaming_curve.csv")
    assert set(curve.ranking) == {"ctx_stream", "ctx_gate", "ctx_retrieval", "random/0", "random/1"}
    assert not (study.parent / "study.progress.jsonl").exists()  # removed once the result is written


def test_eval_reads_the_pattern_back(study, tmp_path, capsys):
    model = load_model(DEFAULT_MODEL)
    pattern = read_pattern(study / "pattern")
    # a pattern that streams something, written where eval reads it
    from headprune.context.pattern import KVPattern, write_pattern

    some = KVPattern(pattern.model_fingerprint, pattern.sink, pattern.recent, pattern.order, 24, pattern.ranking)
    write_pattern(some, model, tmp_path / "p")
    capsys.readouterr()
    assert main(["eval", "--pattern", str(tmp_path / "p"), "--max-tokens", "1024", "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["nll"]
    ids = tokens("default", "test", model, 1024)
    w = Windowing.for_model(model)
    with streaming(model, some.layers(model)):
        expected = evaluate(model, ids, w, progress=False).nll
    plain = evaluate(model, ids, w, progress=False).nll
    assert math.isclose(got, expected, rel_tol=0, abs_tol=1e-9)
    assert abs(got - plain) > 1e-4  # the pattern changed the NLL: the read-back has teeth


def test_resumed_run_gives_the_same_tables(study, tmp_path):
    out = tmp_path / "resumed"
    cmd = [sys.executable, "-m", "headprune", *ARGS, "--out", str(out)]
    env = {**os.environ, "HEADPRUNE_TEST_KILL_AFTER_UNITS": "6"}
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert killed.returncode != 0 and not out.exists()
    progress = tmp_path / "resumed.progress.jsonl"
    assert len(progress.read_text().splitlines()) == 7  # header + 6 units
    subprocess.run(cmd, check=True, capture_output=True)
    for name in ("streaming_curve.csv", "streaming_shares.csv", "cross_fit.csv", "context_scores.csv"):
        pd.testing.assert_frame_equal(read_table(out / name), read_table(study / name))


@pytest.mark.parametrize("extra, message", [
    (["--seq-len", "512"], "longer than the model's context of 256"),
    (["--shares", "0,0.5"], "shares must lie in (0, 1]"),
    (["--window", "300"], "cover the whole context"),
    (["--long-task", "sorting"], "task 'sorting'"),
    (["--methods", "abl_zero"], "context methods are"),
    (["--curve-windows", "1"], "at least 1 scoring window and 2 curve windows"),
])
def test_bad_input_is_one_line(extra, message, tmp_path, capsys):
    assert main([*ARGS, *extra, "--out", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_a_pattern_for_another_model_is_one_line(study, tiny_dir, capsys):
    assert main(["eval", "--model", str(tiny_dir), "--pattern", str(study / "pattern"), "--max-tokens", "64"]) != 0
    err = capsys.readouterr().err.strip()
    assert "made for another model" in err and "\n" not in err



def test_the_task_path(tmp_path, monkeypatch):
    """With a task measured (the shipped model fails recall, so the refusal is lifted here): a point's answers are
    the task run with that point's streaming heads, and every sentence, the accuracy-alone shares and the held-out
    accuracy drops included, is recomputed from the tables."""
    from headprune.context.curve import random_order, streaming_layers
    from headprune.patching import long_tasks
    from headprune.stages.context import ContextSettings, context_probe, load_context

    monkeypatch.setattr(long_tasks, "check_performs", lambda result, min_share=0.5: result)
    out = tmp_path / "task"
    args = [a if a != "none" else "recall" for a in ARGS]
    assert main([*args, "--prompts", "2", "--out", str(out)]) == 0
    assert check_summary(out) >= 16
    result = load_context(out)
    assert set(result.shares.measure) == {"all", "perplexity", "accuracy"} and result.settings["n_prompts"] == 4
    model = load_model(DEFAULT_MODEL)
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in result.settings.items()
              if k in ContextSettings.__dataclass_fields__}
    s = ContextSettings(**fields).resolve(model)
    probe = context_probe(model, s)
    row = result.curve[(result.curve.ranking == "random/1") & (result.curve.n_streaming > 0)].iloc[0]
    streamed = random_order(model, 1)[:int(row.n_streaming)]
    right = long_tasks.run_task(model, long_tasks.LongTask("t", list(probe.prompts)),
                                streaming_layers(model, streamed, s.sink, int(s.recent or 0))).right
    assert result.points[row.point]["right"] == [int(r) for r in right]
