"""Head anatomy: what each head does, how heads compose, what they write (descriptions, never used to prune).

- :mod:`.roles` previous-token, duplicate-token and induction scores (TransformerLens ``detect_head``, "mul");
- :mod:`.composition` Q/K/V-composition between heads of different layers (Elhage et al., 2021), from
  d_k×d_k cores;
- :mod:`.attribution` direct logit attribution to the correct next token, final LayerNorm scale frozen;
- :mod:`.copying` the copying score of each head's full OV circuit, from its d_k×d_k core;
- :mod:`.geometry` singular values, effective rank and row-space overlap of the W_O^(i).

:func:`head_anatomy` runs them all and joins the per-head results into one table.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from headprune.anatomy.attribution import Attribution, logit_attribution
from headprune.anatomy.composition import composition_from_weights, composition_scores
from headprune.anatomy.copying import copying_scores
from headprune.anatomy.geometry import effective_rank, wo_geometry
from headprune.anatomy.roles import ROLES, detect_heads, head_patterns, repeated_random_tokens
from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel

__all__ = [
    "HEAD_COLUMNS",
    "Anatomy",
    "composition_from_weights",
    "composition_scores",
    "copying_scores",
    "corpus_rows",
    "detect_heads",
    "effective_rank",
    "head_anatomy",
    "head_patterns",
    "logit_attribution",
    "repeated_random_tokens",
    "wo_geometry",
]

CORPUS_ROLES = ("previous_token", "duplicate_token")
#: The per-head columns of :func:`head_anatomy`, after layer, head, head_id.
HEAD_COLUMNS = (*ROLES, *(f"{r}_corpus" for r in CORPUS_ROLES), "dla", "copying", "wo_sv_max", "wo_eff_rank",
                "wo_overlap", "wo_overlap_rest")


@dataclass
class Anatomy:
    """heads: one row per head (layer, head, head_id, HEAD_COLUMNS); composition: one row per pair of heads of
    different layers; singular_values: one row per head and index; pairs: W_O row-space overlap of the pairs of
    heads of a layer; attribution: the full DLA decomposition."""

    heads: pd.DataFrame
    composition: pd.DataFrame
    singular_values: pd.DataFrame
    pairs: pd.DataFrame
    attribution: Attribution

    def _repr_html_(self) -> str:  # Jupyter's view: the key numbers and the top heads
        from headprune.display import anatomy_html

        return anatomy_html(self)


def corpus_rows(ids: Tensor, seq_len: int, rows: int, bos: int | None = None) -> Tensor:
    """The first ``rows`` non-overlapping windows of ``seq_len`` tokens of 1-D ``ids``: (n, seq_len), n ≤ rows
    (one shorter row when ids has fewer than seq_len tokens); each after ``bos`` where one is given (the model's
    BOS token: one more column)."""
    if len(ids) < 2:
        raise HeadpruneError(f"the corpus has {len(ids)} token(s); head anatomy needs at least 2")
    n = max(1, min(rows, len(ids) // seq_len))
    windows = ids[: n * seq_len].view(n, -1) if len(ids) >= seq_len else ids.view(1, -1)
    return windows if bos is None else torch.cat([windows.new_full((len(windows), 1), bos), windows], dim=1)


def head_anatomy(model: HeadModel, probe: Tensor, corpus: Tensor, *, batch_size: int = 8) -> Anatomy:
    """Every anatomy measure of every head: roles on ``probe`` (B,T; the repeated random tokens) and the
    previous/duplicate-token roles and DLA on ``corpus`` (B,T rows of real text); weights for the rest."""
    model.require_heads("head anatomy")
    key = ["layer", "head", "head_id"]
    roles = detect_heads(model, probe, batch_size)
    on_corpus = detect_heads(model, corpus, batch_size, CORPUS_ROLES)
    on_corpus = on_corpus.rename(columns={r: f"{r}_corpus" for r in CORPUS_ROLES})
    attribution = logit_attribution(model, corpus, batch_size)
    geometry, singular_values, pairs = wo_geometry(model)
    heads = roles.merge(on_corpus, on=key).merge(attribution.heads, on=key).merge(copying_scores(model), on=key)
    heads = heads.merge(geometry, on=key)[[*key, *HEAD_COLUMNS]]
    with torch.no_grad():
        composition = composition_scores(model)
    return Anatomy(heads, composition, singular_values, pairs, attribution)
