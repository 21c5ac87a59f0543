"""``verify --estimate COLUMN`` where the column is not a score (head_id, layer, a bootstrap bound): one line,
before the model loads (issue 52, 3)."""

from __future__ import annotations

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


def test_verify_says_when_the_exact_sweep_is_cheaper(tiny_dir, corpus, tmp_path, capsys):
    """12 heads: a taylor pass, 2 rounds of 2 heads and 8 subsets cost more forwards than ablating every head."""
    from headprune.cost import verify_fe
    from headprune.io.read.loading import load_model

    fe = verify_fe(load_model(tiny_dir), 16, 2, 8)
    assert fe["total"] > fe["sweep"]  # the premise, from the cost model
    assert main(["verify", "--model", str(tiny_dir), "--data", str(corpus), "--seq-len", "16", "--max-tokens", "64",
                 "--verify", "2", "--bound-subsets", "8", "--out", str(tmp_path / "v.csv"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert (f"note: on this model the exact sweep ({fe['sweep']:.0f} forward passes' worth) costs less than "
            f"verifying ({fe['total']:.0f}); headprune score --methods abl_zero") in out
