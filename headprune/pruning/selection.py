"""Choose the heads to prune from a scores table.

A scores table has one row per head, columns ``layer``, ``head`` (original index), ``head_id`` and one
column per importance method; for every method a HIGHER score means MORE important, so the lowest scores
are pruned first. ``entropy`` describes attention patterns and is no importance: it is refused.
``random`` needs no column: its scores are u ~ U(0,1) from ``numpy.random.default_rng(seed)``, drawn in
(layer, head) order.

Before ranking, scores s_{l,i} of layer l may be rescaled within each layer (ranking within a layer is
unchanged; only the comparison across layers is):
  normalize="layer"   s_{l,i} / ‖s_l‖₂                         (Michel et al., 2019)
  standardize=True    (s_{l,i} − mean(s_l)) / std(s_l)         (FLAP, An et al., 2024; population std)
A layer whose norm (or std) is 0 gets all zeros. Ties are broken by (layer, head), ascending.
"""

from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprune.errors import HeadpruneError
from headprune.models.heads import head_id
from headprune.pruning.options import DEFAULT_SELECTION, Selection
from headprune.schema import DESCRIPTIVE, HEAD_COLUMNS, RANDOM, method_columns, split_ranking
from headprune.table_checks import check_scores

if TYPE_CHECKING:  # torch-free at import: the report ranks heads without a model
    from headprune.models.base import HeadModel



def _check_frame(scores: pd.DataFrame) -> pd.DataFrame:
    """The frame sorted by (layer, head) with a fresh index; one row per head."""
    return check_scores(scores, HEAD_COLUMNS, need_method=False)


def _raw_scores(frame: pd.DataFrame, method: str, seed: int) -> np.ndarray:
    """Importance per row of the (layer, head)-sorted frame, float64 [n_rows]."""
    if method in DESCRIPTIVE:
        raise HeadpruneError(
            f"method {method!r} describes attention patterns and does not rank importance; prune by another "
            f"method ({', '.join(c for c in method_columns(frame) if c not in DESCRIPTIVE) or 'random'})"
        )
    if method == RANDOM:
        return np.random.default_rng(seed).random(len(frame))
    if method not in frame.columns:
        raise HeadpruneError(
            f"scores table has no column {method!r}; its methods are {method_columns(frame)} (or use random)"
        )
    col = frame[method]
    if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
        raise HeadpruneError(f"scores column {method!r} is not numeric")
    values = col.to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        r = frame[bad].iloc[0]
        raise HeadpruneError(
            f"scores column {method!r} has {int(bad.sum())} NaN/inf value(s) (first: head "
            f"{head_id(r['layer'], r['head'])}); recompute the scores"
        )
    return values


def _per_layer(values: np.ndarray, layers: np.ndarray, fn) -> np.ndarray:
    """Apply ``fn`` to each layer's block of values."""
    out = np.empty_like(values)
    for layer in np.unique(layers):
        sel = layers == layer
        out[sel] = fn(values[sel])
    return out


def _unit_max(s: np.ndarray) -> np.ndarray:
    """s / max|s|: both rescalings are scale-invariant, and this keeps s² from underflowing (1e-200² = 0)."""
    peak = np.abs(s).max(initial=0.0)
    return s / peak if peak > 0 else s


def _l2_normalize(s: np.ndarray) -> np.ndarray:
    s = _unit_max(s)
    norm = np.sqrt(np.sum(s * s))
    return s / norm if norm > 0 else np.zeros_like(s)


def _zscore(s: np.ndarray) -> np.ndarray:
    s = _unit_max(s)
    std = s.std()
    return (s - s.mean()) / std if std > 0 else np.zeros_like(s)


def _adjusted_scores(
    frame: pd.DataFrame, method: str, selection: Selection
) -> np.ndarray:
    values = _raw_scores(frame, method, selection.seed)
    if method == RANDOM:
        return values  # already exchangeable across all heads; rescaling per layer would bias it
    layers = frame["layer"].to_numpy()
    if selection.normalize == "layer":
        values = _per_layer(values, layers, _l2_normalize)
    if selection.standardize:
        values = _per_layer(values, layers, _zscore)
    return values


def rank_heads(
    scores: pd.DataFrame, method: str, selection: Selection = DEFAULT_SELECTION
) -> list[tuple[int, int]]:
    """All heads of the table, least important first: ascending (adjusted score, raw score, layer, head).

    The raw score breaks ties that rescaling's rounding creates, so the order within a layer never changes.
    """
    frame = _check_frame(scores)
    values = _adjusted_scores(frame, method, selection)
    raw = _raw_scores(frame, method, selection.seed)
    layers, heads = frame["layer"].to_numpy(), frame["head"].to_numpy()
    order = np.lexsort((heads, layers, raw, values))  # last key is primary
    return [(int(layers[i]), int(heads[i])) for i in order]


def _check_amount(fraction: float | None, count: int | None) -> None:
    if (fraction is None) == (count is None):
        raise HeadpruneError("give exactly one of fraction and count (how many heads to prune)")
    is_number = isinstance(fraction, Real) and not isinstance(fraction, bool)
    if fraction is not None and not (is_number and 0.0 <= fraction <= 1.0):
        raise HeadpruneError(f"fraction {fraction!r} must be a number in [0, 1]")
    if count is not None and (isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0):
        raise HeadpruneError(f"count {count!r} must be a whole number >= 0")


def _how_many(n: int, fraction: float | None, count: int | None, where: str) -> int:
    """round(fraction · n) (Python's round: halves to even) or count, which must be <= n."""
    if fraction is not None:
        return round(fraction * n)
    assert count is not None  # _check_amount: exactly one of fraction and count
    if count > n:
        raise HeadpruneError(f"cannot prune {count} heads: {where} has only {n}")
    return int(count)


def select_heads(
    scores: pd.DataFrame,
    method: str,
    fraction: float | None = None,
    count: int | None = None,
    selection: Selection = DEFAULT_SELECTION,
) -> list[tuple[int, int]]:
    """The heads to prune, in ranking order (least important first).

    Global: the k = round(fraction · N) (or ``count``) lowest of all N heads.
    ``per_layer``: the k_l = round(fraction · n_l) (or ``count``) lowest of each layer's n_l heads.
    """
    _check_amount(fraction, count)
    ranked = rank_heads(scores, method, selection)
    if not selection.per_layer:
        return ranked[: _how_many(len(ranked), fraction, count, "the scores table")]
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for layer, head in ranked:
        by_layer.setdefault(layer, []).append((layer, head))
    take = {layer: _how_many(len(hs), fraction, count, f"layer {layer}") for layer, hs in by_layer.items()}
    chosen = {h for layer, hs in by_layer.items() for h in hs[: take[layer]]}
    return [h for h in ranked if h in chosen]


def ranking_heads(scores: pd.DataFrame, ranking: str, fraction: float,
                  selection: Selection = DEFAULT_SELECTION) -> list[tuple[int, int]]:
    """:func:`select_heads` by a curve's ranking: ``"<method>"``, or ``"<method>@layer"`` (each layer's scores
    L2-normalised first)."""
    name, by_layer = split_ranking(ranking)
    return select_heads(scores, name, fraction=fraction, selection=selection.by_layer() if by_layer else selection)


def check_scores_match(scores: pd.DataFrame, model: HeadModel, source: str | None = None) -> None:
    """HeadpruneError unless the table's heads are exactly the model's heads, its scores finite, and its
    ``model_fingerprint`` column (required) equals :func:`headprune.io.read.fingerprint.model_fingerprint` of the
    model."""
    from headprune.io.read.fingerprint import model_fingerprint

    frame = _check_frame(scores)
    name = f"scores file {source}" if source else "scores file"
    theirs = set(zip(frame["layer"].tolist(), frame["head"].tolist()))
    ours = set(model.head_ids)
    hint = "recompute the scores with this model or pass the model they came from"
    if theirs != ours:
        extra, lacking = sorted(theirs - ours), sorted(ours - theirs)
        detail = (f"it has {len(extra)} head(s) the model lacks (first {head_id(*extra[0])})" if extra
                  else f"it lacks {len(lacking)} of the model's heads (first {head_id(*lacking[0])})")
        raise HeadpruneError(f"{name} is from another model: {detail}; {hint}")
    if "model_fingerprint" not in frame.columns:  # every table headprune writes has it: the column was removed
        raise HeadpruneError(f"{name} has no model_fingerprint column, so nothing says which model it scores; "
                             f"{hint}")
    prints = set(frame["model_fingerprint"].astype(str))
    mine = model_fingerprint(model)
    if prints != {mine}:
        raise HeadpruneError(f"{name} is from another model (fingerprint {min(prints)}, this model's is {mine}); "
                             f"{hint}")
