"""``--method NAME@layer`` (the name the report and curves give NAME's per-layer L2-normalised ranking) means
``--method NAME --normalize layer`` in prune and curve, and is refused with --normalize/--standardize; ``eval
--quiet`` draws no progress bar (issue 27, item 2)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from headprune.cli.main import main
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.read.loading import load_model

# per layer: global ranking takes L2H0, L0H0, L0H1; per-layer L2-normalised it takes L2H0, L1H0, L0H0
WO = {0: [1.0, 2.0, 3.0, 4.0], 1: [50.0, 200.0, 210.0, 220.0], 2: [0.5, 3.0, 3.5, 4.0]}


@pytest.fixture(scope="module")
def scores_file(tiny_dir, tmp_path_factory):
    fingerprint = model_fingerprint(load_model(tiny_dir))
    rows = [{"layer": l, "head": h, "head_id": f"L{l}H{h}", "wo_fro": v, "model_fingerprint": fingerprint}
            for l, vs in WO.items() for h, v in enumerate(vs)]
    path = tmp_path_factory.mktemp("scores") / "scores.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _hand(normalized: bool, k: int = 3) -> set:
    norms = {l: float(np.sqrt(sum(v * v for v in vs))) if normalized else 1.0 for l, vs in WO.items()}
    values = {(l, h): v / norms[l] for l, vs in WO.items() for h, v in enumerate(vs)}
    return set(sorted(values, key=lambda lh: (values[lh], lh))[:k])


def _removed(out) -> set:
    marker = json.loads((out / "headprune_export.json").read_text())
    return {(int(s[1:s.index("H")]), int(s[s.index("H") + 1:])) for s in marker["removed_heads"]}


def _prune(tiny_dir, scores_file, out, *method) -> int:
    return main(["prune", "--model", str(tiny_dir), "--scores", str(scores_file), *method, "--count", "3",
                 "--out", str(out), "--quiet"])


def test_prune_method_at_layer_is_normalize_layer(tiny_dir, scores_file, tmp_path, capsys):
    assert _hand(True) != _hand(False)
    assert _prune(tiny_dir, scores_file, tmp_path / "at", "--method", "wo_fro@layer") == 0
    assert _prune(tiny_dir, scores_file, tmp_path / "flag", "--method", "wo_fro", "--normalize", "layer") == 0
    assert _prune(tiny_dir, scores_file, tmp_path / "plain", "--method", "wo_fro") == 0
    assert _removed(tmp_path / "at") == _removed(tmp_path / "flag") == _hand(True) == {(2, 0), (1, 0), (0, 0)}
    assert _removed(tmp_path / "plain") == _hand(False)
    # iterative pruning takes the same spelling (one step: the same heads)
    assert main(["prune", "--model", str(tiny_dir), "--scores", str(scores_file), "--method", "wo_fro@layer",
                 "--count", "3", "--iterative", "1", "--out", str(tmp_path / "it"), "--quiet"]) == 0
    assert _removed(tmp_path / "it") == _hand(True)


@pytest.mark.parametrize("extra, named", [(["--normalize", "layer"], "--normalize"),
                                          (["--standardize"], "--standardize")])
def test_at_layer_with_a_normalisation_flag_is_refused(extra, named, tiny_dir, scores_file, tmp_path, capsys):
    capsys.readouterr()
    assert _prune(tiny_dir, scores_file, tmp_path / "p", "--method", "wo_fro@layer", *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("headprune: error: --method wo_fro@layer already normalises") and named in err
    assert err.count("\n") == 1 and not (tmp_path / "p").exists()
    assert _prune(tiny_dir, scores_file, tmp_path / "p", "--method", "random@layer") == 2
    assert "random has no scores to normalise" in capsys.readouterr().err and not (tmp_path / "p").exists()


def test_curve_methods_at_layer(tiny_dir, scores_file, corpus, tmp_path, capsys):
    common = ["curve", "--model", str(tiny_dir), "--data", str(corpus), "--scores", str(scores_file), "--max-tokens",
              "200", "--batch-size", "2", "--fractions", "0,0.25", "--seeds", "1", "--bootstrap", "0", "--quiet"]
    assert main([*common, "--methods", "wo_fro,wo_fro@layer", "--out", str(tmp_path / "a.csv")]) == 0
    assert main([*common, "--methods", "wo_fro", "--normalize", "layer", "--out", str(tmp_path / "b.csv")]) == 0
    a, b = pd.read_csv(tmp_path / "a.csv"), pd.read_csv(tmp_path / "b.csv")
    assert set(a.method) == {"wo_fro", "wo_fro@layer", "random"}
    at = a[(a.method == "wo_fro@layer") & (a.fraction == 0.25)].iloc[0]
    flag = b[(b.method == "wo_fro") & (b.fraction == 0.25)].iloc[0]
    plain = a[(a.method == "wo_fro") & (a.fraction == 0.25)].iloc[0]
    assert at.ppl == flag.ppl and at.ppl != plain.ppl
    capsys.readouterr()
    assert main([*common, "--methods", "wo_fro@layer", "--normalize", "layer", "--out", str(tmp_path / "c.csv")]) == 2
    assert "--methods wo_fro@layer already normalises" in capsys.readouterr().err
    assert main([*common, "--methods", "bogus@layer", "--out", str(tmp_path / "c.csv")]) == 2
    assert "'bogus@layer' is not an importance column" in capsys.readouterr().err and not (tmp_path / "c.csv").exists()


def test_eval_quiet_draws_no_progress_bar(tiny_dir, corpus, capsys):
    args = ["eval", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "300", "--batch-size", "2"]
    capsys.readouterr()
    assert main(args) == 0
    loud = capsys.readouterr()
    assert main([*args, "--quiet"]) == 0
    quiet = capsys.readouterr()
    assert "perplexity" in loud.err and quiet.err == "" and quiet.out == loud.out
