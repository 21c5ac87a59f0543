"""Head sets ablated together (or KV head sets made streaming together: :class:`Intervention`), measured on the
corpus: each set's NLL sum per window from batched copies run from the set's lowest layer on a cached residual stream
(:func:`ablated_sums`), and the resumable sweep of many sets that :func:`~.verified.verify_ranking` measures its
verified heads and random subsets with (:class:`SetSweep`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from headprune.io.work.distributed import run_units
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.interventions import Head, mask_gates
from headprune.models.nll import unembed_nll
from headprune.models.streaming import Streaming, streaming
from headprune.perplexity import Batch, window_sums
from headprune.scoring.ablation import batch_caches

CHUNK = 8  # head sets per resumable unit


@dataclass(frozen=True)
class Intervention:
    """What a head set's heads undergo together: ablation, the set's query heads' z zeroed (``fills`` None, or
    None for a layer) or replaced by ``fills`` (per layer [n_heads_l, d_head]); or, with ``stream`` = (sink,
    recent), the set naming KV heads (layer, KV head index), each of them streaming
    (:mod:`headprune.models.streaming`: every query head reading it sees only the first ``sink`` tokens and the last
    ``recent``)."""

    fills: list[Tensor | None] | None = None
    stream: tuple[int, int] | None = None

    def run(self, model: HeadModel, resid: Tensor, start: int, keep: list[Tensor], b: int) -> Tensor:
        """``resid`` (c·b, T, d) run from layer ``start``, copy j with what ``keep[l][j]`` (1 kept, 0 intervened
        on; per query head) leaves of layer l."""
        rows = [k.to(model.device).repeat_interleave(b, dim=0) if not bool(k.all()) else None for k in keep]
        if self.stream is None:
            return model.run_blocks(resid, start=start, gates=rows, fills=self.fills)
        sink, recent = self.stream
        layers = {layer: Streaming(alpha.float(), sink, recent) for layer, alpha in enumerate(rows)
                  if alpha is not None}
        with streaming(model, layers):
            return model.run_blocks(resid, start=start)

    def keep(self, model: HeadModel, heads: list[Head]) -> list[Tensor]:
        """Per layer [h_l] bool: the query heads the set leaves alone (streaming: those not reading its KV heads)."""
        if self.stream is None:
            return mask_gates(model, heads)
        return [torch.tensor([(layer, kv) not in heads for kv in model.h[layer].attn.kv_positions])
                for layer in range(model.cfg.n_layers)]


ZERO = Intervention()  # zero ablation: no fills at any layer


@torch.no_grad()
def ablated_sums(
    model: HeadModel,
    batch: Batch,
    resid_pre: dict[int, Tensor],  # (b, T, d) entering each layer, from cache_batch
    sets: list[list[Head]],
    how: Intervention = ZERO,
    rows: int = 8,
) -> list[list[float]]:
    """NLL sum of each window of ``batch`` with each head set intervened on together (``how``): [len(sets)][b].
    Sets run as batched copies, each from the lowest layer of its chunk (pass sets sorted by their lowest layer)."""
    b = batch.tokens.shape[0]
    tokens, mask = batch.tokens.to(model.device), batch.mask.to(model.device)
    copies = max(1, rows // b)
    sums: list[list[float]] = []
    for first in range(0, len(sets), copies):
        chunk = sets[first : first + copies]
        start = min((layer for heads in chunk for layer, _ in heads), default=0)  # an empty set: the baseline
        keep = [torch.stack(layer) for layer in zip(*(how.keep(model, heads) for heads in chunk))]  # [c, h_l]
        resid = how.run(model, resid_pre[start].repeat(len(chunk), 1, 1), start, keep, b)
        for copy in resid.split(b):
            sums.append(window_sums(unembed_nll(model, copy, tokens), mask))
    return sums


def _lowest_layer_first(sets: list[list[Head]]) -> list[int]:
    return sorted(range(len(sets)), key=lambda i: min((layer for layer, _ in sets[i]), default=0))


class SetSweep:
    """Corpus ΔL (nats/token) of head sets ablated together, in resumable units: batch by batch (one cached
    residual stream held), :data:`CHUNK` sets per unit, lowest layer first; the first call also measures each
    batch's baseline. Units are keyed under ``prefix`` (default ``verify/{method}``): sweeps of other batches that
    share a progress file need their own."""

    def __init__(self, model: HeadModel, method: str, batches: list[Batch], how: Intervention, rows: int,
                 progress: Progress | NoProgress, show_progress: bool, prefix: str | None = None):
        self.model, self.method, self.batches, self.how, self.rows = model, method, batches, how, rows
        self.progress, self.show_progress = progress, show_progress
        self.prefix = prefix or f"verify/{method}"
        self.cache = batch_caches(model, batches)
        self.tokens = float(sum(int(b.mask.sum()) for b in batches))  # scored tokens
        self.bases: dict[int, list[float]] = {}  # the unablated NLL sum of each window, per batch

    @property
    def baseline_nll(self) -> float:
        return float(sum(map(sum, self.bases.values())) / self.tokens)

    def _units(self, parts: dict[str, list[list[list[Head]]]]) -> list[tuple[str, Callable[[], object]]]:
        units: list[tuple[str, Callable[[], object]]] = []
        for kb in range(len(self.batches)):
            if not self.bases:
                units.append((f"{self.prefix}/b{kb}/base", partial(lambda kb: self.cache(kb)[1], kb)))
            units += [(f"{tag}/b{kb}/{c}", partial(lambda kb, part: ablated_sums(
                self.model, self.batches[kb], self.cache(kb)[0], part, self.how, self.rows), kb, part))
                      for tag, chunks in parts.items() for c, part in enumerate(chunks)]
        return units

    def measure(self, groups: dict[str, list[list[Head]]], what: str) -> dict[str, np.ndarray]:
        """ΔL of each head set of each group (``tag: sets``), in the sets' own order."""
        return {tag: changes.sum(1) / self.tokens for tag, changes in self.measure_windows(groups, what).items()}

    def window_tokens(self) -> np.ndarray:
        """[W] scored tokens of each window, in the order :meth:`measure_windows` gives its columns."""
        return np.concatenate([b.mask.sum(1).numpy() for b in self.batches]).astype(float)

    def measure_windows(self, groups: dict[str, list[list[Head]]], what: str) -> dict[str, np.ndarray]:
        """[sets, W] per group (``tag: sets``, rows in the sets' own order): each set's ablated − unablated NLL sum
        of every window, batch after batch."""
        run_order = {tag: _lowest_layer_first(sets) for tag, sets in groups.items()}
        parts = {tag: [[sets[i] for i in run_order[tag][c : c + CHUNK]] for c in range(0, len(sets), CHUNK)]
                 for tag, sets in groups.items()}
        bar: Callable[[Iterable], Iterable] = lambda it: tqdm(it, desc=f"{what} ({self.method})", leave=False,
                                                              disable=not self.show_progress)
        results = run_units(self._units(parts), self.progress, bar)
        n_batches = len(self.batches)
        for kb in range(n_batches):
            self.bases.setdefault(kb, results.get(f"{self.prefix}/b{kb}/base", []))
        base = np.concatenate([np.array(self.bases[kb]) for kb in range(n_batches)])  # [W]
        out = {}
        for tag, chunks in parts.items():
            sums = np.concatenate([np.array([row for c in range(len(chunks)) for row in results[f"{tag}/b{kb}/{c}"]])
                                   for kb in range(n_batches)], axis=1)  # [sets, W], in run order
            out[tag] = np.empty_like(sums)
            out[tag][run_order[tag]] = sums - base
        return out
