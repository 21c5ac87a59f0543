"""The commands reproduce the report: the `score` + `prune` + `eval` lines a run writes into its settings (every
command reads `run`'s defaults: the same token budget, windows and splits) give the perplexity that the run's
curves table shows for `grad` at 30% of the heads removed, to 1e-6."""

import json
import shlex

import pandas as pd
import pytest

from headprune.cli.main import main
from headprune.report.render import number


@pytest.mark.slow
def test_the_reports_commands_reproduce_its_30_percent_grad_point(tiny_dir, tmp_path, capsys, monkeypatch):
    import pydoc_data.topics

    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    topics = list(pydoc_data.topics.topics.values())
    data, score_data = tmp_path / "eval.txt", tmp_path / "score.txt"
    data.write_text(" ".join(topics[:40]))  # more tokens than the default budget: the cut must be the same
    score_data.write_text(" ".join(topics[40:80]))
    assert main(["run", "--model", str(tiny_dir), "--seq-len", "64", "--quiet", "--data", str(data), "--score-data",
                 str(score_data), "--methods", "grad", "--fractions", "0,0.3", "--seeds", "1", "--bootstrap", "0",
                 "--out", "report"]) == 0
    curves = pd.read_csv(tmp_path / "report" / "curves.csv")
    want = curves.query("method == 'grad' and fraction == 0.3 and compensation == 'none'")["ppl"]
    commands = json.loads((tmp_path / "report" / "settings.json").read_text())["commands"]
    assert (commands["ranking"], commands["fraction"], len(want)) == ("grad", 0.3, 1)
    summary = (tmp_path / "report" / "summary.md").read_text()  # the report shows them, below the curves table
    assert "\n".join(["```bash", *commands["lines"], "```"]) in summary
    assert f"The grad point at 30% (perplexity {number(float(want.iloc[0]))})" in summary
    capsys.readouterr()

    score, prune, evaluate = (shlex.split(line) for line in commands["lines"])
    assert score[:2] == ["headprune", "score"] and main(score[1:]) == 0
    header = capsys.readouterr().out
    assert f"data: {score_data}, 8,192 tokens; windows: seq_len 64, stride 64" in header, header
    assert main(prune[1:]) == 0
    capsys.readouterr()
    assert main([*evaluate[1:], "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokens"] == 8192 // 64 * 63  # the default budget: 128 disjoint windows of 64, 63 predictions each
    assert got["ppl"] == pytest.approx(float(want.iloc[0]), abs=1e-6)
