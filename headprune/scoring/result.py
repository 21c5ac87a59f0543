"""The result of :func:`~headprune.scoring.score_heads`, :class:`HeadScores`, saved and read back whole.

``scored.save("out/scores.parquet")`` (:func:`save_scores`) writes, each file atomically:

- the table at the path given (``.csv`` or ``.parquet``, by suffix);
- ``scores.means.safetensors``: the head means z̄_i [d_head] (``"L3H2/mean"``) and abl_opt's constants c*_i
  (``"L3H2/optimal"``), where the scoring measured them;
- ``scores.meta.json``: the unablated baseline ({tokens, nll}), the tokens read (their count, and the digest and
  windows of :func:`measured_on`) and each family's seconds;
- ``scores.replicates.safetensors``: each data method's scores on the bootstrap's resampled windows
  (:mod:`headprune.io.work.replicates`), where the scoring bootstrapped.

:func:`load_scores` reads the table and whatever of the rest is beside it (a table saved alone reads back with no
means), checking each mean belongs to a head of the table. A command reuses saved means only where they were
measured on the very tokens, in the very windows, it would measure them on (:func:`saved_means`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from headprune.data.tokens import token_digest
from headprune.errors import HeadpruneError
from headprune.io.work.files import beside, read_scores, write_bytes, write_json, write_table
from headprune.io.work.replicates import read_replicates, row_heads, write_replicates
from headprune.models.heads import head_id, parse_head_id
from headprune.models.interventions import Head
from headprune.perplexity import Windowing
from headprune.schema import HEAD_COLUMNS
from headprune.table_checks import check_scores

MEANS, META = ".means.safetensors", ".meta.json"
KINDS = ("mean", "optimal")  # the per-head vectors a HeadScores holds: means z̄ and abl_opt's constants c*


@dataclass
class HeadScores:
    """The result of :func:`~headprune.scoring.score_heads`."""

    table: pd.DataFrame  # layer, head, head_id, model_fingerprint, one column per method
    means: dict[Head, torch.Tensor] | None = None  # z̄ [d_head] per head, where a data family ran
    baseline: dict | None = None  # {tokens, nll} of the unablated model, where ablation ran
    seconds: dict[str, float] = field(default_factory=dict)  # per family
    optimal: dict[Head, torch.Tensor] | None = None  # c* [d_head] per head, where abl_opt ran
    tokens: int | None = None  # token ids read, where a data method ran
    measured_on: dict | None = None  # which tokens in which windows z̄ and c* were measured on (:func:`measured_on`)
    replicates: dict[str, np.ndarray] | None = None  # per data method [B, H]: on resampled windows, a column per row

    def save(self, table: str | os.PathLike) -> Path:
        """The table at ``table`` and the rest beside it (:func:`save_scores`)."""
        return save_scores(self, table)

    def _repr_html_(self) -> str:  # Jupyter's view: the key numbers and the top heads
        from headprune.display import scores_html

        return scores_html(self)

    def __repr__(self) -> str:  # print(scored), or a console: the same summary as text
        from headprune.display import scores_text

        return scores_text(self)


def measured_on(ids: torch.Tensor, windowing: Windowing) -> dict:
    """What a data method's results depend on besides the model: the tokens (their digest) and the windows they
    were read in (length, stride, BOS). Saved means are reused only where this is equal."""
    return {"tokens_digest": token_digest(ids), "seq_len": windowing.seq_len, "stride": windowing.stride,
            "bos": windowing.bos}


def save_scores(scored: HeadScores, table: str | os.PathLike) -> Path:
    """Write ``scored`` as the table ``table`` and the files beside it (module docstring); returns ``table``."""
    write_table(scored.table, table)
    save_beside(scored, table)
    return Path(table)


def save_beside(scored: HeadScores, table: str | os.PathLike) -> None:
    """What the table ``table`` (written by the caller: a run's report writes it) does not hold: the means, meta and
    replicates files beside it."""
    vectors = {f"{head_id(*h)}/{kind}": v.detach().cpu().contiguous()
               for kind, per_head in zip(KINDS, (scored.means, scored.optimal), strict=True) if per_head
               for h, v in per_head.items()}
    meta = {"baseline": scored.baseline, "tokens": scored.tokens, "measured_on": scored.measured_on,
            "seconds": {k: round(v, 3) for k, v in scored.seconds.items()}}
    means = beside(table, MEANS)
    if vectors:
        write_bytes(means, save_tensors(vectors))
    else:
        means.unlink(missing_ok=True)  # no stale means of an earlier save beside the new table
    write_json(beside(table, META), meta)
    write_replicates(table, scored.replicates, row_heads(scored.table))


def load_scores(table: str | os.PathLike) -> HeadScores:
    """The :class:`HeadScores` saved at ``table`` (the table alone where nothing was saved beside it). A table
    written by hand needs only ``layer, head`` and a method column; ``head_id`` is checked where present."""
    scores = check_scores(read_scores(table), HEAD_COLUMNS)
    heads = set(zip(scores["layer"].astype(int), scores["head"].astype(int), strict=True))
    per_kind = _read_vectors(beside(table, MEANS), heads)
    meta = _read_meta(beside(table, META))
    return HeadScores(scores, per_kind.get("mean"), meta.get("baseline"), dict(meta.get("seconds") or {}),
                      per_kind.get("optimal"), meta.get("tokens"), meta.get("measured_on"),
                      read_replicates(table, row_heads(scores)))


def saved_means(scored: HeadScores, ids: torch.Tensor, windowing: Windowing) -> dict[Head, torch.Tensor] | None:
    """``scored.means`` where they were measured on ``ids`` in ``windowing``'s windows, else None (measure them)."""
    return scored.means if scored.measured_on == measured_on(ids, windowing) else None


def _read_vectors(path: Path, heads: set[tuple[int, int]]) -> dict[str, dict[tuple[int, int], torch.Tensor]]:
    """{kind: {head: vector}} from ``path`` (empty where it is absent), every head one of ``heads``."""
    if not path.is_file():
        return {}
    try:
        tensors = load_tensors(path.read_bytes())
    except (OSError, SafetensorError) as err:
        raise HeadpruneError(f"cannot read {path} ({type(err).__name__}); remove it or save the scores again") \
            from None
    out: dict[str, dict[tuple[int, int], torch.Tensor]] = {}
    for key, vector in tensors.items():
        name, _, kind = key.partition("/")
        head = parse_head_id(name) if kind in KINDS else None
        if head not in heads or vector.dim() != 1 or not torch.isfinite(vector).all():
            raise HeadpruneError(f"{path} holds {key!r} ({list(vector.shape)}), not a finite vector of a head of "
                                 "its scores table; save the scores again")
        out.setdefault(kind, {})[head] = vector
    return out


def _read_meta(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadpruneError(f"cannot read {path} ({type(err).__name__}); remove it or save the scores again") \
            from None
    if not isinstance(meta, dict):
        raise HeadpruneError(f"{path} must hold a JSON object; save the scores again")
    return meta
