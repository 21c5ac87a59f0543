"""Head-importance scoring: one tidy DataFrame, one row per head, one column per method.

Methods (higher = more important for all but ``entropy``, which describes a head), by family:
  weights     wo_fro, wo_spec, ov_fro, ov_spec                      (see :mod:`.weights`)
  data        out_norm, fluct, entropy                              (see :mod:`.activations`)
  gradients   grad, taylor                                          (see :mod:`.gradients`)
  ablation    abl_zero, abl_mean                                    (see :mod:`.ablation`)

Every family implements :class:`~.base.Family` (units of work, then a combine); data methods run over
sliding windows exactly as ``eval`` does. Each unit is recorded in a :class:`~headprune.outputs.Progress`,
so a killed sweep resumes, and shared among processes under torchrun (:func:`~headprune.distributed.run_units`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..distributed import run_units
from ..heads import head_id
from ..interventions import Head
from ..loading import model_fingerprint
from ..model import GPT2
from ..outputs import NoProgress, Progress
from ..perplexity import Windowing
from ..schema import METHODS, parse_methods
from .ablation import AblationScores
from .activations import ActivationScores
from .base import Family, ScoringContext, by_head
from .gradients import GradientScores
from .weights import WeightScores

# The registry: every family, in the order they run (activations before ablation: abl_mean uses mean_z). It computes
# exactly schema.METHODS; the learned methods (schema.LEARNED_METHODS: gate) are trained by headprune.gates instead.
FAMILIES: tuple[Family, ...] = (WeightScores(), ActivationScores(), GradientScores(), AblationScores())
assert sorted(m for f in FAMILIES for m in f.methods) == sorted(METHODS), "schema.METHODS and FAMILIES disagree"


@dataclass
class HeadScores:
    """The result of :func:`score_heads`."""

    table: pd.DataFrame  # layer, head, head_id, model_fingerprint, one column per method
    means: dict[Head, torch.Tensor] | None = None  # z̄ [d_head] per head, where a data family ran
    baseline: dict | None = None  # {tokens, nll} of the unablated model, where ablation ran
    seconds: dict[str, float] = field(default_factory=dict)  # per family


def _bar(show: bool, desc: str) -> Callable[[Iterable], Iterable]:
    return lambda it: tqdm(it, desc=desc, disable=not show, leave=False)


def score_heads(
    model: GPT2,
    ids: torch.Tensor | None,  # None only when every method reads the weights alone
    methods: str | list[str] = "all",
    windowing: Windowing | None = None,
    ablation_rows: int | None = None,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> HeadScores:
    """Score every head of ``model`` on token ids ``ids`` (1-D) with each of ``methods``.

    ``windowing``: default ``Windowing.resolve(n_positions)`` (non-overlapping full-length windows, 8 a batch).
    ``ablation_rows``: ablated copies × windows per forward (default: 8 on the CPU, where larger batches
    only cost cache, 64 on a GPU, where batching copies is the win).
    """
    methods = parse_methods(methods)
    model.require_heads(f"scoring ({', '.join(methods)})")
    windowing = windowing or Windowing.resolve(model.cfg.n_positions)
    families = [f for f in FAMILIES if f.wanted(methods)]
    needs_data = any(f.needs_data for f in families)
    assert ids is not None or not needs_data, "data-based methods need token ids"
    batches = windowing.batches(ids) if ids is not None and needs_data else []
    rows = ablation_rows or (64 if model.device.type == "cuda" else 8)
    ctx = ScoringContext(model, batches, methods, rows)
    progress = progress or NoProgress()
    columns: dict[str, torch.Tensor] = {}
    seconds: dict[str, float] = {}
    for family in families:
        t0 = time.perf_counter()
        results = run_units(family.units(ctx), progress, _bar(show_progress, family.name))
        out = family.combine(ctx, results)
        columns |= {m: v for m, v in out.items() if m in methods}
        ctx.outputs |= {k: v for k, v in out.items() if k not in METHODS}
        seconds[family.name] = time.perf_counter() - t0

    heads = model.head_ids
    table = pd.DataFrame({"layer": [l for l, _ in heads], "head": [h for _, h in heads],
                          "head_id": [head_id(l, h) for l, h in heads], "model_fingerprint": model_fingerprint(model)})
    for m in methods:
        table[m] = columns[m].tolist()
    means = by_head(model, ctx.outputs["mean_z"].to(model.dtype)) if "mean_z" in ctx.outputs else None
    baseline = None
    if "baseline_nll" in ctx.outputs:
        baseline = {"tokens": int(ctx.outputs["baseline_tokens"]), "nll": float(ctx.outputs["baseline_nll"])}
    return HeadScores(table, means, baseline, seconds)


def head_means(
    model: GPT2,
    ids: torch.Tensor,
    windowing: Windowing | None = None,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> dict[Head, torch.Tensor]:
    """{(layer, head): z̄ [d_head]}: each head's mean output over the scored tokens (mean ablation's fill)."""
    windowing = windowing or Windowing.resolve(model.cfg.n_positions)
    family = ActivationScores()
    ctx = ScoringContext(model, windowing.batches(ids), ["abl_mean"])
    results = run_units(family.units(ctx), progress or NoProgress(), _bar(show_progress, "head means"))
    return by_head(model, family.combine(ctx, results)["mean_z"].to(model.dtype))
