"""Perplexity and the heads' ``taylor`` scores at several window lengths over the same tokens: does the model use
context beyond the run's windows, and do the heads it needs change with it?

The tokens are cut into S spans of the longest length L_max; every length L divides L_max, so each window of L lies
in one span. Every length scores the same targets: without a BOS token a window cannot score its first token, so
the targets at multiples of the shortest length are left out at every length. Per span s and length L the pass keeps

    n_s (scored targets),  N_L[s] = Σ_t NLL_t,  T_L[s, i] = −Σ_w ∂(n_w L_w)/∂g_i  (windows w of span s)

so NLL_L = Σ_s N_L[s] / Σ_s n_s and taylor_L = Σ_s T_L[s] / Σ_s n_s (the run's ``taylor``: first-order NLL change
from zero-ablating head i), and a bootstrap over spans (:func:`headprune.bootstrap.window_counts`) resamples them
together, the same spans at every length: differences between lengths are paired.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from headprune.errors import HeadpruneError
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.perplexity import Batch, window_batches
from headprune.scoring.gradients import batch_gate_grad


@dataclass(frozen=True)
class SpanSums:
    """One length's pass: per span, the scored targets n [S], the NLL sums [S] and the taylor numerators [S, H]."""

    seq_len: int
    n: np.ndarray
    nll: np.ndarray
    taylor: np.ndarray


def window_lengths(run_len: int, context: int, longest: int) -> list[int]:
    """The run's window length and ×4 longer ones up to ``longest`` (at most ``context``): each divides the last."""
    lengths = [run_len]
    while lengths[-1] * 4 <= min(longest, context):
        lengths.append(lengths[-1] * 4)
    return lengths


def length_batches(ids: torch.Tensor, seq_len: int, shortest: int, batch_size: int, bos: int | None
                   ) -> list[Batch]:
    """Non-overlapping windows of ``seq_len`` over ``ids`` scoring the common targets (module docstring)."""
    batches = window_batches(ids, seq_len, seq_len, batch_size, bos)
    if bos is not None:
        return batches
    rel = torch.arange(1, seq_len)  # each prediction column's target, relative to its window's start
    return [Batch(b.tokens, b.mask & (rel % shortest != 0)) for b in batches]


def span_pass(model: HeadModel, ids: torch.Tensor, seq_len: int, lengths: list[int], batch_size: int,
              bos: int | None, progress: Progress | NoProgress, show_progress: bool = True) -> SpanSums:
    """Length ``seq_len``'s sums per span of ``max(lengths)`` tokens; a unit per batch in ``progress``."""
    from tqdm import tqdm

    span, shortest = max(lengths), min(lengths)
    if len(ids) % span or seq_len not in lengths:
        raise HeadpruneError(f"{len(ids)} tokens are no whole number of spans of {span}, or {seq_len} is not one of "
                             f"the lengths {lengths}")
    per_span = span // seq_len
    n_spans, H = len(ids) // span, len(model.head_ids)
    n, nll, taylor = np.zeros(n_spans), np.zeros(n_spans), np.zeros((n_spans, H))
    batches = length_batches(ids, seq_len, shortest, batch_size, bos)
    w = 0
    for k, batch in enumerate(tqdm(batches, desc=f"windows of {seq_len}", disable=not show_progress, leave=False)):
        unit = progress.get_or_compute(f"window_length/{seq_len}/b{k}", partial(batch_gate_grad, model, batch))
        for n_w, sum_w, d in zip(unit["n"], unit["nll_sum"], unit["dL_dg"], strict=True):
            s = w // per_span
            n[s] += n_w
            nll[s] += sum_w
            taylor[s] -= n_w * np.asarray(d)
            w += 1
    return SpanSums(seq_len, n, nll, taylor)
