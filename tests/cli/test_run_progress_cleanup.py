"""``headprune run`` removes its progress file once the report is written; its second progress bar says it draws
the compensated curves; each stage, patching included, has a line ``[k/n] stage: ...`` of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from headprune.io.work.progress import Progress
from headprune.pipeline import stage_line, stage_names
from headprune.pruning.curves import bar_label
from headprune.stages.settings import RunSettings

STAGE = re.compile(r"^\[(\d+)/(\d+)\] ([a-z ]+): \S")


def _run(model, corpus, out, tmp_path, **env):
    cmd = [sys.executable, "-m", "headprune", "run", "--model", str(model), "--data", str(corpus), "--score-data",
           str(corpus), "--out", str(out), "--max-tokens", "200", "--batch-size", "2", "--fractions", "0,0.5",
           "--seeds", "2", "--methods", "wo_fro,fluct", "--bootstrap", "0", "--patch-task", "induction",
           "--patch-pairs", "4", "--device", "cpu"]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HEADPRUNE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", **env})


def _progress_files(out):
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".progress"))


def test_run_removes_progress_after_exit_0(tiny_dir, corpus, tmp_path):
    """A finished run leaves no progress file (a killed one keeps it: the SIGKILL tests of
    tests/reliability/test_resume_and_bad_input.py resume from it)."""
    out = tmp_path / "report"
    done = _run(tiny_dir, corpus, out, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "report.html").is_file() and _progress_files(out) == []
    # the bars: the plain curves, then the best method's mean-compensated ones, named as such
    assert "pruning curves (mean-compensated)" in done.stderr and "pruning curves:" in done.stderr
    # every stage on a numbered line of its own, after a line that shows empty (a cleared bar's residue at most)
    lines = done.stderr.splitlines()
    found = [(i, m) for i, line in enumerate(lines) if (m := STAGE.match(line))]
    names = ["ledger", "scoring", "layers", "pruning curves", "patching", "report"]
    assert [(int(m[1]), int(m[2]), m[3]) for _, m in found] == [(k + 1, 6, n) for k, n in enumerate(names)], found
    assert all(lines[i - 1].split("\r")[-1].strip() == "" for i, _ in found)
    assert "the induction task, 4 clean/corrupt prompt pairs" in lines[found[4][0]]


def test_the_stages_follow_the_settings():
    assert stage_names(RunSettings(model="m", learn_gates=True, patch_task="none")) == [
        "ledger", "scoring", "layers", "gates", "pruning curves", "report"]
    assert stage_line(stage_names(RunSettings(model="m")), "patching", "x") == "\n[5/6] patching: x"


def test_bar_label_names_the_compensations():
    assert bar_label([("wo_fro", "none"), ("random", "none")]) == "pruning curves"
    assert bar_label([("grad", "mean")]) == "pruning curves (mean-compensated)"
    assert bar_label([("grad", "mean"), ("grad", "optimal")]) == \
        "pruning curves (mean-compensated, optimal-compensated)"


def test_rank_zero_removes_every_process_file(tmp_path):
    """Under torchrun rank 0 writes the report after gathering every unit: it removes all ranks' files (and
    those of a run with another process count), nothing else."""
    names = [".progress.jsonl.rank1-of-2", ".progress.jsonl", ".progress.jsonl.rank2-of-3", "other.progress.jsonl"]
    for i, name in enumerate(names):
        Progress(tmp_path / name, {"a": 1}).get_or_compute(f"u{i}", lambda: 1.5)
    progress = Progress(tmp_path / ".progress.jsonl.rank0-of-2", {"a": 1}, others=[tmp_path / ".progress.jsonl"])
    assert set(progress.units) == {"u1"}
    progress.get_or_compute("u9", lambda: 2.5)
    progress.remove(every_rank=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.progress.jsonl"]
