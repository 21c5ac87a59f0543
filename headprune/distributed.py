"""Sharding sweeps across processes with torch.distributed.

Launched with ``torchrun --nproc-per-node N -m headprune score|curve|run ...``, every process computes
every N-th unit of work (unit i goes to rank i mod N), records it in its own progress file, and the
results are exchanged with ``all_gather_object``; each process then aggregates all units in the same fixed
order, so the output equals a single-process run's. Only rank 0 writes outputs and prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def init_from_env(device: str = "auto") -> None:
    """Join the process group that torchrun describes in the environment (no-op for a single process)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        use_cuda = device != "cpu" and torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if use_cuda else "gloo")


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
