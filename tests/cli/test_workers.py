"""Both cores by default (headprune.cli.workers): ``--workers 2`` writes the bytes one process writes, bad input is
still one line, a quiet rank's failure is said, and ``auto`` resolves to the cores (at most 2) on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from headprune.cli.workers import resolve_workers
from headprune.errors import HeadpruneError


def _headprune(tmp_path, args, workers):
    env = {**os.environ, "HEADPRUNE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("HEADPRUNE_WORKERS", None)
    return subprocess.run([sys.executable, "-m", "headprune", *args, "--workers", str(workers), "--device", "cpu"],
                          check=False, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_workers_write_what_one_writes(tiny_dir, corpus, tmp_path):
    args = ["score", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "400", "--seq-len", "64",
            "--batch-size", "2", "--ablation-rows", "4", "--methods", "taylor,abl_zero,abl_mean", "--bootstrap", "0"]
    one = _headprune(tmp_path, [*args, "--out", str(tmp_path / "one.csv")], 1)
    two = _headprune(tmp_path, [*args, "--out", str(tmp_path / "two.csv")], 2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    assert (tmp_path / "two.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()
    assert two.stdout.count("scored 12 heads") == 1  # rank 0 alone speaks
    assert not list(tmp_path.glob("*.progress.jsonl*"))


@pytest.mark.slow
def test_two_workers_rank_what_one_ranks(tiny_dir, corpus, tmp_path):
    """rank's rounds share their units between the workers, and every worker takes the same decisions."""
    args = ["rank", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "640", "--seq-len", "16",
            "--batch-size", "4", "--first-windows", "4", "--top", "3", "--quiet"]
    one = _headprune(tmp_path, [*args, "--out", str(tmp_path / "one.csv")], 1)
    two = _headprune(tmp_path, [*args, "--out", str(tmp_path / "two.csv")], 2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    assert (tmp_path / "two.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()
    assert two.stdout.count("certified in the top 3") == 1  # rank 0 alone speaks
    assert not list(tmp_path.glob("*.progress.jsonl*"))


@pytest.mark.slow
def test_bad_input_with_two_workers_is_one_line(tiny_dir, tmp_path):
    proc = _headprune(tmp_path, ["score", "--model", str(tiny_dir), "--methods", "nonsense", "--out",
                                 str(tmp_path / "s.csv")], 2)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "nonsense" in proc.stderr
    assert not (tmp_path / "s.csv").exists()


def test_auto_is_the_cores_on_the_cpu(monkeypatch):
    monkeypatch.delenv("HEADPRUNE_WORKERS", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert resolve_workers("auto", "cpu") == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert resolve_workers("auto", "cpu") == 1
    assert resolve_workers("3", "cpu") == 1  # capped at the cores (issue 52): said on one line
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert resolve_workers("3", "cpu") == 3 and resolve_workers("9", "cpu") == 4
    monkeypatch.setenv("HEADPRUNE_WORKERS", "1")
    assert resolve_workers("auto", "cpu") == 1 and resolve_workers("2", "cpu") == 2  # the option wins
    monkeypatch.setenv("WORLD_SIZE", "4")  # under torchrun: already sharded
    assert resolve_workers("2", "cpu") == 1


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_impossible_worker_counts_are_refused(value, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(HeadpruneError, match=f"workers '{value}'"):
        resolve_workers(value, "cpu")
