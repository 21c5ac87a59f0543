"""The one interface every scoring family implements (Torch-Pruning's ``Importance``, by family of methods).

A family turns a :class:`ScoringContext` into **units** — ``(key, fn)`` pairs, each a piece of work whose
JSON-serialisable result is recorded in a :class:`~headprune.io.progress.Progress` (so a killed sweep resumes,
and torchrun shares the units among processes) — and **combines** all unit results into one score per head
and method: ``{method: Tensor[H]}`` in ``model.head_ids`` order (data methods keep per-window sums, so
each also gets bootstrap replicates over windows). A new family is one module with one
subclass of :class:`Family`, plus one line in :data:`headprune.scoring.FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from headprune.models.gpt2 import GPT2
from headprune.perplexity import Batch

Unit = tuple[str, Callable[[], Any]]  # (progress key, the work)


@dataclass
class ScoringContext:
    """What a scoring run gives every family: the model, the scoring batches, the methods asked for."""

    model: GPT2
    batches: list[Batch]
    methods: list[str]
    ablation_rows: int = 8  # ablated copies × windows per forward
    outputs: dict[str, Tensor] = field(default_factory=dict)  # non-score results of earlier families (mean_z)
    optimal_steps: int = 16  # passes of abl_opt's per-head BFGS fit per layer (see scoring/optimal.py)
    resample_draws: int = 4  # K source windows per window of abl_resample (see scoring/resample.py)
    resample_seed: int = 0  # seeds abl_resample's draws


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

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> dict[str, Any]:
        """Scores ``{method: Tensor[H]}`` from the unit results, with any named outputs for later families and,
        for each data-dependent method, ``"boot:<method>"``: a function from bootstrap window counts [B, W]
        to replicate scores [B, H] (:mod:`headprune.bootstrap`)."""
        raise NotImplementedError


def by_head(model: GPT2, flat: Tensor) -> dict[tuple[int, int], Tensor]:
    """A layer-major [H, ...] tensor -> {(layer, head): row}, in ``model.head_ids`` order."""
    return {head: flat[i] for i, head in enumerate(model.head_ids)}
