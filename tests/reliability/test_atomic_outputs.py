"""Atomic writes and the append-only progress file."""

import json

import pandas as pd
import pytest

from headprune.errors import HeadpruneError
from headprune.io.work.files import atomic_path, write_table
from headprune.io.work.progress import Progress


def test_failed_write_leaves_previous_file_and_no_temp(tmp_path):
    target = tmp_path / "t.csv"
    write_table(pd.DataFrame({"a": [1]}), target)
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "a\n1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_progress_resumes_and_drops_a_torn_last_record(tmp_path):
    path = tmp_path / "p.jsonl"
    calls = []
    p = Progress(path, {"x": 1})
    assert p.get_or_compute("a", lambda: calls.append("a") or 0.1 + 0.2) == 0.1 + 0.2
    p.get_or_compute("b", lambda: calls.append("b") or [1.5, 2.5])
    with open(path, "a") as f:
        f.write('{"unit": "c", "val')  # SIGKILL in mid-write
    again = Progress(path, {"x": 1})
    assert again.get_or_compute("a", lambda: calls.append("a2")) == 0.30000000000000004  # floats round-trip exactly
    assert again.get_or_compute("b", lambda: calls.append("b2")) == [1.5, 2.5]
    assert again.get_or_compute("c", lambda: calls.append("c") or "done") == "done"
    assert calls == ["a", "b", "c"]
    assert [json.loads(line).get("unit") for line in path.read_text().splitlines()] == [None, "a", "b", "c"]


def test_progress_of_another_run_is_refused_unless_overwrite(tmp_path):
    path = tmp_path / "p.jsonl"
    Progress(path, {"x": 1}).get_or_compute("a", lambda: 1)
    with pytest.raises(HeadpruneError, match="different run"):
        Progress(path, {"x": 2})
    assert "a" not in Progress(path, {"x": 2}, overwrite=True)


def test_torn_header_starts_afresh(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"fingerpr')
    p = Progress(path, {"x": 1})
    assert "a" not in p and not path.exists()  # the header comes with the first unit
    p.get_or_compute("a", lambda: 1)
    assert json.loads(path.read_text().splitlines()[0])["settings"] == {"x": 1}
