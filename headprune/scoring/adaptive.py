"""An adaptive exact ranking: ablation measured exactly, with tokens spent where the answer is still open.

One budget for all heads wastes most of it: a head far from the boundary of the answer is placed by a few windows,
a head near it needs many. Here, for an ablation ``method`` (abl_zero or abl_mean) and a target set of K heads
(``top``: the largest |ΔL|; ``prune``: the smallest ΔL, the heads a prune of K removes first):

1. the windows of the corpus are put in a seeded random order, and every head is ablated exactly on the first
   ``first_windows`` of them (paired: each window's NLL sum with and without the head, on one cached residual
   stream, as the exact sweep does);
2. each head gets ΔL and a simultaneous interval from its windows (:mod:`.adaptive_stats`: ratio estimator,
   Student's t, Bonferroni over every head and every round), intersected with its intervals of earlier rounds,
   hence a rank interval and a status: **in** (its worst rank is within K), **out** (its best rank is beyond K) or
   **contested**; with a ``margin`` ε, heads within ε of the boundary count as tied (in: its ΔL is at least the K-th
   true one less ε; out: at most the K-th plus ε), so a dense boundary can be decided;
3. only contested heads are measured on the next windows (the count grows ×``growth`` a round), until none is
   contested, the windows run out, or the next round would take the head-windows measured (one head ablated on one
   window) past ``max_head_windows`` (a round is measured whole or not at all; the intervals stay simultaneous over
   every round the schedule allows, so stopping early keeps them valid). A decided head keeps its interval: every
   interval holds together, so later decisions may rest on it.

The result names the certified heads, the contested ones and the places they compete for, each head's ΔL with
its interval and rank interval, and what each round measured. Resumable (one unit per batch and chunk of heads,
keyed by the round's windows and heads) and deterministic under ``seed``; both cores through the sweep's units.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headprune.data.tokens import check_ids
from headprune.errors import HeadpruneError
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.heads import head_id
from headprune.perplexity import Batch, Windowing
from headprune.schema import RANKABLE
from headprune.scoring.adaptive_stats import (
    TARGETS,
    Decision,
    decide,
    half_width,
    key_interval,
    window_estimate,
    window_schedule,
)
from headprune.scoring.base import rows_per_forward
from headprune.scoring.set_sweep import Intervention, SetSweep
from headprune.scoring.verified_stats import DEFAULT_LEVEL


@dataclass(frozen=True)
class AdaptiveOptions:
    """What :func:`adaptive_ranking` decides and how: the ``top`` K heads (default 10% of them, at least 1) by
    ``target``, certified at confidence ``level`` up to ``margin`` (a head in is at most that below the K-th, a head
    out at most that above it); every head on ``first_windows`` windows, then ×``growth`` a
    round for the contested ones; windows in the order ``seed`` draws; ``rows``: ablated copies × windows per
    forward (default: :func:`~headprune.scoring.base.rows_per_forward`); ``max_head_windows``: the cost cap (None:
    none), at least the first round's heads × ``first_windows``."""

    top: int | None = None
    target: str = "top"
    level: float = DEFAULT_LEVEL
    margin: float = 0.0  # nats/token: differences this small at the boundary of the answer count as ties
    first_windows: int = 8
    growth: float = 2.0
    seed: int = 0
    rows: int | None = None
    max_head_windows: int | None = None

    def check(self, n_heads: int, n_windows: int) -> tuple[int, list[int]]:
        """(K, the cumulative windows of each round) after checking every field against a model of ``n_heads``
        heads and a corpus of ``n_windows`` windows."""
        if self.target not in TARGETS:
            raise HeadpruneError(f"unknown target {self.target!r}: give one of {', '.join(TARGETS)}", "target")
        k = max(1, round(0.1 * n_heads)) if self.top is None else self.top
        if not 0 < k < n_heads:
            raise HeadpruneError(f"top {k} of {n_heads} heads: give 1 to {n_heads - 1}", "top")
        if not 0 < self.level < 1:
            raise HeadpruneError(f"level {self.level} must lie strictly between 0 and 1", "level")
        if self.margin < 0:
            raise HeadpruneError(f"margin {self.margin} must be at least 0 (nats/token)", "margin")
        if self.rows is not None and self.rows < 1:
            raise HeadpruneError(f"rows {self.rows} must be at least 1", "rows")
        schedule = window_schedule(self.first_windows, n_windows, self.growth)
        if self.max_head_windows is not None and self.max_head_windows < n_heads * schedule[0]:
            raise HeadpruneError(f"max_head_windows {self.max_head_windows:,} is less than the first round, "
                                 f"{n_heads} heads × {schedule[0]} windows", "max_head_windows")
        return k, schedule


@dataclass
class AdaptiveRanking:
    """What :func:`adaptive_ranking` gives."""

    method: str  # the ablation measured (abl_zero or abl_mean)
    target: str  # "top" or "prune" (:data:`~.adaptive_stats.TARGETS`)
    k: int
    level: float
    margin: float  # nats/token: the ties allowed at the boundary (0: none)
    # one row per head (model.head_ids order): head_id, layer, head, delta (ΔL, nats/token), ci_lo, ci_hi (the
    # simultaneous interval), se, windows, tokens (what it was measured on), rank_lo, rank_hi, status, sign
    table: pd.DataFrame
    # one row per round: round, windows (cumulative), heads (measured this round), contested (after it), seconds
    rounds: pd.DataFrame
    baseline_nll: float  # the unablated model on every window measured (nats/token)
    pool_windows: int  # windows the corpus offered
    tokens_per_window: float  # mean scored tokens of a window
    max_head_windows: int | None = None  # the cost cap the rounds ran under (None: none)

    @property
    def certified(self) -> list[str]:
        """The heads certified in the target set, by rank (best first)."""
        rows = self.table[self.table["status"] == "in"]
        return rows.sort_values(["rank_hi", "rank_lo"], kind="stable")["head_id"].tolist()

    @property
    def contested(self) -> list[str]:
        """The heads neither certified in nor out: they compete for the ``open_places`` left."""
        return self.table.loc[self.table["status"] == "contested", "head_id"].tolist()

    @property
    def open_places(self) -> int:
        """Places of the top K no certified head holds."""
        return self.k - len(self.certified)

    @property
    def head_windows(self) -> int:
        """Head × window ablations measured in all (a plain sweep on the pool measures heads × pool)."""
        return int(self.table["windows"].sum())

    @property
    def stopped(self) -> str:
        """Why the rounds ended: "decided" (nothing contested), "pool" (the windows ran out) or "cap"."""
        if not self.contested:
            return "decided"
        return "pool" if int(self.rounds["windows"].iloc[-1]) >= self.pool_windows else "cap"

    def summary(self) -> dict:
        """The JSON summary a command writes beside the table."""
        return {"method": self.method, "target": self.target, "top": self.k, "level": self.level,
                "margin": self.margin,
                "certified": self.certified, "contested": self.contested, "open_places": self.open_places,
                "rounds": self.rounds.to_dict("records"), "head_windows": self.head_windows, "stopped": self.stopped,
                "plain_sweep_head_windows": len(self.table) * self.pool_windows, "pool_windows": self.pool_windows,
                "max_head_windows": self.max_head_windows,
                "baseline_nll": self.baseline_nll}


class _Measured:
    """Per head: the NLL changes and scored tokens of every window it was measured on, its latest ΔL and se, and
    the intersection of every interval it has had (each holds at the simultaneous level, so their intersection
    does too, and a decided head stays decided)."""

    def __init__(self, n_heads: int):
        self.deltas: list[list[np.ndarray]] = [[] for _ in range(n_heads)]  # per head, one [W_r] array per round
        self.tokens: list[list[np.ndarray]] = [[] for _ in range(n_heads)]
        self.delta, self.se = np.zeros(n_heads), np.full(n_heads, np.inf)
        self.windows, self.n_tokens = np.zeros(n_heads, dtype=int), np.zeros(n_heads)
        self.lo, self.hi = np.full(n_heads, -np.inf), np.full(n_heads, np.inf)
        self.base: list[float] = []  # unablated NLL sums of every window measured
        self.base_tokens: list[float] = []

    def add(self, n: int, deltas: np.ndarray, tokens: np.ndarray, level: float, tests: int) -> None:
        """Head n measured on more windows: its estimate from all its windows, its interval narrowed (where the
        new one misses the old, an interval failed to cover: the new one is kept)."""
        self.deltas[n].append(deltas)
        self.tokens[n].append(tokens)
        d, t = np.concatenate(self.deltas[n]), np.concatenate(self.tokens[n])
        self.delta[n], self.se[n] = window_estimate(d, t)
        self.windows[n], self.n_tokens[n] = len(d), t.sum()
        half = float(half_width(np.array([self.se[n]]), np.array([len(d)]), level, tests)[0])
        lo, hi = max(self.lo[n], self.delta[n] - half), min(self.hi[n], self.delta[n] + half)
        self.lo[n], self.hi[n] = (lo, hi) if lo <= hi else (self.delta[n] - half, self.delta[n] + half)


def _ordered_windows(batches: list[Batch], seed: int) -> list[Batch]:
    """Every window of ``batches`` as its own one-window batch, in the order ``seed`` draws."""
    windows = [Batch(b.tokens[i : i + 1], b.mask[i : i + 1]) for b in batches for i in range(len(b.tokens))]
    order = np.random.default_rng(seed).permutation(len(windows))
    return [windows[i] for i in order]


def _rebatch(windows: list[Batch], batch_size: int) -> list[Batch]:
    """Windows of one length stacked into batches of ``batch_size`` (window order kept within each length)."""
    by_length: dict[int, list[Batch]] = {}
    for w in windows:
        by_length.setdefault(w.tokens.shape[1], []).append(w)
    return [Batch(torch.cat([w.tokens for w in group[i : i + batch_size]]),
                  torch.cat([w.mask for w in group[i : i + batch_size]]))
            for group in by_length.values() for i in range(0, len(group), batch_size)]


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(",".join(map(str, values)).encode()).hexdigest()[:12]


#: measure(active heads [A], first window, end window) -> (NLL changes [A, W], scored tokens [W], unablated NLL
#: sums [W]) of the windows [first, end) of the seeded order
Measure = Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray, list[float]]]


def adaptive_rounds(measure: Measure, n_heads: int, k: int, schedule: list[int], *, target: str = "top",
                    level: float = DEFAULT_LEVEL, margin: float = 0.0, cap: int | None = None
                    ) -> tuple[_Measured, Decision, pd.DataFrame]:
    """The rounds of the module docstring: every head on ``schedule[0]`` windows, then the contested ones on the
    windows up to each next entry, until none is contested or the next round would take the head-windows past
    ``cap``. (each head's windows and estimate, the final decision, one row per round)."""
    tests = n_heads * len(schedule)  # every interval of every head in every round
    measured, active, start, rounds = _Measured(n_heads), np.arange(n_heads), 0, []
    for r, end in enumerate(schedule, 1):
        if r > 1 and cap is not None and int(measured.windows.sum()) + len(active) * (end - start) > cap:
            break
        t0 = time.perf_counter()
        changes, tokens, base = measure(active, start, end)
        for row, n in enumerate(active):
            measured.add(int(n), changes[row], tokens, level, tests)
        measured.base += base
        measured.base_tokens += tokens.tolist()
        point = np.abs(measured.delta) if target == "top" else -measured.delta
        decision = decide(*key_interval(measured.lo, measured.hi, target), k, point, margin)
        rounds.append({"round": r, "windows": end, "heads": len(active),
                       "contested": int((decision.status == "contested").sum()),
                       "seconds": round(time.perf_counter() - t0, 1)})
        active, start = np.flatnonzero(decision.status == "contested"), end
        if not len(active):
            break
    return measured, decision, pd.DataFrame(rounds)


def _table(model: HeadModel, measured: _Measured, decision: Decision) -> pd.DataFrame:
    """Each head's ΔL, interval, rank interval and status (:func:`~.adaptive_stats.decide`)."""
    heads, lo, hi = model.head_ids, measured.lo, measured.hi
    return pd.DataFrame({"head_id": [head_id(*h) for h in heads], "layer": [l for l, _ in heads],
                         "head": [h for _, h in heads], "delta": measured.delta, "ci_lo": lo, "ci_hi": hi,
                         "se": measured.se, "windows": measured.windows, "tokens": measured.n_tokens.astype(int),
                         "rank_lo": decision.rank_lo, "rank_hi": decision.rank_hi, "status": decision.status,
                         "sign": np.where(lo > 0, "+", np.where(hi < 0, "-", "?"))})


def adaptive_ranking(
    model: HeadModel,
    ids: Tensor,  # 1-D token ids: the pool of windows
    method: str = "abl_zero",
    *,
    options: AdaptiveOptions = AdaptiveOptions(),
    windowing: Windowing | None = None,
    fills: list[Tensor | None] | None = None,  # abl_mean's per-layer z̄ [n_heads_l, d_head] (None: measured here)
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> AdaptiveRanking:
    """The adaptive exact ranking of ``method`` on ``ids``: see the module docstring."""
    if method not in RANKABLE:
        raise HeadpruneError(f"cannot rank {method!r} adaptively: give one of {', '.join(RANKABLE)}", "method")
    model.require_heads(f"ranking by {method}")
    check_ids(ids, model.cfg.vocab_size, "adaptive_ranking")
    windowing = windowing or Windowing.for_model(model)
    windows = _ordered_windows(windowing.batches(ids), options.seed)
    k, schedule = options.check(len(model.head_ids), len(windows))
    from headprune.scoring.verified import intervention

    how = (intervention(model, method, ids, windowing, (0, 0), progress, show_progress) if fills is None
           else Intervention(fills))

    def measure(active: np.ndarray, start: int, end: int) -> tuple[np.ndarray, np.ndarray, list[float]]:
        prefix = f"adaptive/{method}/s{options.seed}/w{start}-{end}"
        sweep = SetSweep(model, method, _rebatch(windows[start:end], windowing.batch_size), how,
                         rows_per_forward(model, options.rows), progress or NoProgress(), show_progress, prefix)
        tag = f"{prefix}/h{_digest(active)}"
        changes = sweep.measure_windows({tag: [[model.head_ids[n]] for n in active]},
                                        f"windows {start}-{end} of at most {schedule[-1]}: {len(active)} heads")[tag]
        return changes, sweep.window_tokens(), [s for kb in range(len(sweep.batches)) for s in sweep.bases[kb]]

    measured, decision, rounds = adaptive_rounds(measure, len(model.head_ids), k, schedule, target=options.target,
                                                 level=options.level, margin=options.margin,
                                                 cap=options.max_head_windows)
    return AdaptiveRanking(method, options.target, k, options.level, options.margin,
                           _table(model, measured, decision), rounds,
                           float(sum(measured.base) / sum(measured.base_tokens)), len(windows),
                           float(np.mean(measured.base_tokens)), options.max_head_windows)
