"""The streaming curve: KV heads made streaming (:mod:`headprune.models.streaming`) in the order a ranking gives,
least need for the context first, against the long-window NLL and the long tasks' accuracy, with the KV cache's
bytes (:mod:`headprune.models.kv_cache`) beside each point.

A point is measured once per set of streaming heads (the full model and "every head streaming" are shared by all
rankings), as per-window tail NLLs [W] and per-prompt right/wrong [P], so its intervals resample the windows and
the prompts, paired with the full model's on the same ones (:mod:`.choice`). Points are recorded in a progress file
as they finish: an interrupted curve resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
from torch import Tensor
from tqdm import tqdm

from headprune.context import DEFAULT_SHARES
from headprune.errors import HeadpruneError
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.kv_cache import KVHead, kv_bytes_table, kv_heads
from headprune.models.streaming import Streaming, kv_alpha
from headprune.patching.long_tasks import LongPrompt, LongTask, run_task, tail_nll_rows

#: Context lengths whose KV-cache bytes stand beside each point.
KV_CONTEXTS = (2048, 8192, 32768)


@dataclass(frozen=True)
class LongProbe:
    """What each point of the curve measures: the NLL of the last ``tail`` tokens of ``windows`` (W, T) and the
    answers of ``prompts``, with streaming heads keeping ``sink`` + ``recent`` positions."""

    windows: Tensor
    tail: int
    prompts: Sequence[LongPrompt]
    sink: int
    recent: int


def kv_need(model: HeadModel, scores: Mapping[tuple[int, int], float]) -> dict[KVHead, float]:
    """A KV head's need for the context: the largest score of the query heads reading it (it must stay full when
    any of them needs the context). ``scores``: {(layer, query head): score}, higher = more need."""
    need: dict[KVHead, float] = {}
    for (layer, head), value in scores.items():
        key = (layer, model.cfg.kv_head(head))
        need[key] = max(need.get(key, -np.inf), float(value))
    missing = [k for k in kv_heads(model) if k not in need or not np.isfinite(need[k])]
    if missing:
        raise HeadpruneError(f"no finite score for KV heads {missing[:4]}{' ...' if len(missing) > 4 else ''}",
                             "scores")
    return need


def streaming_order(model: HeadModel, scores: Mapping[tuple[int, int], float]) -> list[KVHead]:
    """KV heads, the least need first (ties in layer-major order): the order in which they go streaming."""
    need = kv_need(model, scores)
    return sorted(kv_heads(model), key=lambda k: (need[k], k))


def random_order(model: HeadModel, seed: int) -> list[KVHead]:
    """The KV heads shuffled with ``seed``."""
    order = kv_heads(model)
    random.Random(seed).shuffle(order)
    return order


def streaming_layers(model: HeadModel, heads: Sequence[KVHead], sink: int, recent: int) -> dict[int, Streaming]:
    """{layer: Streaming} with the query heads of ``heads`` at α = 0, the others full."""
    by_layer: dict[int, list[int]] = {}
    for layer, g in heads:
        by_layer.setdefault(layer, []).append(g)
    return {layer: Streaming(kv_alpha(model, layer, gs), sink, recent) for layer, gs in sorted(by_layer.items())}


def measure_point(model: HeadModel, probe: LongProbe, heads: Sequence[KVHead]) -> dict[str, list]:
    """{"tail_nll": [W] per-window mean tail NLL, "right": [P] 0/1} with ``heads`` streaming."""
    layers = streaming_layers(model, heads, probe.sink, probe.recent)
    right = run_task(model, LongTask("probe", list(probe.prompts)), layers).right if probe.prompts else []
    return {"tail_nll": tail_nll_rows(model, probe.windows, probe.tail, layers).tolist(),
            "right": [int(r) for r in right]}


def point_key(heads: Sequence[KVHead]) -> str:
    """A progress unit's name for a set of streaming heads (order-free)."""
    text = ";".join(f"{layer}.{g}" for layer, g in sorted(heads))
    return f"n{len(heads)}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def check_shares(shares: Sequence[float]) -> None:
    """HeadpruneError unless ``shares`` is a non-empty list of shares in (0, 1]."""
    bad = [s for s in shares if not 0 < s <= 1]
    if bad or not shares:
        raise HeadpruneError(f"streaming shares must lie in (0, 1], got {bad or list(shares)}", "shares")


def share_counts(n_kv: int, shares: Sequence[float]) -> list[int]:
    """KV heads streaming at each share (rounded, distinct, ascending), 0 first."""
    check_shares(shares)
    return sorted({0, *(round(s * n_kv) for s in shares)})


def streaming_curve(model: HeadModel, probe: LongProbe, orders: Mapping[str, Sequence[KVHead]],
                    shares: Sequence[float] = DEFAULT_SHARES, progress: Progress | NoProgress | None = None,
                    show_progress: bool = True, measured: Mapping[str, dict] | None = None
                    ) -> tuple[pd.DataFrame, dict[str, dict[str, list]]]:
    """(curve, points): the curve has one row per (ranking, share) with ranking, n_streaming, share and the
    KV-cache bytes at :data:`KV_CONTEXTS` (``kv_bytes_2048``, ...) and the point's key; ``points`` maps each key to
    :func:`measure_point`'s per-window and per-prompt values (each set measured once; ``measured``: points already
    measured, by key)."""
    progress = progress or NoProgress()
    n_kv = len(kv_heads(model))
    counts = share_counts(n_kv, shares)
    rows, todo = [], {}
    for name, order in orders.items():
        if sorted(order) != sorted(kv_heads(model)):
            raise HeadpruneError(f"ranking {name} does not order every KV head of the model once", "orders")
        for n in counts:
            heads = list(order[:n])
            key = point_key(heads)
            todo[key] = heads
            kv = kv_bytes_table(model, KV_CONTEXTS, heads, probe.sink, probe.recent)
            rows.append({"ranking": name, "n_streaming": n, "share": n / n_kv, "point": key,
                         **{f"kv_bytes_{c}": b for c, b in kv.items()}})
    measured = measured or {}
    bar = tqdm(todo.items(), desc="streaming curve", disable=not show_progress, leave=False)
    points = {key: measured[key] if key in measured else
              progress.get_or_compute(key, partial(measure_point, model, probe, heads)) for key, heads in bar}
    return pd.DataFrame(rows), points
