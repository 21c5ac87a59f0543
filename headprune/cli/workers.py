"""Both cores by default: a command whose work is shared out in units (``run``, ``score``, ``curve``, ``verify``)
starts itself again as ``--workers`` single-threaded processes joined by torch.distributed (gloo on localhost) when
it runs on the CPU alone. On 2 cores two single-threaded processes did 1.47x the ablation throughput of one
two-thread process; the outputs are byte-identical to one process' (tests/cli/test_workers.py).

The first process launches the others with ``WORLD_SIZE``/``RANK``/``MASTER_ADDR``/``MASTER_PORT`` set (what torchrun
sets, without torchrun's own logging): rank 0 keeps the terminal, the other ranks' output is dropped unless one
fails alone, and a failing rank stops the others at once, so bad input is still one line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from headprune.errors import HeadpruneError

#: environment variable that sets ``--workers``' default (e.g. 1 in a test suite that reads a command's output
#: in-process)
WORKERS_ENV = "HEADPRUNE_WORKERS"
GRACE_SECONDS = 10  # how long rank 0 may take to fail on its own once another rank failed with an error
STOP_SECONDS = 5  # how long a worker may take to stop once signalled before it is killed


def resolve_workers(requested: str, device: str) -> int:
    """Processes to run: ``requested`` (``auto`` or a count); ``auto`` is this machine's cores (at most 2, the
    measured win) on the CPU, 1 on a GPU, under torchrun (already sharded) or with one core."""
    launched = os.environ.get("WORLD_SIZE") not in (None, "", "1") or any(
        k.startswith("TORCHELASTIC_") or k == "LOCAL_WORLD_SIZE" for k in os.environ)
    if launched:  # under torchrun or another launcher (even of one process): already placed
        return 1
    name = "workers"
    if requested == "auto" and os.environ.get(WORKERS_ENV):
        requested, name = os.environ[WORKERS_ENV], f"environment variable {WORKERS_ENV}="
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if requested == "auto":
        if device != "cpu":
            import torch

            if torch.cuda.is_available():
                return 1
        return max(1, min(2, cores))
    try:
        count = int(requested)
    except ValueError:
        count = 0
    if count < 1:
        raise HeadpruneError(f"{name} {requested!r}: give auto or a whole number of processes, at least 1",
                             "workers" if name == "workers" else None)
    if count > cores:  # single-threaded processes beyond the cores only take turns on them (and hold more memory)
        print(f"headprune: {count} workers on {cores} cores: running {cores} (more only take turns on the cores)",
              file=sys.stderr)
        return cores
    return count


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(procs: list[subprocess.Popen], signum: int) -> None:
    """Send ``signum`` to every running worker, then kill whatever still runs after :data:`STOP_SECONDS`, and reap
    them all: no worker outlives the launcher. Their progress files stay (each unit is written whole)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)
    deadline = time.monotonic() + STOP_SECONDS
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(argv: list[str], workers: int) -> int:
    """Run ``headprune ARGV`` as ``workers`` single-threaded processes (ranks above 0 with ``--quiet``); their exit
    status: 0, or the first failure's, said on one line. SIGINT (Ctrl-C, or sent to this process alone), SIGTERM
    and SIGHUP are passed on to every worker, which stop within :data:`STOP_SECONDS` or are killed; a worker that
    dies stops the others at once. The progress files stay, so the same command resumes."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    logs: list = []
    procs: list[subprocess.Popen] = []

    def stop(signum, _frame):  # a scheduler's or a closed terminal's signal: no worker outlives this process
        _stop(procs, signum)
        print(f"headprune: stopped by {signal.Signals(signum).name}; run the same command again to resume",
              file=sys.stderr)
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for rank in range(workers):
            env = {**base, "WORLD_SIZE": str(workers), "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            log = tempfile.TemporaryFile() if rank else None  # noqa: SIM115 - a quiet rank's stderr
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "headprune", *argv, *(["--quiet"] if rank else [])],
                                          env=env, stdout=subprocess.DEVNULL if rank else None, stderr=log))
        while True:
            codes = [p.poll() for p in procs]  # every process, every time
            if any(c not in (None, 0) for c in codes) or all(c is not None for c in codes):
                break
            time.sleep(0.2)
        return _outcome(procs, logs)
    except KeyboardInterrupt:  # Ctrl-C (the workers had it too) or SIGINT to this process alone: pass it on
        _stop(procs, signal.SIGINT)
        if procs and procs[0].returncode != 130:  # rank 0 did not say how to resume
            print("headprune: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for log in logs:
            if log is not None:
                log.close()


def _outcome(procs: list[subprocess.Popen], logs: list) -> int:
    """Stop the processes still running once one failed (they would wait for it in a collective); the exit status:
    0, or the first failure's, with one line saying why unless rank 0 said it."""
    workers = len(procs)
    if procs[0].poll() is None and any(p.returncode is not None and p.returncode > 0 for p in procs):
        try:  # the same bad input fails every rank: let rank 0 say it, rather than a quiet rank's copy
            procs[0].wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
    failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
    _stop(procs, signal.SIGTERM)  # a killed worker: the others would wait for it in a collective
    if not failed:
        return 0
    first = failed[0]
    code = procs[first].returncode
    said = first == 0 and code > 0  # rank 0 printed its own line (headprune exits 1, 2 or 130 after one)
    if not said:
        line = ""
        if (log := logs[first]) is not None:
            log.seek(0)
            lines = log.read().decode(errors="replace").strip().splitlines()
            line = lines[-1] if lines and lines[-1].startswith("headprune: ") else ""
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        print(line or f"headprune: error: worker {first} of {workers} stopped ({how}); rerun the same command to "
              "resume, or give --workers 1", file=sys.stderr)
    return code if code > 0 else 1  # killed by a signal: a plain failure
