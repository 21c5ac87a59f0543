"""Issue 26, class 5: option and environment values are checked, and messages name what the user gave."""

from __future__ import annotations

import pytest

from headprune.cli.main import main


def _run(capsys, argv):
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("value", ["1", "5", "39"])
def test_too_few_bootstrap_replicates_are_refused(tiny_dir, corpus, tmp_path, capsys, value):
    code, err = _run(capsys, ["score", "--model", str(tiny_dir), "--data", str(corpus), "--bootstrap", value,
                              "--out", str(tmp_path / "s.csv"), "--device", "cpu"])
    assert code == 2 and f"--bootstrap {value} is too few replicates" in err and "at least 40" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_invalid_dist_timeout_is_named(tiny_dir, corpus, tmp_path, capsys, monkeypatch, value):
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999",
                 "HEADPRUNE_DIST_TIMEOUT": value}.items():
        monkeypatch.setenv(k, v)
    code, err = _run(capsys, ["eval", "--model", str(tiny_dir), "--data", str(corpus), "--device", "cpu"])
    assert code == 2 and f"HEADPRUNE_DIST_TIMEOUT={value}" in err.replace("'", "") and err.count("\n") == 1


def test_iterative_prune_by_gate_says_so_at_once(tiny_dir, tmp_path, capsys):
    import pandas as pd

    from headprune.io.read.fingerprint import model_fingerprint
    from headprune.io.read.loading import load_model

    model = load_model(tiny_dir)
    heads = model.head_ids
    table = pd.DataFrame({"layer": [h[0] for h in heads], "head": [h[1] for h in heads],
                          "head_id": [f"L{h[0]}H{h[1]}" for h in heads], "model_fingerprint": model_fingerprint(model),
                          "gate": [0.1 * i for i in range(len(heads))]})
    table.to_csv(tmp_path / "g.csv", index=False)
    code, err = _run(capsys, ["prune", "--model", str(tiny_dir), "--scores", str(tmp_path / "g.csv"), "--method",
                              "gate", "--count", "4", "--iterative", "2", "--out", str(tmp_path / "p"), "--quiet",
                              "--device", "cpu"])
    assert code == 2 and "gates cannot be re-scored" in err and not (tmp_path / "p").exists()
    assert "unknown scoring method" not in err
