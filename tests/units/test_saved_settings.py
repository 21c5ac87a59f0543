"""A finished run's settings read back (headprune.stages.settings.saved_settings), as the studies in analyses/ do to
rebuild the run's inputs through its own stage: every committed run's settings.json gives the RunSettings whose
fields are the ones it lists, and the scoring corpus comes back from the text a run writes for it."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from headprune.errors import HeadpruneError
from headprune.stages.settings import RunSettings, saved_settings, settings_fields, split_text

REPORTS = Path(__file__).resolve().parents[2] / "reports"
RUNS = sorted(p.parent.name for p in REPORTS.glob("*/settings.json"))


@pytest.mark.parametrize("run", RUNS)
def test_committed_runs_read_back(run):
    record = json.loads((REPORTS / run / "settings.json").read_text())
    s = saved_settings(record)
    for key, value in settings_fields(s).items():
        if key == "score_data":
            n_tokens = int(record["score_data"].rsplit(", ", 1)[1].split()[0].replace(",", ""))
            assert split_text(value, "validation", n_tokens) == record["score_data"]
        elif key in record:
            assert value == (tuple(record[key]) if isinstance(record[key], list) else record[key]), key
    assert {"model", "data", "score_data", "seq_len", "max_tokens", "seed", "methods"} <= set(record)
    assert {f.name for f in fields(RunSettings)} - set(record) <= {  # left out, or added after an old run: defaults
        "budget", "learn_gates", "gate_steps", "patch_task", "patch_pairs"}


@pytest.mark.parametrize("corpus", ["default", "code", "my (odd) corpus, v2.txt", "/tmp/a b/c.jsonl"])
def test_the_scoring_corpus_comes_back_from_its_text(corpus):
    record = {"model": "m", "score_data": split_text(corpus, "validation", 12_345)}
    assert record["score_data"].endswith("(validation split), 12,345 tokens")
    assert saved_settings(record).score_data == corpus


def test_settings_not_written_by_run_are_refused():
    with pytest.raises(HeadpruneError, match="not the settings.json of headprune run"):
        saved_settings({"model": "m", "score_data": "default"})
