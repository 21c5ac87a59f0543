"""The one interface every scoring family implements (Torch-Pruning's ``Importance``, by family of methods).

A family turns a :class:`ScoringContext` into **units** — ``(key, fn)`` pairs, each a piece of work whose
JSON-serialisable result is recorded in a :class:`~headprune.io.work.progress.Progress` (so a killed sweep resumes,
and torchrun shares the units among processes) — and **combines** all unit results into one score per head
and method, a :class:`FamilyScores` (``{method: Tensor[H]}`` in ``model.head_ids`` order; data methods keep
per-window sums, so each also gets bootstrap replicates over windows; and typed :class:`SideOutputs` that later
families read). A new family is one module with one subclass of :class:`Family` named after its family in
:data:`headprune.schema.METHOD_TABLE`, plus one line in :data:`headprune.scoring.FAMILY_SCORERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from torch import Tensor

from headprune.bootstrap import Replicate
from headprune.models.base import HeadModel
from headprune.perplexity import Batch

Unit = tuple[str, Callable[[], Any]]  # (progress key, the work)


@dataclass
class SideOutputs:
    """What a family measures besides its scores, for later families and for the caller (None: not measured)."""

    mean_z: Tensor | None = None  # [H, d_k] float64, each head's mean output z̄ (activations; abl_mean's fill)
    opt_c: Tensor | None = None  # [H, d_k] float64, abl_opt's constants c* (the optimal fit)
    baseline_nll: float | None = None  # the unablated model's mean NLL on the scored tokens (ablation)
    baseline_tokens: int | None = None  # the tokens it was measured on

    def update(self, other: SideOutputs) -> None:
        """Take every output ``other`` measured."""
        for f in fields(other):
            if (value := getattr(other, f.name)) is not None:
                setattr(self, f.name, value)


@dataclass
class FamilyScores:
    """What :meth:`Family.combine` gives."""

    scores: dict[str, Tensor] = field(default_factory=dict)  # method -> Tensor[H], model.head_ids order
    replicates: dict[str, Replicate] = field(default_factory=dict)  # data method -> its bootstrap replicates
    side: SideOutputs = field(default_factory=SideOutputs)


@dataclass
class ScoringContext:
    """What a scoring run gives every family: the model, the scoring batches, the methods asked for."""

    model: HeadModel
    batches: list[Batch]
    methods: list[str]
    ablation_rows: int = 8  # ablated copies × windows per forward
    side: SideOutputs = field(default_factory=SideOutputs)  # what earlier families measured besides scores
    optimal_steps: int = 16  # passes of abl_opt's per-head BFGS fit per layer (see scoring/optimal.py)
    resample_draws: int = 4  # K source windows per window of abl_resample (see scoring/resample.py)
    resample_seed: int = 0  # seeds abl_resample's draws
    stream_sink: int = 4  # the context scores' streaming heads: first stream_sink tokens (see scoring/context.py)
    stream_recent: int = 256  # and the last stream_recent


class Family:
    """A family of scoring methods that share their work."""

    name: ClassVar[str]
    methods: ClassVar[tuple[str, ...]]
    needs_data: ClassVar[bool] = True

    def wanted(self, methods: list[str]) -> bool:
        """Whether a run asking for ``methods`` needs this family's work."""
        return bool(set(methods) & set(self.methods))

    def units(self, ctx: ScoringContext) -> list[Unit]:
        raise NotImplementedError

    def costs(self, ctx: ScoringContext, units: list[Unit]) -> list[float] | None:
        """Relative cost of each of ``units`` (for sharing them among processes), or None where they cost alike."""
        return None

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> FamilyScores:
        """Scores ``{method: Tensor[H]}`` from the unit results, with the family's side outputs and, for each
        data-dependent method, its replicates: a function from bootstrap window counts [B, W] to replicate
        scores [B, H] (:mod:`headprune.bootstrap`)."""
        raise NotImplementedError


def rows_per_forward(model: HeadModel, rows: int | None = None) -> int:
    """Ablated copies × windows per forward: ``rows``, or 64 on a GPU (batching copies is the win there) and 8 on
    the CPU (larger batches only cost cache)."""
    return rows or (64 if model.device.type == "cuda" else 8)


def by_head(model: HeadModel, flat: Tensor) -> dict[tuple[int, int], Tensor]:
    """A layer-major [H, ...] tensor -> {(layer, head): row}, in ``model.head_ids`` order."""
    return {head: flat[i] for i, head in enumerate(model.head_ids)}
