"""``prune --uniform``: the best prune that stock transformers loads at smaller shapes.

A Llama-family layer with h query heads in h_kv groups of r = h/h_kv loads at smaller shapes when every layer keeps
the same h_kv' groups and the same r' query heads in each (then ``repeat_kv`` pairs them right). For every such
shape (h_kv', r'), 1 ≤ h_kv' ≤ h_kv, 1 ≤ r' ≤ r (for Llama also d a multiple of h_kv'·r', which transformers'
LlamaConfig requires), that removes L·(h − h_kv'·r') heads, the best choice under a score
s (higher = more important) is, in each layer independently: keep in each group its r' highest-scoring heads, and
keep the h_kv' groups whose kept heads score highest in sum. That maximises the total kept score Σ s over all
prunes of that shape (each layer's choice is separable, and within a group the top r' are optimal). Among the
shapes, the one whose removal count is nearest the asked k (ties: more removed, so a prune is never silently
dropped) is taken, and among shapes with that count the one keeping the highest total score.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.head_config import Head
from headprune.pruning.options import DEFAULT_SELECTION, Selection
from headprune.pruning.selection import _adjusted_scores, _check_amount, _check_frame, _how_many


def _layer_choice(values: dict[int, float], groups: list[list[int]], n_groups: int, per_group: int
                  ) -> tuple[float, list[int]]:
    """(kept score, kept heads) of one layer for shape (n_groups, per_group)."""
    best = []
    for g, heads in enumerate(groups):
        top = sorted(heads, key=lambda h: (-values[h], h))[:per_group]
        best.append((sum(values[h] for h in top), g, top))
    chosen = sorted(best, key=lambda t: (-t[0], t[1]))[:n_groups]
    return sum(t[0] for t in chosen), sorted(h for t in chosen for h in t[2])


def loadable_shapes(model: HeadModel) -> dict[tuple[int, int], int]:
    """{(h_kv', r'): heads the shape removes} for every uniform shape stock transformers loads (1 ≤ h_kv' ≤ h_kv,
    1 ≤ r' ≤ r): L·(h − h_kv'·r') each."""
    from headprune.models.families import loadable_head_count, model_type

    kind, cfg = model_type(model), model.cfg
    return {(g, p): cfg.n_layers * (cfg.n_heads - g * p) for g in range(1, cfg.n_kv_heads + 1)
            for p in range(1, cfg.group_size + 1) if loadable_head_count(kind, cfg.d_model, g * p)}


def uniform_heads(model: HeadModel, scores: pd.DataFrame, method: str, fraction: float | None = None,
                  count: int | None = None, selection: Selection = DEFAULT_SELECTION) -> list[Head]:
    """The heads to remove (least important first) for the best uniform prune near the asked amount."""
    from headprune.models.families import family_of, model_type

    kind = model_type(model)
    if not family_of(model).compact_export:
        raise HeadpruneError(f"--uniform shapes a grouped-query prune for a smaller hf export; {kind} derives its "
                             "head size from d/h, so its hf export always keeps the original shapes (use --per-layer "
                             "for the same count in every layer)")
    cfg = model.cfg
    if cfg.is_pruned:
        raise HeadpruneError("--uniform needs the unpruned model (every layer with all its heads)")
    _check_amount(fraction, count)
    frame = _check_frame(scores)
    adjusted = _adjusted_scores(frame, method, selection)
    values = {(int(l), int(h)): float(v) for l, h, v in zip(frame["layer"], frame["head"], adjusted)}
    L, h, r = cfg.n_layers, cfg.n_heads, cfg.group_size
    k = _how_many(L * h, fraction, count, "the model")
    removed_by = loadable_shapes(model)  # stock transformers builds its config
    nearest = min(sorted(set(removed_by.values())), key=lambda n: (abs(n - k), -n))
    groups = [list(range(g * r, (g + 1) * r)) for g in range(cfg.n_kv_heads)]
    best: tuple[float, list[list[int]]] | None = None
    for shape in (s for s, n in removed_by.items() if n == nearest):
        layers = [_layer_choice({hd: values[(layer, hd)] for hd in range(h)}, groups, *shape) for layer in range(L)]
        total = sum(t[0] for t in layers)
        if best is None or total > best[0]:
            best = (total, [t[1] for t in layers])
    assert best is not None
    removed = [(layer, hd) for layer, kept in enumerate(best[1]) for hd in range(h) if hd not in kept]
    order = np.lexsort(([hd for _, hd in removed], [layer for layer, _ in removed],
                        [values[x] for x in removed]))
    return [removed[i] for i in order]
