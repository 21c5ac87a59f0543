"""``run`` locates its pick's break between grid points: on the tiny model (whose curves stay under 0.1 nats/token)
with the line lowered, the refined points are there, only for the pick, each equal to ``headprune curve`` measuring
the same ranking at that fraction on the same tokens, and the first screen says where the curve crosses."""

import pandas as pd
import pytest

from headprune.cli.main import main
from headprune.io.work.files import read_scores
from headprune.pruning.selection import ranking_heads
from headprune.report import breaks
from headprune.stages.curves import load_curves

GRID = "0,0.25,0.5,0.75"


def test_run_measures_its_pick_between_grid_points(tiny_dir, corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(breaks, "BREAK_NATS", 0.001)  # the tiny model's curves cross this within the first step
    common = ["--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "400", "--quiet"]
    out = tmp_path / "run"
    assert main(["run", *common, "--score-data", str(corpus), "--out", str(out), "--methods", "wo_fro,grad",
                 "--fractions", GRID, "--seeds", "2", "--patch-task", "none"]) == 0
    curves = pd.read_csv(out / "curves.csv")
    pick = [load_curves(out).choice.pick]
    assert f"{pick[0]} breaks (ΔNLL above 0.001 nats/token" in (out / "summary.md").read_text()
    mine = curves[(curves.method == pick[0]) & (curves.compensation == "none")]
    refined = sorted(set(mine.fraction) - {0.0, 0.25, 0.5, 0.75})
    assert refined and set(curves[curves.method != pick[0]].fraction) <= {0.0, 0.25, 0.5, 0.75}
    scores = read_scores(out / "scores.parquet")
    heads = [len(ranking_heads(scores, pick[0], f)) for f in refined]
    assert heads == sorted(set(heads)) and all(0 < h < 12 for h in heads)  # new head counts, each measured once
    # the same ranking at the same fractions through headprune curve, on the same test tokens
    fractions = ",".join(["0", *(str(f) for f in refined)])
    capsys.readouterr()
    assert main(["curve", *common, "--scores", str(out / "scores.parquet"), "--methods", pick[0], "--fractions",
                 fractions, "--seeds", "1", "--bootstrap", "0", "--out", str(tmp_path / "c.csv")]) == 0
    again = pd.read_csv(tmp_path / "c.csv")
    again = again[again.method == pick[0]].set_index("fraction")
    for f, row in mine.set_index("fraction").loc[refined].iterrows():
        assert row.delta_nll == pytest.approx(again.loc[f, "delta_nll"], abs=1e-9)
        assert row.heads_pruned == again.loc[f, "heads_pruned"]
