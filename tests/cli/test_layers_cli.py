"""``run``'s layers stage and ``headprune layers``: the run writes layers.csv (each layer's heads removed together on
its validation and test tokens), equal to ``layer_ablation`` on the tokens the run read; the report says the layer
sentences from it; ``headprune layers`` on a run folder without it (as an older run left it) measures the same table
and re-renders the same report; bad input is one line."""

from __future__ import annotations

import pandas as pd
import pytest

from headprune.cli.main import main
from headprune.report.layers import LAYERS_FILE, layer_answer, layer_finding
from headprune.report.layers_section import SECTION_TITLE
from headprune.scoring import ScoringOptions
from headprune.scoring.layers import layer_ablation
from headprune.stages.inputs import reload_inputs


@pytest.fixture(scope="module")
def run_dir(tiny_dir, tmp_path_factory):
    """The default corpus: its validation and test splits are different text (a file's would be the same)."""
    out = tmp_path_factory.mktemp("run") / "report"
    assert main(["run", "--model", str(tiny_dir), "--data", "default", "--score-data", "default", "--out",
                 str(out), "--max-tokens", "300", "--seq-len", "32", "--batch-size", "2", "--fractions", "0,0.5",
                 "--seeds", "2", "--methods", "abl_zero,wo_fro", "--bootstrap", "50", "--patch-task", "none",
                 "--quiet"]) == 0
    return out


def test_run_writes_the_layers_of_its_own_tokens(run_dir):
    layers = pd.read_csv(run_dir / LAYERS_FILE)
    _, s, inputs = reload_inputs(run_dir)
    for split, ids in (("validation", inputs.score_ids), ("test", inputs.eval_ids)):
        want = layer_ablation(inputs.model, ids, inputs.windowing, options=ScoringOptions(bootstrap=50, seed=s.seed),
                              show_progress=False)
        got = layers[layers["split"] == split].drop(columns="split").reset_index(drop=True)
        pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-9)
    assert not inputs.score_ids[:100].equal(inputs.eval_ids[:100])  # two splits, not one text twice
    assert set(layers["split"]) == {"validation", "test"} and len(layers) == 2 * inputs.model.cfg.n_layers


def test_the_report_says_the_layer_sentences_of_its_table(run_dir):
    layers = pd.read_csv(run_dir / LAYERS_FILE)
    scores = pd.read_csv(run_dir / "scores.csv")
    summary = (run_dir / "summary.md").read_text()
    assert f"> - {layer_finding(layers, scores)}" in summary
    assert layer_answer(layers) in summary and f"## {SECTION_TITLE}" in summary
    assert "a sum of single ablations: the layer's heads were not removed together" not in summary


def test_layers_command_fills_an_older_run_folder(run_dir, tmp_path, capsys):
    import shutil

    older = tmp_path / "older"
    shutil.copytree(run_dir, older)
    (older / LAYERS_FILE).unlink()  # as a run before the layers stage left it, its report re-rendered
    assert main(["report", "--scores", str(older / "scores.parquet"), "--curves", str(older / "curves.parquet"),
                 "--out", str(older)]) == 0
    assert "a sum of single ablations" in (older / "summary.md").read_text()
    assert main(["layers", "--out", str(older)]) == 0
    assert "estimated time" in capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_csv(older / LAYERS_FILE), pd.read_csv(run_dir / LAYERS_FILE))
    assert (older / "summary.md").read_text() == (run_dir / "summary.md").read_text()
    assert not [p for p in older.iterdir() if p.name.startswith(".layers-progress")]


def test_layers_command_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["layers", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not the output folder of headprune run" in err[0]


def test_a_folder_without_run_settings_is_one_line(run_dir, tmp_path, capsys):
    import json
    import shutil

    for name in ("scores.parquet", "curves.parquet"):
        shutil.copy(run_dir / name, tmp_path / name)
    assert main(["layers", "--out", str(tmp_path)]) == 2
    assert "holds no settings.json" in capsys.readouterr().err
    record = json.loads((run_dir / "settings.json").read_text())
    del record["model"]
    (tmp_path / "settings.json").write_text(json.dumps(record))
    assert main(["layers", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not the settings of headprune run" in err[0]


@pytest.mark.parametrize("change, message", [
    (lambda t: t.assign(n_heads=t["n_heads"].astype(str).str.replace("4", "four")), "column n_heads must hold numbers"),
    (lambda t: t.assign(n_heads=t["n_heads"] + 1), "does not match the scores"),
    (lambda t: t.assign(abl_layer="x"), "column abl_layer must hold numbers"),
    (lambda t: t.assign(abl_layer=float("nan")), "column abl_layer must hold finite numbers"),
    (lambda t: t.assign(windows=t["windows"] + 0.5), "column windows must hold integers >= 0"),
    (lambda t: t[t["split"] == "test"], "once on the validation and once on the test"),
])
def test_a_broken_layers_table_is_one_line_and_leaves_the_report(run_dir, tmp_path, capsys, change, message):
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(run_dir, folder)
    change(pd.read_csv(folder / LAYERS_FILE)).to_csv(folder / LAYERS_FILE, index=False)
    before = (folder / "summary.md").read_bytes()
    assert main(["report", "--scores", str(folder / "scores.csv"), "--curves", str(folder / "curves.csv"), "--out",
                 str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert (folder / "summary.md").read_bytes() == before
