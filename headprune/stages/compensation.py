"""The compensation stage: what a pruned head leaves behind in b_O, fitted on the scoring split (never on the
tokens a curve is measured on) - the fills ``run`` and ``curve`` both fold into their compensated curves."""

from __future__ import annotations

from collections.abc import Collection
from functools import partial
from typing import TYPE_CHECKING

from headprune.pruning.options import Compensation

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from headprune.io.work.progress import Progress
    from headprune.models.base import HeadModel
    from headprune.models.head_config import Head
    from headprune.perplexity import Windowing


def compensation_stage(model: HeadModel, score_ids: Tensor | None, windowing: Windowing, *, kinds: Collection[str],
                       fill_data: str, means: dict[Head, torch.Tensor] | None = None,
                       progress: Progress | None = None, quiet: bool = False) -> Compensation:
    """The fills of the compensations ``kinds`` ("mean", "optimal"; empty: none): each head's mean output
    z̄_i = E[z_i] over ``score_ids`` (``means`` where the activation scores already measured them; else measured
    here, resumable through ``progress``), and for "optimal" the constants c* optimal for ablating a pruned set
    together (Li & Janson), fitted per set when a curve asks, starting from z̄. ``fill_data`` says where."""
    if not kinds or score_ids is None:
        return Compensation(fill_data=fill_data)
    from headprune.scoring import head_means, joint_constants

    if means is None:
        means = head_means(model, score_ids, windowing, progress=progress, show_progress=not quiet)
    else:  # read from a file (on the CPU, in the dtype they were saved in) or handed over by the scoring stage
        means = {h: m.to(model.device, model.dtype) for h, m in means.items()}
    optimal = (partial(joint_constants, model, score_ids, windowing=windowing, means=means, show_progress=False)
               if "optimal" in kinds else None)
    return Compensation(means=means, optimal=optimal, fill_data=fill_data)
