"""Both cores by default: a command whose work is shared out in units (``run``, ``score``, ``curve``, ``verify``)
starts itself again as ``--workers`` single-threaded processes joined by torch.distributed (gloo on localhost) when
it runs on the CPU alone. On 2 cores two single-threaded processes do 1.47x the ablation throughput of one
two-thread process (reports/benchmarks.md); the outputs are byte-identical to one process' (tests/cli).

The first process launches the others with ``WORLD_SIZE``/``RANK``/``MASTER_ADDR``/``MASTER_PORT`` set (what torchrun
sets, without torchrun's own logging): rank 0 keeps the terminal, the other ranks' output is dropped unless one
fails alone, and a failing rank stops the others at once, so bad input is still one line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

from headprune.errors import HeadpruneError

#: environment variable that sets ``--workers``' default (e.g. 1 in a test suite that reads a command's output
#: in-process)
WORKERS_ENV = "HEADPRUNE_WORKERS"
GRACE_SECONDS = 10  # how long rank 0 may take to fail on its own once another rank failed


def resolve_workers(requested: str, device: str) -> int:
    """Processes to run: ``requested`` (``auto`` or a count); ``auto`` is this machine's cores (at most 2, the
    measured win) on the CPU, 1 on a GPU, under torchrun (already sharded) or with one core."""
    if os.environ.get("WORLD_SIZE") not in (None, "", "1"):
        return 1
    if requested == "auto":
        requested = os.environ.get(WORKERS_ENV, "auto")
    if requested == "auto":
        if device != "cpu":
            import torch

            if torch.cuda.is_available():
                return 1
        return max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
    try:
        count = int(requested)
    except ValueError:
        count = 0
    if count < 1:
        raise HeadpruneError(f"workers {requested!r}: give auto or a whole number of processes, at least 1", "workers")
    return count


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(argv: list[str], workers: int) -> int:
    """Run ``headprune ARGV`` as ``workers`` processes; their exit status (rank 0's, or the first failure's)."""
    port, threads = _free_port(), max(1, (os.cpu_count() or workers) // workers)
    logs, procs = [], []
    for rank in range(workers):
        env = {**os.environ, "WORLD_SIZE": str(workers), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(threads)}
        log = tempfile.TemporaryFile() if rank else None  # noqa: SIM115 - a quiet rank's stderr, shown if it fails
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "headprune", *argv], env=env,
                                      stdout=subprocess.DEVNULL if rank else None, stderr=log))
    try:
        while all(p.poll() is None or p.returncode == 0 for p in procs) and any(p.poll() is None for p in procs):
            time.sleep(0.2)
        return _outcome(procs, logs)
    except KeyboardInterrupt:  # the terminal interrupted every process; rank 0 says how to resume
        for p in procs:
            p.wait()
        return 130
    finally:
        for log in logs:
            if log is not None:
                log.close()


def _outcome(procs: list[subprocess.Popen], logs: list) -> int:
    """Stop the processes still running once one failed (they would wait for it in a collective); the exit status:
    0, rank 0's failure (it said why), or a quiet rank's, with its last line."""
    workers = len(procs)
    if procs[0].poll() is None and any(p.returncode not in (None, 0) for p in procs):
        try:  # the same bad input fails every rank: let rank 0 say it, rather than a quiet rank's copy
            procs[0].wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
    failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait()
    if not failed:
        return 0
    if failed[0] and procs[0].returncode in (None, 0, -15):  # a quiet rank failed alone: its last line
        log = logs[failed[0]]
        assert log is not None
        log.seek(0)
        lines = log.read().decode(errors="replace").strip().splitlines()
        print(lines[-1] if lines else f"headprune: error: worker {failed[0]} of {workers} stopped "
              f"(exit status {procs[failed[0]].returncode})", file=sys.stderr)
    code = procs[failed[0]].returncode
    return code if code > 0 else 1  # killed by a signal: a plain failure
