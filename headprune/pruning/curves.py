"""Pruning curves: perplexity of the physically pruned model against the fraction of heads removed.

For each method and fraction f, the round(f·N) lowest-scored heads are removed (:func:`~.selection.ranking_heads`),
the pruned model is evaluated with the sliding-window perplexity, and

    delta_nll = NLL(pruned) − NLL(unpruned),     delta_ppl = ppl(pruned) − ppl(unpruned).

``random`` is evaluated for K seeds and reported as mean and standard deviation (ddof=1; 0 for K=1).
A ranking ``<method>@layer`` divides each layer's scores by their layer's norm first (Michel et al. 2019).
Every point carries a 95% paired-bootstrap interval of its ΔNLL over the evaluation windows, and its ΔNLL over the
even and the odd windows alone (a ranking chosen on one half is measured on the other: headprune.report.choice).
With compensation ``mean`` the pruned heads' mean outputs z̄_i (measured on the scoring data) are folded
into b_O; with ``optimal`` the constants that are optimal for ablating that set of heads together (Li & Janson
2024, fitted jointly from z̄ on the scoring data for every pruned set, :func:`headprune.scoring.joint_constants`;
never worse than mean compensation there). Compensated rows name the data the fills came
from (column ``fill_data``; empty for ``none``). Every (method, compensation, fraction, seed) point is one
progress unit.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from functools import partial

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from headprune.bootstrap import interval, window_counts
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.work.distributed import run_units
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.head_config import Head
from headprune.models.ledger import param_table
from headprune.models.nll import unembed_nll
from headprune.perplexity import Batch, Windowing, window_sums
from headprune.pruning.options import NO_COMPENSATION, Compensation, CurveOptions
from headprune.pruning.prune import prune_model
from headprune.pruning.selection import ranking_heads
from headprune.schema import CURVE_COLUMNS, CURVE_HALVES, FILL_COLUMN, RANDOM, RECOVER_COLUMN
from headprune.scoring.ablation import cache_batch

# the unpruned residual streams are kept for evaluation starts up to this size (8192 tokens of SmolLM2-135M's 30
# layers take 0.57 GB, Gemma 3 270M's 18: 0.38 GB), so that with the weights a curve stays under 3 GiB
CACHE_BYTES = 1 << 30
PREFIX_CACHE_BYTES = 512 << 20  # and up to this much of the pruned models' streams, least recently used dropped first


def _key(job: tuple, recover_steps: int = 0) -> str:
    method, comp, fraction, seed = job
    comp = "optimal-set" if comp == "optimal" else comp  # the constants are fitted per pruned set
    return f"curve/w/{f'recover{recover_steps}/' if recover_steps else ''}{method}/{comp}/{fraction!r}/s{seed}"


LayerKey = tuple[tuple[int, bytes | None], ...]  # the heads one layer lost, each with its fill's bytes (None: zero)


def layer_keys(heads: list[Head], fills: Mapping[Head, Tensor] | None, n_layers: int) -> tuple[LayerKey, ...]:
    """What pruning ``heads`` with ``fills`` does to each layer: a pruned layer's weights, hence its output on a
    given input, are a function of its key alone (() for a layer left whole)."""
    per_layer: list[list[tuple[int, bytes | None]]] = [[] for _ in range(n_layers)]
    for layer, head in sorted(heads):
        fill = None if fills is None else fills[(layer, head)].detach().double().cpu().numpy().tobytes()
        per_layer[layer].append((head, fill))
    return tuple(tuple(k) for k in per_layer)


class Evaluator:
    """Per-window NLL sums of pruned models on fixed batches, each started from a residual stream computed before.

    Layer l of a pruned model depends only on what pruning did to layer l (:func:`layer_keys`), so the stream
    entering layer l is fixed by the keys of layers < l, its *prefix*. The unpruned model's streams are kept for
    every layer, and each evaluation keeps the streams it computes under their prefix (least recently used dropped
    beyond ``PREFIX_CACHE_BYTES``); a model starts at the deepest layer whose prefix was seen, where the unpruned
    model's is that of every layer before its first pruned one. The same layers on the same input give the same
    bits, so where a model starts changes no value."""

    def __init__(self, model: HeadModel, batches: list[Batch]):
        self.batches = batches
        per_batch = [cache_batch(model, b) for b in batches]
        self.base = [s for _, sums in per_batch for s in sums]  # [W] unpruned NLL sums
        self.n_layers = model.cfg.n_layers
        layer_bytes = sum(cache[0].numel() * cache[0].element_size() for cache, _ in per_batch)  # one layer's
        cached = layer_bytes * self.n_layers <= CACHE_BYTES
        # unpruned[l][k]: the stream entering layer l for batch k
        self.unpruned = [[cache[l] for cache, _ in per_batch] for l in range(self.n_layers)] if cached else None
        self.capacity = PREFIX_CACHE_BYTES // max(layer_bytes, 1) if cached else 0  # pruned streams kept
        self.streams: OrderedDict[tuple[int, tuple[LayerKey, ...]], list[Tensor]] = OrderedDict()

    def _start(self, keys: tuple[LayerKey, ...]) -> tuple[int, list[Tensor]]:
        """The deepest layer l whose prefix keys[:l] has a stream, and that stream (per batch)."""
        assert self.unpruned is not None
        first = next((l for l, key in enumerate(keys) if key), self.n_layers - 1)
        for layer in range(self.n_layers - 1, first, -1):
            found = self.streams.get((layer, keys[:layer]))
            if found is not None:
                self.streams.move_to_end((layer, keys[:layer]))
                return layer, found
        return first, self.unpruned[first]

    def __call__(self, pruned: HeadModel, keys: tuple[LayerKey, ...] | None) -> list[float]:
        """[W] NLL sums of ``pruned``, whose layers are ``keys`` (:func:`layer_keys`; None: any weight may differ
        from the unpruned model's, so from the embeddings)."""
        if keys is None or self.unpruned is None:
            return pruned_window_sums(pruned, self.batches)
        start, source = self._start(keys)
        computed: dict[int, list[Tensor]] = {}
        sums = pruned_window_sums(pruned, self.batches, start, source, computed)
        for layer, streams in computed.items():
            self.streams[(layer, keys[:layer])] = streams
        while len(self.streams) > self.capacity:
            self.streams.popitem(last=False)
        return sums


@torch.no_grad()
def pruned_window_sums(pruned: HeadModel, batches: list[Batch], start: int = 0, streams: list[Tensor] | None = None,
                       keep: dict[int, list[Tensor]] | None = None) -> list[float]:
    """[W] NLL sums of ``pruned`` on ``batches``, from ``streams[k]``, the residual stream entering layer ``start``
    of batch k (None: from the embeddings). ``keep`` receives, per layer after ``start``, the stream entering it
    for each batch."""
    sums: list[float] = []
    for k, batch in enumerate(batches):
        batch = batch.to(pruned.device)
        resid = pruned.embed(batch.tokens) if streams is None else streams[k]
        for layer in range(start, pruned.cfg.n_layers):
            if keep is not None and layer > start:
                keep.setdefault(layer, []).append(resid)
            resid = pruned.run_blocks(resid, start=layer, stop=layer + 1)
        sums += window_sums(unembed_nll(pruned, resid, batch.tokens), batch.mask)
    return sums


def delta_interval(pruned: list[list[float]], base: list[float], n: Tensor, counts: Tensor, seed: int
                   ) -> tuple[float, float]:
    """95% paired-bootstrap interval of ΔNLL = Σ_w (pruned_w − base_w) / Σ_w n_w.

    ``pruned``: one [W] list per seed; with several (random), each replicate also draws a seed, so the
    interval shows the spread over seeds and windows together."""
    diff = torch.tensor(pruned, dtype=torch.float64) - torch.tensor(base, dtype=torch.float64)  # [S, W]
    replicates = (counts @ diff.T) / (counts @ n).unsqueeze(1)  # [B, S]
    pick = torch.from_numpy(np.random.default_rng(seed).integers(len(pruned), size=len(counts)))
    lo, hi = interval(replicates[torch.arange(len(counts)), pick])
    return float(lo), float(hi)


def bar_label(variants: list[tuple[str, str]]) -> str:
    """The progress bar's name: "pruning curves", with the compensations where any (the run's second bar)."""
    kinds = sorted({c for _, c in variants} - {"none"})
    return "pruning curves" + (f" ({', '.join(c + '-compensated' for c in kinds)})" if kinds else "")


def half_deltas(runs: list[list[float]], base: list[float], n: Tensor) -> tuple[float, float]:
    """(ΔNLL over the even windows 0, 2, 4, …, over the odd ones 1, 3, …): Σ_{w∈half} (pruned_w − base_w) /
    Σ_{w∈half} n_w, the mean over ``runs`` (one [W] list per seed); NaN for a half without windows."""
    diff = np.array(runs, dtype=np.float64) - np.array(base, dtype=np.float64)  # [S, W]
    tokens = n.numpy()
    out = []
    for half in (0, 1):
        at = np.arange(len(base)) % 2 == half
        out.append(float((diff[:, at].sum(1) / tokens[at].sum()).mean()) if at.any() else math.nan)
    return out[0], out[1]


def _curve_rows(runs_of: dict[tuple[str, str, float], list[dict]], base: list[float], n: torch.Tensor,
                bootstrap: int, seed: int) -> tuple[list[dict], float]:
    """One row per (method, compensation, fraction) from its runs' per-window NLL sums (random: one run per seed),
    and the unpruned NLL per token: NLL = Σ sums / Σ n, its mean and std over runs, ΔNLL against ``base`` with its
    paired bootstrap interval over the windows (``bootstrap`` replicates; NaN with none) and on each half of the
    windows (:func:`half_deltas`)."""
    counts = window_counts(len(base), bootstrap, seed) if bootstrap else None
    base_nll = sum(base) / float(n.sum())
    rows = []
    for (m, c, f), runs in runs_of.items():
        nll = np.array([sum(r["sums"]) for r in runs]) / float(n.sum())
        ppl = np.exp(nll)
        std = (lambda x, m=m: float(x.std(ddof=1)) if len(x) > 1 else (0.0 if m == RANDOM else math.nan))
        lo, hi = (delta_interval([r["sums"] for r in runs], base, n, counts, seed + 1) if counts is not None
                  else (math.nan, math.nan))
        rows.append({"method": m, "compensation": c, "fraction": f, "heads_pruned": runs[0]["heads_pruned"],
                     "params": runs[0]["params"], "nll": float(nll.mean()), "ppl": float(ppl.mean()),
                     "delta_nll": float(nll.mean() - base_nll), "delta_ppl": float(ppl.mean() - math.exp(base_nll)),
                     "nll_std": std(nll), "ppl_std": std(ppl), "n_seeds": len(runs),
                     "delta_nll_ci_lo": lo, "delta_nll_ci_hi": hi,
                     **dict(zip(CURVE_HALVES, half_deltas([r["sums"] for r in runs], base, n), strict=True))})
    return rows, base_nll


class CurvePoints:
    """The curve's points as units of work: ``point(method, compensation, fraction, seed)`` is the pruned model's
    [W] NLL sums, its parameter count and the heads it lost. Each distinct pruned model (heads, compensation) is
    evaluated once and kept in ``evaluated``: methods often pick the same heads, and the same model gives
    bit-identical numbers, so sharing changes no value."""

    def __init__(self, model: HeadModel, batches: list[Batch], scores: pd.DataFrame, options: CurveOptions,
                 compensation: Compensation):
        self.model, self.batches, self.scores = model, batches, scores
        self.options, self.compensation = options, compensation
        self.evaluated: dict[tuple[frozenset[Head], str], dict] = {}
        self._evaluator: Evaluator | None = None

    def evaluator(self) -> Evaluator:
        """The evaluator on the curve's batches, built on first use (a resumed curve may need none)."""
        self._evaluator = self._evaluator or Evaluator(self.model, self.batches)
        return self._evaluator

    def heads(self, method: str, fraction: float, seed: int) -> list[Head]:
        """The heads a point removes: the set chosen for (method, fraction) where ``options.head_sets`` has one,
        else the round(fraction·N) lowest of the ranking ``method`` (seeded by ``seed``)."""
        head_sets = self.options.head_sets
        if head_sets is not None and (method, fraction) in head_sets:
            return list(head_sets[(method, fraction)])
        return ranking_heads(self.scores, method, fraction, self.options.selection.with_seed(seed))

    def point(self, method: str, comp: str, fraction: float, seed: int) -> dict:
        """{sums: [W] NLL sums, params, heads_pruned} of one point of the curve."""
        heads = self.heads(method, fraction, seed)
        comp = comp if heads else "none"
        key = (frozenset(heads), comp)
        if key not in self.evaluated:
            model, recovery = self.model, self.options.recovery
            # optimal: fitted for this set (single-head constants do not compose)
            fills = self.compensation.fills(comp, heads)
            # a new model; evaluated only, it shares what pruning leaves unchanged; recovering trains its own copy
            pruned = prune_model(model, heads, fills, share=recovery is None)
            if recovery is not None:
                recovery.train(pruned)  # every layer may change: evaluated from the embeddings
            keys = layer_keys(heads, fills, model.cfg.n_layers) if recovery is None else None
            self.evaluated[key] = {"sums": self.evaluator()(pruned, keys),
                                   "params": int(param_table(pruned).params.sum())}
        return {**self.evaluated[key], "heads_pruned": len(heads)}


def pruning_curves(
    model: HeadModel,
    ids: torch.Tensor,
    scores: pd.DataFrame,
    # (ranking, "none" | "mean" | "optimal"); ranking: a method, "<method>@layer", "random"
    variants: list[tuple[str, str]],
    *,
    options: CurveOptions,
    compensation: Compensation = NO_COMPENSATION,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> pd.DataFrame:
    """The tidy curve table (:data:`CURVE_COLUMNS` and ``fill_data``), one row per (method, compensation, fraction).

    ``delta_nll_ci_lo/hi``: 95% paired-bootstrap interval over the evaluation windows (``options.bootstrap``
    replicates, seeded by ``options.selection.seed``; NaN with 0 replicates). ``delta_nll_even/odd``: ΔNLL on the
    even and on the odd windows alone (:func:`half_deltas`), what :mod:`headprune.report.choice` chooses on.
    ``options.recovery``: trains each pruned model in place before it is evaluated (``curve --recover``: fraction 0
    is then the unpruned model after the same training); the rows get ``recover_steps``, deltas stay against the
    untrained unpruned model.
    ``options.head_sets``: the heads to prune for a method that is not a ranking of ``scores`` but chooses one set
    per fraction (the learned gates: :func:`headprune.pruning.gates.gate_head_sets`).
    """
    model.require_heads("a pruning curve")
    options = options.check()
    progress = progress or NoProgress()
    w = options.windowing or Windowing.for_model(model)
    for _, comp in variants:
        compensation.check(comp)
    recover_steps = options.recovery.steps if options.recovery is not None else 0
    batches = w.batches(ids)
    n = torch.cat([b.mask.sum(1) for b in batches]).double()  # [W] scored tokens per window
    params = int(param_table(model).params.sum())
    points = CurvePoints(model, batches, scores, options, compensation)
    base = run_units([("curve/w/baseline", lambda: points.evaluator().base)], progress)["curve/w/baseline"]
    if options.recovery is None:  # every fraction 0 is the unpruned model itself (recovering: its trained copy)
        points.evaluated[(frozenset(), "none")] = {"sums": base, "params": params}
    seed = options.selection.seed
    jobs = [(m, c, f, s) for m, c in variants for f in options.fractions
            for s in (range(seed, seed + options.seeds) if m == RANDOM else [seed])]
    bar = lambda it: tqdm(it, desc=bar_label(variants), disable=not show_progress, leave=False)
    results = run_units([(_key(job, recover_steps), partial(points.point, *job)) for job in jobs], progress, bar)
    runs_of = {(m, c, f): [results[_key(job, recover_steps)] for job in jobs if job[:3] == (m, c, f)]
               for m, c in variants for f in options.fractions}
    rows, base_nll = _curve_rows(runs_of, base, n, options.bootstrap, seed)
    df = pd.DataFrame(rows, columns=CURVE_COLUMNS).assign(model_fingerprint=model_fingerprint(model))
    if options.recovery is not None:
        df[RECOVER_COLUMN] = recover_steps
    df[FILL_COLUMN] = [compensation.fill_data if c != "none" else "" for c in df["compensation"]]
    df.attrs["baseline"] = {"tokens": int(n.sum()), "nll": base_nll, "ppl": math.exp(base_nll)}
    return df
