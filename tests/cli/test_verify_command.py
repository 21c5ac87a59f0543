"""``headprune verify``: its table and summary equal the library's verified ranking on the same estimate, a killed
run resumes to the same table, and bad input is one line before the model loads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from headprune.cli.main import main
from headprune.data.tokens import corpus_ids
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.io.work.files import read_table
from headprune.perplexity import Windowing
from headprune.scoring.verified import Verification, verify_ranking

WINDOW = ["--seq-len", "16", "--stride", "16", "--batch-size", "2", "--max-tokens", "96"]


def _cmd(model, corpus, out, *extra):
    return ["verify", "--model", str(model), "--data", str(corpus), *WINDOW, "--verify", "2", "--bound-subsets",
            "8", "--exact-sweep", "never", "--out", str(out), "--quiet", *extra]


def test_verify_equals_the_library_on_a_scores_file(tiny_dir, corpus, tmp_path, capsys):
    scores = tmp_path / "s.csv"
    assert main(["score", "--model", str(tiny_dir), "--data", str(corpus), *WINDOW, "--methods", "taylor",
                 "--bootstrap", "0", "--out", str(scores), "--quiet", "--json"]) == 0
    capsys.readouterr()
    frame = read_table(scores)
    frame.sample(frac=1.0, random_state=0).to_csv(scores, index=False)  # rows out of head order: read by head
    out = tmp_path / "v.csv"
    assert main(_cmd(tiny_dir, corpus, out, "--scores", str(scores), "--json")) == 0
    summary = json.loads(capsys.readouterr().out)
    model = load_model(tiny_dir)
    ids = corpus_ids(str(corpus), "validation", model_tokenizer(model), 96)
    want = verify_ranking(model, ids, frame["taylor"], verification=Verification(2, 8),
                          windowing=Windowing.resolve(model.cfg.n_positions, 16, 16, 2), show_progress=False)
    got = read_table(out)
    for column in ("estimate", "exact", "sub_estimate", "upper"):
        np.testing.assert_allclose(got[column], want.table[column], rtol=0, atol=1e-9)
    assert summary["bound"] == pytest.approx(want.bound, abs=1e-9) and summary["verified"] == 4  # 2 rounds of 2
    assert summary["top"] == want.top and len(want.top) == 2
    assert json.loads((tmp_path / "v.json").read_text())["recall_lower"] == pytest.approx(want.recall_lower)


@pytest.mark.slow
def test_a_killed_verify_resumes_to_the_same_table(tiny_dir, corpus, tmp_path):
    env = {**os.environ, "HEADPRUNE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    whole, out = tmp_path / "whole.csv", tmp_path / "v.csv"
    run = [sys.executable, "-m", "headprune"]
    subprocess.run(run + _cmd(tiny_dir, corpus, whole), check=True, env=env, capture_output=True, timeout=300)
    killed = subprocess.run(run + _cmd(tiny_dir, corpus, out), check=False, capture_output=True, timeout=300,
                            env={**env, "HEADPRUNE_TEST_KILL_AFTER_UNITS": "3"})
    assert killed.returncode == -signal.SIGKILL and not out.exists()
    progress = tmp_path / "v.csv.progress.jsonl"
    assert len(progress.read_text().splitlines()) == 4  # the header and three units
    subprocess.run(run + _cmd(tiny_dir, corpus, out), check=True, env=env, capture_output=True, timeout=300)
    assert out.read_bytes() == whole.read_bytes() and not progress.exists()


@pytest.mark.parametrize("extra, message", [
    (["--scores", "missing.csv"], "missing.csv"),
    (["--verify", "11"], "--verify 11 of 12 heads"),
    (["--bound-subsets", "4"], "--bound-subsets 4"),
    (["--inclusion", "1.5"], "--inclusion 1.5"),
    (["--estimate", "abl_zero"], "--estimate 'abl_zero'"),
])
def test_bad_input_is_one_line(tiny_dir, corpus, tmp_path, capsys, monkeypatch, extra, message):
    from headprune.cli import verify

    if extra[0] != "--verify":  # refused before the model loads
        monkeypatch.setattr(verify, "load_from_args", lambda *a, **k: pytest.fail("the model loaded"))
    assert main(_cmd(tiny_dir, corpus, tmp_path / "v.csv", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "v.csv").exists()


def test_a_scores_file_without_the_estimate_is_refused(tiny_dir, corpus, tmp_path, capsys):
    scores = tmp_path / "s.csv"
    scores.write_text("layer,head,head_id,model_fingerprint,grad\n0,0,L0H0,x,0.1\n")
    assert main(_cmd(tiny_dir, corpus, tmp_path / "v.csv", "--scores", str(scores))) == 2
    assert "has no column 'taylor'" in capsys.readouterr().err
