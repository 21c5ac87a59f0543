"""Distributed runs the last hostile run did not reach (issue 52, 7): a rendezvous port already taken, and torchrun's
variables set by a parent job around a plain command: one line naming the address and what to do, within the join
timeout, no traceback, no output."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest


def _score(tiny_dir, corpus, out, **env):
    full = {**os.environ, "OMP_NUM_THREADS": "1", "HEADPRUNE_DIST_TIMEOUT": "3", **env}
    full.pop("HEADPRUNE_WORKERS", None)
    return subprocess.run([sys.executable, "-m", "headprune", "score", "--model", str(tiny_dir), "--data", str(corpus),
                           "--max-tokens", "300", "--methods", "wo_fro", "--out", str(out), "--quiet"],
                          check=False, env=full, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["port taken", "parent job's variables"])
def test_a_rendezvous_that_cannot_happen_is_one_line(case, tiny_dir, corpus, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if case == "parent job's variables":  # a rank of another job's group whose master never comes
            taken.close()
        started = time.monotonic()
        proc = _score(tiny_dir, corpus, tmp_path / "s.csv", HEADPRUNE_CACHE=str(tmp_path / "cache"),
                      WORLD_SIZE="2", RANK="0" if case == "port taken" else "1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"could not join the torch.distributed group at 127.0.0.1:{port}" in err
    assert "unset WORLD_SIZE" in err and ("address already in use" in err) == (case == "port taken")
    assert time.monotonic() - started < 60 and not (tmp_path / "s.csv").exists()
