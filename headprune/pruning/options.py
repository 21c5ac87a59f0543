"""The settings that travel together through selection, pruning and curves, as small frozen records.

``Selection`` says how heads are ranked; ``Compensation`` what replaces a pruned head's output; ``CurveOptions``
what a pruning curve measures; ``PruningOptions`` how a pruning removes its heads (steps, ranking, fills);
``ScoringData`` the data that heads are re-scored and fills fitted on; ``RecoveryData`` the tokens of a recovered
curve. A caller builds each once (the CLI from its options, ``headprune run`` from its settings) and hands it on
unchanged, so a recovered curve sees exactly the options of the curve it recovers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import TYPE_CHECKING

from headprune.bootstrap import DEFAULT_REPLICATES, check_replicates
from headprune.errors import HeadpruneError
from headprune.schema import COMPENSATIONS, DEFAULT_SEEDS

if TYPE_CHECKING:
    import torch

    from headprune.models.base import HeadModel
    from headprune.perplexity import Windowing

Head = tuple[int, int]
NORMALIZATIONS = (None, "layer")


@dataclass(frozen=True)
class Selection:
    """How heads are ranked before the lowest go.

    ``per_layer``: the same fraction (or count) from every layer; ``normalize="layer"``: each layer's scores
    divided by their L2 norm (Michel et al. 2019); ``standardize``: per-layer z-scores (FLAP); ``seed``: the
    random ranking's draw."""

    per_layer: bool = False
    normalize: str | None = None
    standardize: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.normalize not in NORMALIZATIONS:
            raise HeadpruneError(f"unknown normalize {self.normalize!r}; use 'layer' or none")
        if self.normalize and self.standardize:
            raise HeadpruneError("normalize and standardize both rescale each layer's scores; choose one")

    def with_seed(self, seed: int) -> Selection:
        return Selection(self.per_layer, self.normalize, self.standardize, seed)

    def by_layer(self) -> Selection:
        """This selection with each layer's scores L2-normalised (a ``<method>@layer`` ranking)."""
        return Selection(self.per_layer, "layer", False, self.seed)


@dataclass(frozen=True)
class Compensation:
    """What a pruned head leaves behind, folded into b_O: ``none``; ``mean`` its mean output z̄_i; ``optimal`` the
    constants optimal for removing a set of heads together (``optimal(heads)``, fitted per set).

    ``fill_data`` names where the means or constants were measured (written into curves and exports)."""

    means: Mapping[Head, torch.Tensor] | None = None
    optimal: Callable[[list[Head]], dict[Head, torch.Tensor]] | None = None
    fill_data: str = ""

    def check(self, kind: str) -> None:
        if kind not in COMPENSATIONS:
            raise HeadpruneError(f"compensation {kind!r} is not one of {', '.join(COMPENSATIONS)}")
        if kind == "mean" and self.means is None or kind == "optimal" and self.optimal is None:
            need = "mean outputs" if kind == "mean" else "optimal-ablation fit"
            raise HeadpruneError(f"{kind} compensation needs the heads' {need}; give the scoring data")

    def fills(self, kind: str, heads: list[Head]) -> dict[Head, torch.Tensor] | None:
        """The fills of ``heads`` under ``kind`` (None for ``none`` or no heads)."""
        self.check(kind)
        if kind == "none" or not heads:
            return None
        if kind == "mean":
            assert self.means is not None
            return {h: self.means[h] for h in heads}
        assert self.optimal is not None
        return self.optimal(heads)


@dataclass(frozen=True)
class CurveOptions:
    """What a pruning curve measures: ``fractions`` of all heads removed, ``seeds`` random rankings (from
    ``selection.seed``), ``bootstrap`` replicates per interval, ``head_sets`` chosen elsewhere per
    (method, fraction) (learned gates), and ``recovery``: the training of every pruned model before it is
    evaluated (``curve --recover``; None: evaluated as pruned)."""

    fractions: tuple[float, ...]
    seeds: int = DEFAULT_SEEDS
    bootstrap: int = DEFAULT_REPLICATES
    selection: Selection = field(default_factory=Selection)
    windowing: Windowing | None = None  # the evaluation windows (default: Windowing.for_model, no overlap)
    head_sets: Mapping[tuple[str, float], list[Head]] | None = None
    recovery: Recovery | None = None

    def check(self) -> CurveOptions:
        """Refuse, before any evaluation: no fractions, a fraction twice or outside [0, 1], fewer than 1 seed, or
        1 or a negative count of bootstrap replicates."""
        whole = lambda v: isinstance(v, Integral) and not isinstance(v, bool)
        if not self.fractions:
            raise HeadpruneError("fractions is empty: give at least one fraction of heads to remove", "fractions")
        for f in self.fractions:
            if isinstance(f, bool) or not isinstance(f, Real) or not 0.0 <= f <= 1.0:
                raise HeadpruneError(f"fraction {f!r} must be a number in [0, 1]", "fractions")
        if len(set(self.fractions)) != len(self.fractions):
            twice = sorted({f for f in self.fractions if self.fractions.count(f) > 1})
            raise HeadpruneError(f"fraction {twice[0]!r} is given twice; give each fraction once", "fractions")
        if not whole(self.seeds) or self.seeds < 1:
            raise HeadpruneError(f"seeds {self.seeds!r} must be a whole number ≥ 1 (random rankings per fraction)",
                                 "seeds")
        check_replicates(self.bootstrap)
        return self


@dataclass(frozen=True)
class Recovery:
    """``curve --recover``: every pruned model is trained in place by ``train`` (``steps`` steps) before it is
    evaluated."""

    steps: int
    train: Callable[[HeadModel], object]


@dataclass(frozen=True)
class RecoveryData:
    """The tokens of a recovered curve (``curve --recover``): ``ids`` it is evaluated on, and ``train_ids`` every
    pruned point is fine-tuned on beforehand, ``steps`` steps (at least 1)."""

    ids: torch.Tensor
    train_ids: torch.Tensor
    steps: int


@dataclass(frozen=True)
class PruningOptions:
    """How :func:`~headprune.pruning.iterative.prune_iteratively` removes its heads: in ``steps`` steps (1: one-shot;
    more: the remaining heads re-scored before each step after the first), ranked by ``selection``, with
    ``compensate`` "mean" / "optimal" each step's fills folded into b_O ("none": none)."""

    steps: int = 1
    selection: Selection = field(default_factory=Selection)
    compensate: str = "none"


@dataclass(frozen=True)
class ScoringData:
    """Token ids that heads are re-scored and fills fitted on, and the windows they are read in."""

    ids: torch.Tensor
    windowing: Windowing | None = None


DEFAULT_SELECTION = Selection()
NO_COMPENSATION = Compensation()
ONE_SHOT = PruningOptions()
