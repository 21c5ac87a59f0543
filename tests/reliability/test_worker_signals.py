"""``--workers 2`` stopped from outside (issue 52, 4): SIGINT or SIGTERM to the launching process alone, or kill -9 of
one worker, ends the run within seconds, leaves no worker running, keeps the progress files, and the same command
then resumes to the bytes of an uninterrupted run. Real processes, as a terminal or a job runner would stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _args(tiny_dir, corpus, out):
    return [sys.executable, "-m", "headprune", "score", "--model", str(tiny_dir), "--data", str(corpus),
            "--max-tokens", "2000", "--seq-len", "32", "--batch-size", "1", "--ablation-rows", "2", "--methods",
            "abl_zero,abl_mean", "--bootstrap", "0", "--out", str(out), "--workers", "2", "--device", "cpu", "--quiet"]


def _env(tmp_path):
    env = {**os.environ, "HEADPRUNE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("HEADPRUNE_WORKERS", None)
    return env


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _foreground_sigint() -> None:
    """In the launcher before it starts: SIGINT as a terminal's foreground process has it, default and unblocked. A
    process inherits an ignored or blocked SIGINT (a shell without job control starts background jobs with it
    ignored, and Python keeps an ignored SIGINT): three clean-clone CI runs in the background saw the launcher carry
    on through the SIGINT this test sends (the interrupt test in test_resume_and_bad_input resets it too)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def uninterrupted(tiny_dir, corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("whole")
    out = folder / "s.csv"
    subprocess.run(_args(tiny_dir, corpus, out), check=True, env=_env(folder), capture_output=True, timeout=600)
    return out.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT to the launcher", "SIGTERM to the launcher", "kill -9 of worker 1"])
def test_a_stopped_run_ends_at_once_and_resumes_to_the_same_bytes(how, uninterrupted, tiny_dir, corpus, tmp_path):
    out = tmp_path / "s.csv"
    launcher = subprocess.Popen(_args(tiny_dir, corpus, out), env=_env(tmp_path), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,  # its own group: no
                                preexec_fn=_foreground_sigint)  # noqa: PLW1509
    try:  # terminal passes the signal to the workers, only what this test sends
        deadline = time.monotonic() + 300
        ranks = [tmp_path / f"s.csv.progress.jsonl.rank{r}-of-2" for r in range(2)]
        while not all(p.is_file() and len(p.read_text().splitlines()) >= 4 for p in ranks):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.05)
        workers = _children(launcher.pid)
        assert len(workers) == 2
        sent = time.monotonic()
        if how.startswith("kill"):
            os.kill(max(workers), signal.SIGKILL)  # the later-started worker: rank 1
        else:
            os.kill(launcher.pid, signal.SIGINT if "INT" in how else signal.SIGTERM)
        code = launcher.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if launcher.poll() is None:
            launcher.kill()
    err = launcher.stderr.read()
    assert took < 15, f"{how}: the run took {took:.1f} s to end"
    if not how.startswith("kill"):  # the workers stopped on the signal passed on, not killed after STOP_SECONDS
        from headprune.cli.workers import STOP_SECONDS

        assert took < STOP_SECONDS, f"{how}: the workers were not told ({took:.1f} s)"
    assert code == {"SIGINT": 130, "SIGTERM": 128 + signal.SIGTERM}.get(how.split()[0], 1), err
    assert not [pid for pid in workers if _running(pid)], "a worker outlived the launcher"
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("headprune: ")
    assert "resume" in err.strip().splitlines()[-1]
    assert not out.exists() and all(p.is_file() for p in ranks)
    resumed = subprocess.run(_args(tiny_dir, corpus, out), check=False, env=_env(tmp_path), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert out.read_bytes() == uninterrupted and not any(p.exists() for p in ranks)


def test_more_workers_than_cores_are_capped_with_a_line(monkeypatch, capsys):
    from headprune.cli.workers import resolve_workers

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("HEADPRUNE_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert resolve_workers("2", "cpu") == 2 and capsys.readouterr().err == ""
    assert resolve_workers("16", "cpu") == 2
    assert capsys.readouterr().err.strip() == "headprune: 16 workers on 2 cores: running 2 (more only take turns on " \
                                              "the cores)"
    assert resolve_workers("3", "cpu") == 2 and capsys.readouterr().err.startswith("headprune: 3 workers on 2 cores")
