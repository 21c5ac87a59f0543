"""Sharding sweeps across processes with torch.distributed.

Launched with ``torchrun --nproc-per-node N -m headprune score|curve|run ...``, every process computes
every N-th unit of work (unit i goes to rank i mod N), records it in its own progress file, and the
results are exchanged with ``all_gather_object``; each process then aggregates all units in the same fixed
order, so the output equals a single-process run's. Only rank 0 writes outputs and prints.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .errors import HeadpruneError

#: Seconds to wait for every process to join (``HEADPRUNE_DIST_TIMEOUT``): a stray or incomplete torchrun
#: environment must fail within seconds, not after torch's 30-minute default.
JOIN_TIMEOUT = 60
_ENV = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")


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
    addr = os.environ["MASTER_ADDR"]
    try:  # the rendezvous of init_method env://, with a short timeout (torchrun's agent may host the store)
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        with _native_stderr_silenced():  # c10d logs each retry, with C++ stack frames, on file descriptor 2
            store: dist.Store = dist.TCPStore(addr, port, world, is_master=rank == 0 and not agent,
                                              timeout=timedelta(seconds=timeout), wait_for_workers=not agent)
        if agent:  # as torch's env:// does under torchrun: keys of an earlier attempt never collide
            store = dist.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        dist.init_process_group("nccl" if use_cuda else "gloo", store=store, rank=rank, world_size=world)
    except (RuntimeError, ValueError, OSError) as err:  # DistStoreError, DistNetworkError are RuntimeErrors
        first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise HeadpruneError(f"could not join the torch.distributed group at {addr}:{port} (rank {rank} of {world}) "
                             f"within {timeout} s ({first}); launch with torchrun, or unset WORLD_SIZE, RANK and "
                             "MASTER_ADDR for a single process") from None


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


def run_units(jobs: list[tuple[str, Callable[[], Any]]], progress, bar: Callable = iter) -> dict[str, Any]:
    """``{key: value}`` of every job; this process computes (or reads from ``progress``) only its share.

    ``bar`` wraps this process' share (e.g. a tqdm progress bar).
    """
    rank, world = rank_and_world()
    mine = {key: progress.get_or_compute(key, fn) for key, fn in bar(jobs[rank::world])}
    if world > 1:
        shards: list[dict] = [None] * world  # type: ignore[list-item]
        dist.all_gather_object(shards, mine)
        mine = {key: value for shard in shards for key, value in shard.items()}
    return {key: mine[key] for key, _ in jobs}  # job order, whatever the rank that computed it
