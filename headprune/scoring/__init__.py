"""Head-importance scoring: one tidy DataFrame, one row per head, one column per method.

Methods (higher = more important for all but ``entropy``, which describes a head), by family:
  weights     wo_fro, wo_spec, ov_fro, ov_spec                      (see :mod:`.weights`)
  data        out_norm, fluct, entropy                              (see :mod:`.activations`)
  gradients   grad, taylor                                          (see :mod:`.gradients`)
  ablation    abl_zero, abl_zero_folded, abl_mean, abl_opt          (see :mod:`.ablation`; abl_opt's constants
              are fitted first, by :mod:`.optimal`)
  resample    abl_resample                                          (see :mod:`.resample`)
  context     ctx_stream, ctx_gate, ctx_retrieval                   (see :mod:`.context`; opt-in)

Every family implements :class:`~.base.Family` (units of work, then a combine); data methods run over
sliding windows exactly as ``eval`` does. Each unit is recorded in a :class:`~headprune.io.work.progress.Progress`,
so a killed sweep resumes, and shared among processes under torchrun (:func:`~headprune.io.work.distributed.run_units`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from headprune.bootstrap import (
    DEFAULT_REPLICATES,
    Replicate,
    check_replicates,
    interval,
    rank_interval,
    window_counts,
)
from headprune.data.tokens import check_ids
from headprune.errors import HeadpruneError
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.work.distributed import run_units
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.heads import check_heads, head_id
from headprune.models.interventions import Head
from headprune.perplexity import Batch, Windowing
from headprune.schema import (
    LEARNED,
    METHOD_FAMILIES,
    METHOD_SPECS,
    RANKED,
    check_methods,
    ci_columns,
    parse_methods,
    rank_columns,
    score_columns,
)
from headprune.scoring.ablation import AblationScores
from headprune.scoring.activations import ActivationScores
from headprune.scoring.base import Family, ScoringContext, Unit, by_head, rows_per_forward
from headprune.scoring.context import ContextScores
from headprune.scoring.gradients import GradientScores
from headprune.scoring.optimal import STEPS, OptimalFit, fit_layer, fit_set
from headprune.scoring.resample import RESAMPLE_DRAWS, ResampleScores
from headprune.scoring.result import HeadScores, measured_on
from headprune.scoring.weights import WeightScores

#: family name -> its scorer, in the order they run (activations before ablation: abl_mean uses mean_z; the
#: optimal fit starts from mean_z and must run before ablation evaluates abl_opt with its opt_c). Each family of
#: schema.METHOD_TABLE but the learned one (gate: trained by headprune.pruning.gates) has its scorer here.
FAMILY_SCORERS: dict[str, Family] = {f.name: f for f in (WeightScores(), ActivationScores(), GradientScores(),
                                                           OptimalFit(), AblationScores(), ResampleScores(),
                                                           ContextScores())}
assert {name: f.methods for name, f in FAMILY_SCORERS.items() if f.methods} == {
    family: methods for family, methods in METHOD_FAMILIES.items() if family != LEARNED}, \
    "the scorers' methods disagree with schema.METHOD_TABLE"


def _bar(show: bool, desc: str) -> Callable[[Iterable], Iterable]:
    return lambda it: tqdm(it, desc=desc, disable=not show, leave=False)


@dataclass(frozen=True)
class ScoringOptions:
    """How :func:`score_heads` computes its scores.

    ``ablation_rows``: ablated copies × windows per forward (default: 8 on the CPU, where larger batches only cost
    cache, 64 on a GPU, where batching copies is the win); ``bootstrap``: replicates of each data-dependent
    method's 95% interval (0: none), seeded by ``seed``; ``optimal_steps``: passes of abl_opt's per-head BFGS fit
    per layer (:mod:`.optimal`); ``resample_draws``: source windows K per window of abl_resample, drawn with
    ``seed`` (:mod:`.resample`)."""

    ablation_rows: int | None = None
    bootstrap: int = DEFAULT_REPLICATES
    seed: int = 0
    optimal_steps: int = STEPS
    resample_draws: int = RESAMPLE_DRAWS
    stream_sink: int = 4  # the context scores' streaming heads: the first stream_sink tokens and the last
    stream_recent: int = 256  # stream_recent (scoring/context.py)


DEFAULT_SCORING = ScoringOptions()


def score_heads(
    model: HeadModel,
    ids: torch.Tensor | None,  # None only when every method reads the weights alone
    methods: str | Sequence[str] = "all",
    *,
    windowing: Windowing | None = None,
    options: ScoringOptions = DEFAULT_SCORING,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> HeadScores:
    """Score every head of ``model`` on token ids ``ids`` (1-D) with each of ``methods``: method names, or a
    user's spec (``"all"``, ``"grad,taylor"``: :func:`~headprune.schema.parse_methods`).

    Every data-dependent method ``m`` also gets its 95% percentile interval ``m_ci_lo``, ``m_ci_hi`` from
    ``options.bootstrap`` replicates that resample the scoring windows (seeded by ``options.seed``; 0: none), and
    an exact method (:data:`~headprune.schema.RANKED`) each head's 95% rank interval ``m_rank_lo``, ``m_rank_hi``
    (1 = the largest) from the same replicates.

    ``windowing``: default ``Windowing.for_model(model)`` (non-overlapping full-length windows after the model's
    BOS token where it has one, 8 a batch).
    """
    methods = _checked_methods(model, ids, methods, options)
    windowing = windowing or Windowing.for_model(model)
    families = [f for f in FAMILY_SCORERS.values() if f.wanted(methods)]
    needs_data = any(f.needs_data for f in families)
    if ids is None and needs_data:
        reading = ", ".join(m for m in methods if METHOD_SPECS[m].data_dependent)
        raise HeadpruneError(f"the methods {reading} read data: pass token ids (headprune.tokens(...))", "ids")
    batches = windowing.batches(ids) if ids is not None and needs_data else []
    ctx = _context(model, batches, methods, options)
    columns, replicates, seconds = _run_families(families, ctx, progress or NoProgress(), show_progress)
    table = _score_table(model, methods, columns)
    resampled: dict[str, np.ndarray] = {}  # each data method's [B, H] scores on the same resampled windows
    if options.bootstrap and replicates:  # each data-dependent method's 95% interval over resampled windows
        counts = window_counts(sum(len(b.tokens) for b in batches), options.bootstrap, options.seed)
        for m, replicate in replicates.items():
            values = resampled[m] = replicate(counts).numpy()  # [B, H]
            table[list(ci_columns(m))] = np.stack(interval(values), axis=1)
            if m in RANKED:  # and an exact method's rank, jointly over the heads on the same resampled windows
                table[list(rank_columns(m))] = np.stack(rank_interval(values), axis=1)
        known = [c for c in score_columns(methods) if c in table]
        table = table[known + [c for c in table if c not in known]]  # the canonical column order
    side = ctx.side
    means = by_head(model, side.mean_z.to(model.dtype)) if side.mean_z is not None else None
    optimal = by_head(model, side.opt_c.to(model.dtype)) if side.opt_c is not None else None
    baseline = None
    if side.baseline_nll is not None:
        baseline = {"tokens": side.baseline_tokens, "nll": side.baseline_nll}
    read = ids if ids is not None and needs_data else None
    return HeadScores(table, means, baseline, seconds, optimal, len(read) if read is not None else None,
                      measured_on(read, windowing) if read is not None else None, resampled or None)


def _checked_methods(model: HeadModel, ids: torch.Tensor | None, methods: str | Sequence[str],
                     options: ScoringOptions) -> list[str]:
    """The method names of ``methods`` (a spec or a list), once the model has heads to score, ``ids`` are token ids
    of its vocabulary and ``options.bootstrap`` is 0 or at least 2 replicates."""
    if not isinstance(methods, (str, list, tuple)):
        raise HeadpruneError(f"methods must be a spec like \"wo_fro,grad\" or a list of names, got {methods!r}",
                             "methods")
    methods = parse_methods(methods) if isinstance(methods, str) else check_methods(methods)
    model.require_heads(f"scoring ({', '.join(methods)})")
    if ids is not None:
        check_ids(ids, model.cfg.vocab_size, "score_heads")
    check_replicates(options.bootstrap)
    return methods


def _context(model: HeadModel, batches: list[Batch], methods: list[str], options: ScoringOptions) -> ScoringContext:
    """What every family of the run is given: the model, the scoring ``batches``, the ``methods`` and the options'
    settings (ablated copies × windows per forward, the optimal fit's passes, abl_resample's draws, the streaming
    heads' sink and recent tokens)."""
    rows = rows_per_forward(model, options.ablation_rows)
    if options.resample_draws < 1:
        raise HeadpruneError(f"resample_draws {options.resample_draws} must be at least 1", "resample_draws")
    return ScoringContext(model, batches, methods, rows, optimal_steps=options.optimal_steps,
                          resample_draws=options.resample_draws, resample_seed=options.seed,
                          stream_sink=options.stream_sink, stream_recent=options.stream_recent)


def _run_families(families: list[Family], ctx: ScoringContext, progress: Progress | NoProgress, show_progress: bool
                  ) -> tuple[dict[str, torch.Tensor], dict[str, Replicate], dict[str, float]]:
    """Each family's units computed (or read from ``progress``) and combined, in order, each family's side outputs
    into ``ctx.side`` for the next: ({method: [H] scores}, {method: its bootstrap replicates from window counts},
    {family: seconds}), for the methods ``ctx`` asks for."""
    columns: dict[str, torch.Tensor] = {}
    replicates: dict[str, Replicate] = {}
    seconds: dict[str, float] = {}
    for family in families:
        t0 = time.perf_counter()
        units = family.units(ctx)
        results = run_units(units, progress, _bar(show_progress, family.name), family.costs(ctx, units))
        out = family.combine(ctx, results)
        columns |= {m: v for m, v in out.scores.items() if m in ctx.methods}
        replicates |= {m: v for m, v in out.replicates.items() if m in ctx.methods}
        ctx.side.update(out.side)
        seconds[family.name] = time.perf_counter() - t0
    return columns, replicates, seconds


def _score_table(model: HeadModel, methods: list[str], columns: dict[str, torch.Tensor]) -> pd.DataFrame:
    """One row per head (layer, head, head_id, model_fingerprint) and one column per method, in ``methods`` order."""
    heads = model.head_ids
    table = pd.DataFrame({"layer": [l for l, _ in heads], "head": [h for _, h in heads],
                          "head_id": [head_id(l, h) for l, h in heads], "model_fingerprint": model_fingerprint(model)})
    for m in methods:
        table[m] = columns[m].tolist()
    return table


def head_means(
    model: HeadModel,
    ids: torch.Tensor,
    windowing: Windowing | None = None,
    *,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> dict[Head, torch.Tensor]:
    """{(layer, head): z̄ [d_head]}: each head's mean output over the scored tokens (mean ablation's fill)."""
    windowing = windowing or Windowing.for_model(model)
    family = ActivationScores()
    ctx = ScoringContext(model, windowing.batches(ids), ["abl_mean"])
    results = run_units(family.units(ctx), progress or NoProgress(), _bar(show_progress, "head means"))
    mean_z = family.combine(ctx, results).side.mean_z
    assert mean_z is not None
    return by_head(model, mean_z.to(model.dtype))


def optimal_constants(
    model: HeadModel,
    ids: torch.Tensor,
    heads: Iterable[Head] | None = None,
    windowing: Windowing | None = None,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
    steps: int = STEPS,
    ablation_rows: int | None = None,
) -> dict[Head, torch.Tensor]:
    """{(layer, head): c* [d_head]}: each head's optimal-ablation constant (fitted with that head alone
    ablated, as abl_opt defines it) on ``ids``, for ``heads`` (default: every head). Resumable: the mean
    outputs per batch, then a unit per layer."""
    windowing = windowing or Windowing.for_model(model)
    wanted = model.head_ids if heads is None else check_heads(model, heads)
    check_ids(ids, model.cfg.vocab_size, "optimal_constants")
    means = head_means(model, ids, windowing, progress=progress, show_progress=show_progress)
    batches = windowing.batches(ids)
    rows = rows_per_forward(model, ablation_rows)
    jobs: list[Unit] = []
    fitted: list[list[Head]] = []
    for layer in model.active_layers:
        kept = model.cfg.kept_heads[layer]
        positions = [p for p, h in enumerate(kept) if (layer, h) in wanted]
        if positions:
            init = torch.stack([means[(layer, h)] for h in kept]).float()  # [n_heads_l, d_head]
            jobs.append((f"opt/s{steps}/L{layer}/{','.join(str(kept[p]) for p in positions)}",
                         partial(fit_layer, model, batches, layer, init, positions, steps, rows=rows)))
            fitted.append([(layer, kept[p]) for p in positions])
    results = run_units(jobs, progress or NoProgress(), _bar(show_progress, "optimal ablation fit"))
    return {head: torch.tensor(c, dtype=model.dtype, device=model.device)
            for (key, _), layer_heads in zip(jobs, fitted) for head, c in zip(layer_heads, results[key]["c"])}


def joint_constants(
    model: HeadModel,
    ids: torch.Tensor,
    heads: Iterable[Head],
    windowing: Windowing | None = None,
    *,
    means: dict[Head, torch.Tensor] | None = None,
    steps: int = STEPS,
    show_progress: bool = True,
) -> dict[Head, torch.Tensor]:
    """{(layer, head): c} for removing ``heads`` together with optimal compensation: the constants that minimise
    the NLL on ``ids`` with all of them ablated at once (:func:`~headprune.scoring.optimal.fit_set`, from their
    mean outputs ``means``, measured here when not given). Never worse than mean compensation on ``ids``."""
    heads = check_heads(model, heads)
    check_ids(ids, model.cfg.vocab_size, "joint_constants")
    if not heads:
        return {}
    windowing = windowing or Windowing.for_model(model)
    means = means or head_means(model, ids, windowing, show_progress=show_progress)
    init = torch.stack([means[h] for h in heads]).float()
    fit = fit_set(model, windowing.batches(ids), heads, init, steps)
    return {head: torch.tensor(c, dtype=model.dtype, device=model.device) for head, c in zip(heads, fit["c"])}
