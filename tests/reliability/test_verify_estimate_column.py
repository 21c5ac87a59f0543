"""``verify --estimate COLUMN`` where the column is not a score (head_id, layer, a bootstrap bound): one line,
before the model loads (issue 52, 3)."""

from __future__ import annotations

import json

import pytest

from headprune.cli.main import main


@pytest.mark.parametrize("column", ["head_id", "layer", "model_fingerprint", "taylor_ci_lo"])
def test_a_column_that_is_not_a_score_is_refused(tiny_dir, corpus, tmp_path, capsys, monkeypatch, column):
    from headprune.cli import verify

    scores = tmp_path / "s.csv"
    rows = [f"{layer},{head},L{layer}H{head},fp,{0.1 * (head + 1)},0.0" for layer in range(2) for head in range(6)]
    scores.write_text("layer,head,head_id,model_fingerprint,taylor,taylor_ci_lo\n" + "\n".join(rows) + "\n")
    monkeypatch.setattr(verify, "load_from_args", lambda *a, **k: pytest.fail("the model loaded"))
    code = main(["verify", "--model", str(tiny_dir), "--data", str(corpus), "--scores", str(scores), "--estimate",
                 column, "--out", str(tmp_path / "v.csv"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"--estimate {column!r} is not a score column of {scores}; its scores are taylor" in err
    assert not (tmp_path / "v.csv").exists()


def test_verify_runs_the_exact_sweep_where_it_is_cheaper(tiny_dir, corpus, tmp_path, capsys):
    """12 heads: a taylor pass, 2 rounds of 2 heads and 8 subsets cost more forwards than ablating every head, so
    verify ablates every head: its exact column is the exact sweep's abl_zero, every head verified, bound 0."""
    import numpy as np

    from headprune.cost import verify_fe
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.loading import load_model
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.io.work.files import read_table
    from headprune.perplexity import Windowing
    from headprune.scoring import ScoringOptions, score_heads

    model = load_model(tiny_dir)
    fe = verify_fe(model, 16, 2, 8)
    assert fe["total"] > fe["sweep"] + 2  # the premise, from the cost model (the sweep plus taylor's own pass)
    out = tmp_path / "v.csv"
    assert main(["verify", "--model", str(tiny_dir), "--data", str(corpus), "--seq-len", "16", "--max-tokens", "64",
                 "--verify", "2", "--bound-subsets", "8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "the exact sweep of every head costs less here than verifying" in printed
    assert "ablated all 12 heads exactly" in printed
    ids = corpus_ids(str(corpus), "validation", model_tokenizer(model), 64)
    want = score_heads(model, ids, ["abl_zero"], windowing=Windowing.resolve(model.cfg.n_positions, 16),
                       options=ScoringOptions(bootstrap=0), show_progress=False).table["abl_zero"].to_numpy()
    got = read_table(out)
    np.testing.assert_allclose(got["exact"], want, rtol=0, atol=1e-12)
    assert got["verified"].all() and got["top"].sum() == 2
    assert set(got.loc[got["top"], "head_id"]) == set(got["head_id"].iloc[np.argsort(-np.abs(want))[:2]])
    summary = json.loads(out.with_suffix(".json").read_text())
    assert (summary["bound"], summary["recall_lower"], summary["verified"], summary["worst"]) == (0.0, 1.0, 12, None)
    assert main(["verify", "--model", str(tiny_dir), "--data", str(corpus), "--seq-len", "16", "--max-tokens", "64",
                 "--verify", "2", "--bound-subsets", "8", "--exact-sweep", "never", "--out", str(out),
                 "--overwrite"]) == 0
    assert "the exact sweep" not in capsys.readouterr().out and not read_table(out)["verified"].all()
