"""Sharding sweeps across processes and machines with torch.distributed.

Launched with ``torchrun [--nnodes M ...] --nproc-per-node N -m headprune score|curve|run ...``, the units of
work not yet done are shared among the processes by cost (:func:`assign_units`: longest first, each to the
least loaded rank), every process records its units in its own progress file, and the results are exchanged
with ``all_gather_object``; each process then aggregates all units in the same fixed order, so the output equals
a single-process run's. Only rank 0 writes outputs and prints.

Failures are bounded: every process beats a heartbeat in the rendezvous store each second and watches the
others'; a process whose peer has been silent for ``HEADPRUNE_DIST_TIMEOUT`` seconds (default 60) stops with
one line naming it, instead of waiting forever in a collective. A rerun resumes from every progress file,
those of a run with another number of processes included.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import heapq
import os
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from headprune.errors import HeadpruneError

#: Seconds to wait for every process to join (``HEADPRUNE_DIST_TIMEOUT``): a stray or incomplete torchrun
#: environment must fail within seconds, not after torch's 30-minute default.
JOIN_TIMEOUT = 60
_ENV = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
HEARTBEAT_SECONDS = 1.0


def init_from_env(device: str = "auto") -> None:
    """Join the process group that torchrun describes in the environment (no-op for a single process)."""
    world = _env_int("WORLD_SIZE", "1")
    if world <= 1 or dist.is_initialized():
        return
    if missing := [k for k in _ENV if not os.environ.get(k)]:
        raise HeadpruneError(f"WORLD_SIZE={world} but {', '.join(missing)} unset: an incomplete torch.distributed "
                             "setup; launch with torchrun, or unset WORLD_SIZE for a single process")
    rank, port = _env_int("RANK"), _env_int("MASTER_PORT")
    if not 0 <= rank < world or not 0 < port < 65536:
        raise HeadpruneError(f"RANK={rank} or MASTER_PORT={port} is impossible with WORLD_SIZE={world}")
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(_env_int("LOCAL_RANK", "0"))
    timeout = _env_int("HEADPRUNE_DIST_TIMEOUT", str(JOIN_TIMEOUT))
    if timeout <= 0:
        raise HeadpruneError(f"environment variable HEADPRUNE_DIST_TIMEOUT={timeout} must be a positive number of "
                             "seconds (default 60)")
    addr = os.environ["MASTER_ADDR"]
    try:  # the rendezvous of init_method env://, with a short timeout (torchrun's agent may host the store)
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        with _native_stderr_silenced():  # c10d logs each retry, with C++ stack frames, on file descriptor 2
            store: dist.Store = dist.TCPStore(addr, port, world, is_master=rank == 0 and not agent,
                                              timeout=timedelta(seconds=timeout), wait_for_workers=not agent)
        if agent:  # as torch's env:// does under torchrun: keys of an earlier attempt never collide
            store = dist.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        dist.init_process_group("nccl" if use_cuda else "gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        global _WATCH
        _WATCH = _Heartbeat(store, _client(addr, port, agent, timeout), rank, world, timeout, f"{addr}:{port}")
    except (RuntimeError, ValueError, OSError) as err:  # DistStoreError, DistNetworkError are RuntimeErrors
        first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise HeadpruneError(f"could not join the torch.distributed group at {addr}:{port} (rank {rank} of {world}) "
                             f"within {timeout} s ({first}); launch with torchrun, or unset WORLD_SIZE, RANK and "
                             "MASTER_ADDR for a single process") from None


def _client(addr: str, port: int, agent: bool, timeout: int) -> dist.Store:
    """A second connection to the rendezvous store, for the heartbeat thread (one connection per thread)."""
    store: dist.Store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout),
                                      wait_for_workers=False)
    if agent:
        store = dist.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    return store


class _Heartbeat:
    """Liveness of the group through the rendezvous store: a daemon thread bumps ``headprune/beat/{rank}`` every
    second and reads every other rank's counter; a counter unchanged for ``timeout`` seconds (on this process'
    clock, so clocks need not agree) marks its rank as dead. :meth:`check` raises that as one line."""

    def __init__(self, store: dist.Store, client: dist.Store, rank: int, world: int, timeout: int, where: str):
        self.store, self.rank, self.world, self.timeout, self.where = store, rank, world, timeout, where
        self.failure: str | None = None
        self._barriers = 0
        self._stop = threading.Event()
        client.add(f"headprune/beat/{rank}", 1)
        self._thread = threading.Thread(target=self._beat, args=(client,), daemon=True, name="headprune-heartbeat")
        self._thread.start()
        # stop the thread before the interpreter tears down the store it is using: a C++ store destroyed under a
        # running call aborts the process ("terminate called without an active exception") after a finished run
        atexit.register(self.close)

    def close(self) -> None:
        """Stop the heartbeat thread and wait for its current store call (at most one heartbeat plus a second)."""
        self._stop.set()
        self._thread.join(timeout=HEARTBEAT_SECONDS + 1)

    def _beat(self, client: dist.Store) -> None:
        seen = {r: (-1, time.monotonic()) for r in range(self.world) if r != self.rank}
        while self.failure is None and not self._stop.is_set():
            try:
                client.add(f"headprune/beat/{self.rank}", 1)
                now = time.monotonic()
                for r, (count, since) in seen.items():
                    current = client.add(f"headprune/beat/{r}", 0)
                    if current != count:
                        seen[r] = (current, now)
                    elif now - since > self.timeout:
                        self.failure = (f"rank {r} of {self.world} stopped (no heartbeat for {self.timeout} s): its "
                                        "process or machine died; rerun the same command to resume")
            except (RuntimeError, ValueError, OSError):  # the store's host (rank 0 or its torchrun agent) is gone
                self.failure = (f"lost the torch.distributed store at {self.where}: the process or machine hosting "
                                "it (rank 0 or its torchrun agent) died; rerun the same command to resume")
            self._stop.wait(HEARTBEAT_SECONDS)

    def check(self) -> None:
        if self.failure is not None:
            raise HeadpruneError(self.failure)

    def barrier(self) -> None:
        """Wait until every rank arrives here, failing as soon as a rank is known dead (never hangs)."""
        self._barriers += 1
        key = f"headprune/barrier/{self._barriers}"
        try:
            self.store.add(key, 1)
            while self.store.add(key, 0) < self.world:
                self.check()
                time.sleep(0.05)
        except (RuntimeError, ValueError, OSError):
            self.failure = self.failure or (f"lost the torch.distributed store at {self.where}: the process or "
                                            "machine hosting it (rank 0 or its torchrun agent) died; rerun the same "
                                            "command to resume")
            self.check()


_WATCH: _Heartbeat | None = None


@contextlib.contextmanager
def _native_stderr_silenced():
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _env_int(name: str, default: str | None = None) -> int:
    value = os.environ.get(name, default)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise HeadpruneError(f"environment variable {name}={value!r} must be an integer") from None


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard_name(name: str) -> str:
    """A per-process file name: ``name`` alone, or ``name.rank{r}-of-{N}`` under torchrun."""
    rank, world = rank_and_world()
    return name if world == 1 else f"{name}.rank{rank}-of-{world}"


def is_main() -> bool:
    return rank_and_world()[0] == 0


def progress_files(path: Path) -> tuple[Path, list[Path]]:
    """This process' progress file for ``path``, and those that runs with another number of processes left
    (``path`` itself, ``path.rank{r}-of-{n}`` with n ≠ this run's): read to resume, never written."""
    world = rank_and_world()[1]
    mine = path.with_name(shard_name(path.name))
    others = []
    for other in [path, *sorted(path.parent.glob(glob.escape(path.name) + ".rank*-of-*"))]:
        match = re.fullmatch(r"\.rank\d+-of-(\d+)", other.name[len(path.name):])
        n = int(match.group(1)) if match else 1 if other == path else None
        if n is not None and n != world and other.is_file():
            others.append(other)
    return mine, others


def assign_units(costs: list[float], world: int) -> list[list[int]]:
    """Unit indices per rank, balancing the summed cost: longest processing time first (Graham 1969), each unit
    to the least loaded rank (ties: the lower rank), units of equal cost in index order. Deterministic; the
    largest rank total is at most 4/3 of the optimum, and within max(cost) of the mean. Each rank's list is in
    index order (so a batch's cached forward is reused by its consecutive units)."""
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    loads = [(0.0, r) for r in range(world)]
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in order:
        load, r = heapq.heappop(loads)
        shares[r].append(i)
        heapq.heappush(loads, (load + costs[i], r))
    return [sorted(share) for share in shares]


def run_units(jobs: list[tuple[str, Callable[[], Any]]], progress, bar: Callable = iter,
              costs: list[float] | None = None) -> dict[str, Any]:
    """``{key: value}`` of every job; this process computes (or reads from ``progress``) only its share.

    ``costs``: relative cost of each job (default: equal), for :func:`assign_units`; only the jobs that no
    process has recorded yet are shared out. ``bar`` wraps this process' share (e.g. a tqdm progress bar).
    """
    rank, world = rank_and_world()
    if world == 1:
        return {key: progress.get_or_compute(key, fn) for key, fn in bar(jobs)}
    agree(getattr(progress, "key", None), getattr(progress, "settings", None))
    done = {key for key, _ in jobs if key in progress}
    everyone: list[set[str]] = [set()] * world
    _gather(everyone, done)
    done = set().union(*everyone)  # the same set on every rank, so the same assignment
    todo = [i for i, (key, _) in enumerate(jobs) if key not in done]
    weights = [1.0 if costs is None else float(costs[i]) for i in todo]
    share = [jobs[todo[j]] for j in assign_units(weights, world)[rank]]
    mine = {}
    for key, fn in bar(share):
        if _WATCH is not None:
            _WATCH.check()  # a dead peer stops this process within a unit, not at the end of its share
        mine[key] = progress.get_or_compute(key, fn)
    mine |= {key: progress.get_or_compute(key, fn) for key, fn in jobs if key in progress}
    shards: list[dict] = [{}] * world
    _gather(shards, mine)
    merged = {key: value for shard in shards for key, value in shard.items()}
    return {key: merged[key] for key, _ in jobs}  # job order, whatever the rank that computed it


def agree(key: str | None, settings: dict | None = None) -> None:
    """HeadpruneError on every rank unless all ranks run the same sweep: the same fingerprint of model, data and
    settings (``key``). Checked before any unit is shared out, so a rank started with another model or option
    never contributes wrong values under rank 0's fingerprint. The message names the first differing setting."""
    world = rank_and_world()[1]
    everyone: list[Any] = [None] * world
    _gather(everyone, (key, settings))
    differ = [r for r, (k, _) in enumerate(everyone) if k != everyone[0][0]]
    if not differ:
        return
    r = differ[0]
    mine, theirs = everyone[0][1] or {}, everyone[r][1] or {}
    names = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    what = (f"{names[0]} ({str(mine.get(names[0]))[:40]!r} on rank 0, {str(theirs.get(names[0]))[:40]!r} on rank {r})"
            if names else "their fingerprint")
    raise HeadpruneError(f"the processes disagree on {what}: rank {r} of {world} runs another model, data or "
                         "settings; start every rank with the same model, data and options")


def _gather(out: list, obj: Any) -> None:
    """``all_gather_object`` after a heartbeat-watched barrier: a dead rank is one clear line, not a hang."""
    if _WATCH is not None:
        _WATCH.barrier()
    try:
        dist.all_gather_object(out, obj)
    except (RuntimeError, ValueError, OSError) as err:
        first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise HeadpruneError(f"exchanging results between processes failed ({first}); a process or machine "
                             "died; rerun the same command to resume") from None
