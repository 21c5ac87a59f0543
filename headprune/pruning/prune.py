"""Remove attention heads physically (a smaller model; exports: :mod:`headprune.io.write.export`).

Attention output of a layer with heads i (W_O^(i) = rows i·d_k..(i+1)·d_k of W_O):

    out = Σ_i z_i W_O^(i) + b_O

Pruning a set P of heads drops their terms. Mean compensation replaces z_i (i ∈ P) by its mean z̄_i over
the data instead of 0; a constant term, it folds into the bias:

    out = Σ_{i∉P} z_i W_O^(i) + (b_O + Σ_{i∈P} z̄_i W_O^(i))

so the physically pruned model equals the mean-ablated one (gates 0, fills z̄) up to rounding. Optimal
compensation folds constants fitted to be optimal for ablating the set P together (Li & Janson, 2024;
:func:`headprune.scoring.joint_constants`) the same way: any constant fill does.

Physical pruning keeps, per layer, only the remaining heads' Q rows and W_O row blocks (and the KV heads they
still read), in each family's own layout (``HeadAttention.pruned_state``); ``cfg.kept_heads`` records the ORIGINAL
indices of the heads left. A layer may keep no head (its attention adds b_O only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import Tensor

from headprune.models.base import HeadModel
from headprune.models.head_config import Head
from headprune.models.prune import prune_heads, removed_heads

__all__ = ["prune_model", "removed_heads"]



def prune_model(model: HeadModel, heads: Iterable[Head], fills: Mapping[Head, Tensor] | None = None, *,
                share: bool = False) -> HeadModel:
    """A new, physically smaller model without query ``heads`` (the input is not changed): see
    :func:`headprune.models.prune.prune_heads`, which every family shares.

    ``fills``: {(layer, head): z̄ [d_head]}, the mean output of each pruned head; when given, Σ z̄_i W_O^(i)
    is folded into each layer's b_O, so the result equals ``model(tokens, mask_gates(...), fill_tensors(...))``.
    ``share``: unchanged tensors are the input's, not copies (an evaluated model only; see :func:`prune_heads`).
    """
    return prune_heads(model, heads, fills, share)
