"""``headprune context`` on the shipped model (long-window NLL only: it performs no retrieval task): the files it
writes, every sentence of its summary.md recomputed from the tables it cites, the pattern read back by
``eval --pattern`` (= the library's evaluation with the pattern's streaming heads), an interrupted run resumed to
the same tables, and bad input in one line."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from scipy.stats import spearmanr

from headprune.cli.main import main
from headprune.context.pattern import read_pattern
from headprune.data.tokens import tokens
from headprune.io.read.loading import load_model
from headprune.io.work.files import read_table
from headprune.models.streaming import streaming
from headprune.perplexity import Windowing, evaluate
from headprune.schema import DEFAULT_MODEL
from headprune.stages.context import load_context

ARGS = ["context", "--task", "none", "--score-windows", "1", "--curve-windows", "2", "--random-seeds", "2",
        "--shares", "0.25,0.5,1", "--bootstrap", "40", "--quiet"]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("context") / "study"
    assert main([*ARGS, "--out", str(out)]) == 0
    return out


def pct(x: float) -> str:
    return f"{x:.0%}"


def check_summary(folder: Path) -> int:
    """Every claim of ``folder``/summary.md recomputed from the saved tables; returns how many were checked."""
    r = load_context(folder)
    text = (folder / "summary.md").read_text()
    curve, shares, s = r.curve, r.shares, r.settings
    full = curve[curve.n_streaming == 0].iloc[0]
    checked = 0
    assert f"tail NLL {full.tail_nll:.4f} nats/token on the last {s['tail']} tokens of {s['curve_windows']} " \
           f"windows of {s['seq_len']} tokens" in text
    checked += 1
    blocks = re.findall(r"within (\d+)% of the full model[^\n]*\n((?:- [^\n]*\n)+)", text)
    assert len(blocks) == shares.tolerance.nunique()
    for tol_pct, block in blocks:
        rows = shares[shares.tolerance.round(2) == int(tol_pct) / 100]
        for ranking, share, lo, hi in re.findall(r"- (\w+): (\d+)% \[(\d+)%, (\d+)%\]", block):
            row = rows[rows.ranking == ranking].iloc[0]
            assert (pct(row.share), pct(row.share_lo), pct(row.share_hi)) == (f"{share}%", f"{lo}%", f"{hi}%")
            checked += 1
        band = re.search(r"random orders \((\d+) seeds\): (\d+)% to (\d+)%", block)
        random_rows = rows[rows.ranking.str.startswith("random/")]
        assert band and int(band[1]) == len(random_rows)
        assert (f"{band[2]}%", f"{band[3]}%") == (pct(random_rows.share.min()), pct(random_rows.share.max()))
        checked += 1
    pattern = re.search(r"Pattern: (\S+), (\d+) of (\d+) KV heads streaming", text)
    none = re.search(r"Pattern: no KV head streams \(no ranking's first share, (\d+)%, stays within (\d+)%\)", text)
    if r.pattern.n_streaming:
        assert pattern and (pattern[1], int(pattern[2]), int(pattern[3])) == (
            r.pattern.ranking, r.pattern.n_streaming, s["n_kv_heads"])
    else:  # every ranking's smallest share is outside the tolerance on all the windows
        first = curve[curve.share > 0].groupby("ranking").share.min()
        assert none and none[1] == pct(first.min())[:-1] and int(none[2]) == round(100 * s["tolerance"])
        assert (r.shares[r.shares.tolerance == s["tolerance"]].share == 0).all()
    point = curve[(curve.ranking == r.pattern.ranking) & (curve.n_streaming == r.pattern.n_streaming)].iloc[0]
    for context, before, after in re.findall(r"([\d,]+) tokens ([\d,.]+) MiB → ([\d,.]+) MiB", text):
        column = f"kv_bytes_{context.replace(',', '')}"
        assert (before, after) == (f"{full[column] / 2**20:,.1f}", f"{point[column] / 2**20:,.1f}")
        checked += 1
    folds = r.cross_fit[r.cross_fit.tolerance == s["tolerance"]]
    held = re.findall(r"(\w+) at (\d+)%, held-out ΔNLL ([+-]\d+\.\d+)", text)
    assert len(held) == len(folds)
    for (ranking, share, delta), fold in zip(held, folds.itertuples()):
        assert (ranking, f"{share}%", delta) == (fold.ranking, pct(fold.share), f"{fold.held_out_delta_nll:+.4f}")
        checked += 1
    for method, rho in re.findall(r"(ctx_\w+) ([+-]\d+\.\d+)", text.split("Agreement", 1)[1]):
        assert rho == f"{spearmanr(r.scores[method], r.scores['ctx_stream']).statistic:+.2f}"
        checked += 1
    return checked


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
    (["--task", "sorting"], "task 'sorting'"),
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
