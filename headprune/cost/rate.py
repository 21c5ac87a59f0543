"""This machine's speed on this model, measured before the work is spent: FLOP/s of a representative forward, and
the pace of the command's processes.

The rate is the median of :data:`CALIBRATION_REPEATS` timed forwards of one window, after one untimed warm-up (the
first forward of a process allocates, starts the thread pool and picks kernels: it is the slow one), in the model's
dtype and this process' threads, with the LM head in chunks (:func:`~headprune.models.nll.model_nll`) as every pass
runs it. Under ``--workers N`` every process measures it at once, each single-threaded beside the others, so the
rate is one process' share of the machine; the units are shared out by cost, so the wall time is the work over N.
"""

from __future__ import annotations

import statistics
import time
import weakref
from dataclasses import dataclass

import torch

from headprune.cost.flops import forward_flops
from headprune.models.base import HeadModel
from headprune.models.nll import model_nll

#: Timed forwards whose median is the rate (after one untimed warm-up).
CALIBRATION_REPEATS = 3

_measured: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(seq_len, threads): FLOP/s}


def measured_rate(model: HeadModel, seq_len: int, repeats: int = CALIBRATION_REPEATS, batch: int = 1) -> float:
    """FLOP/s of this process on this model in windows of ``seq_len``: the median of ``repeats`` timed forwards of
    ``batch`` windows (short prompts run batched: one window of a few tokens times only the overhead) after one
    untimed warm-up; measured once per model, shape and thread count in a process."""
    key = (seq_len, batch, torch.get_num_threads(), repeats)
    known = _measured.setdefault(model, {})
    if key in known:
        return known[key]
    tokens = torch.zeros(batch, seq_len, dtype=torch.long, device=model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    times = []
    with torch.no_grad():
        model_nll(model, tokens)
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            model_nll(model, tokens)
            sync()
            times.append(time.perf_counter() - start)
    known[key] = forward_flops(model, seq_len) * batch * seq_len / statistics.median(times)
    return known[key]


@dataclass(frozen=True)
class Pace:
    """How fast a command's work goes here: ``rate`` FLOP/s per process, ``world`` processes sharing its units."""

    rate: float
    world: int = 1

    @classmethod
    def here(cls, model: HeadModel, seq_len: int, batch: int = 1) -> Pace:
        """This process' measured rate on ``batch`` windows (:func:`measured_rate`) and the processes of this run."""
        from headprune.io.work.distributed import rank_and_world

        return cls(measured_rate(model, seq_len, batch=batch), rank_and_world()[1])

    def seconds(self, model: HeadModel, seq_len: int, tokens: int, fe: float = 1.0) -> float:
        """Wall seconds of ``fe`` forward-equivalents over ``tokens`` tokens in windows of ``seq_len``, the units
        shared by the processes."""
        return fe * forward_flops(model, seq_len) * tokens / (self.rate * self.world)
