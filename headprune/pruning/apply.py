"""Prune a model as ``headprune prune`` does, from Python: compensation fitted on data, then before/after perplexity.

    compensate = "none":    the heads' outputs become 0
                 "mean":    each head's z̄ over ``ids`` folds into b_O (:func:`headprune.scoring.head_means`)
                 "optimal": the constants optimal for removing these heads together, fitted on ``ids``
                            (:func:`headprune.scoring.joint_constants`, Li & Janson 2024)
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.head_config import Head
from headprune.perplexity import Perplexity, Windowing, evaluate
from headprune.pruning.prune import prune_model

COMPENSATIONS = ("none", "mean", "optimal")

#: A prune that multiplies perplexity by more than this is worth recovering (``headprune finetune``).
DRASTIC = 2.0


def compensated_prune(model: HeadModel, heads: list[Head], compensate: str = "none", ids: Tensor | None = None,
                      windowing: Windowing | None = None, show_progress: bool = False) -> HeadModel:
    """``model`` without ``heads``, their outputs replaced as ``compensate`` says (fills fitted on ``ids``, 1-D)."""
    from headprune.scoring import head_means, joint_constants

    if compensate not in COMPENSATIONS:
        raise HeadpruneError(f"compensate must be one of {', '.join(COMPENSATIONS)}, got {compensate!r}",
                             "compensate")
    if compensate != "none" and ids is None:
        raise HeadpruneError(f"{compensate} compensation needs the token ids to fit its fills on", "compensate")
    w = windowing or Windowing.for_model(model)
    fills = None
    if compensate == "mean" and ids is not None:
        fills = head_means(model, ids, w, show_progress=show_progress)
    elif compensate == "optimal" and ids is not None:
        fills = joint_constants(model, ids, heads, w, show_progress=show_progress)
    return prune_model(model, heads, fills)


@dataclass(frozen=True)
class BeforeAfter:
    """Perplexity of a model and of its pruned copy on the same tokens and windows."""

    before: Perplexity
    after: Perplexity

    @property
    def delta_nll(self) -> float:
        return self.after.nll - self.before.nll

    @property
    def drastic(self) -> bool:
        """Whether the prune multiplied perplexity by more than :data:`DRASTIC`."""
        return self.after.ppl > DRASTIC * self.before.ppl


def before_after(model: HeadModel, pruned: HeadModel, ids: Tensor, windowing: Windowing | None = None,
                 progress: bool = False) -> BeforeAfter:
    """Perplexity of ``model`` and ``pruned`` on ``ids`` (1-D), with the same sliding windows."""
    w = windowing or Windowing.for_model(model)
    return BeforeAfter(evaluate(model, ids, w, progress=progress),
                       evaluate(pruned, ids, w, progress=progress))
