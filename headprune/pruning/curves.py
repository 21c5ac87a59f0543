"""Pruning curves: perplexity of the physically pruned model against the fraction of heads removed.

For each method and fraction f, the round(f·N) lowest-scored heads are removed (:func:`select_heads`),
the pruned model is evaluated with the sliding-window perplexity, and

    delta_nll = NLL(pruned) − NLL(unpruned),     delta_ppl = ppl(pruned) − ppl(unpruned).

``random`` is evaluated for K seeds and reported as mean and standard deviation (ddof=1; 0 for K=1).
A ranking ``<method>@layer`` divides each layer's scores by their layer's norm first (Michel et al. 2019).
Every point carries a 95% paired-bootstrap interval of its ΔNLL over the evaluation windows.
With compensation ``mean`` the pruned heads' mean outputs z̄_i (measured on the scoring data) are folded
into b_O; with ``optimal`` the constants that are optimal for ablating that set of heads together (Li & Janson
2024, fitted jointly from z̄ on the scoring data for every pruned set, :func:`headprune.scoring.joint_constants`;
never worse than mean compensation there). Compensated rows name the data the fills came
from (column ``fill_data``; empty for ``none``). Every (method, compensation, fraction, seed) point is one
progress unit.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from headprune.bootstrap import interval, window_counts
from headprune.io.distributed import run_units
from headprune.io.fingerprint import model_fingerprint
from headprune.io.progress import NoProgress, Progress
from headprune.models.gpt2 import GPT2, token_nll
from headprune.models.ledger import param_table
from headprune.perplexity import Batch, Windowing, window_sums
from headprune.pruning.options import NO_COMPENSATION, Compensation, CurveOptions, Recovery
from headprune.pruning.prune import prune_model
from headprune.pruning.selection import select_heads
from headprune.schema import CURVE_COLUMNS, FILL_COLUMN, RANDOM, RECOVER_COLUMN, split_ranking
from headprune.scoring.ablation import cache_batch

CACHE_BYTES = 2 << 30  # the unpruned residual streams are kept for evaluation starts up to this size


def _key(job: tuple, recover_steps: int = 0) -> str:
    method, comp, fraction, seed = job
    comp = "optimal-set" if comp == "optimal" else comp  # the constants are fitted per pruned set
    return f"curve/w/{f'recover{recover_steps}/' if recover_steps else ''}{method}/{comp}/{fraction!r}/s{seed}"


class Evaluator:
    """Per-window NLL sums of pruned models on fixed batches, each started from the unpruned model's residual
    stream entering the first layer that lost a head (layers before it are identical, so is their output)."""

    def __init__(self, model: GPT2, batches: list[Batch]):
        self.batches = batches
        per_batch = [cache_batch(model, b) for b in batches]
        self.base = [s for _, sums in per_batch for s in sums]  # [W] unpruned NLL sums
        size = sum(t.numel() * t.element_size() for cache, _ in per_batch for t in cache.values())
        self.resid_pre = [cache for cache, _ in per_batch] if size <= CACHE_BYTES else None

    def __call__(self, pruned: GPT2, start: int = 0) -> list[float]:
        """[W] NLL sums of ``pruned``, which equals the unpruned model in layers < ``start`` (0: a whole forward)."""
        return pruned_window_sums(pruned, self.batches, self.resid_pre if start > 0 else None, start)


@torch.no_grad()
def pruned_window_sums(pruned: GPT2, batches: list[Batch], resid_pre: list[dict[int, Tensor]] | None, start: int
                       ) -> list[float]:
    """[W] NLL sums of ``pruned`` on ``batches``: from ``resid_pre[k][start]`` (the unpruned model's residual stream
    entering layer ``start``) where given, else from the embeddings."""
    sums: list[float] = []
    for k, batch in enumerate(batches):
        batch = batch.to(pruned.device)
        if resid_pre is not None:
            logits = pruned.unembed(pruned.run_blocks(resid_pre[k][start], start=start))
        else:
            logits = pruned(batch.tokens)
        sums += window_sums(token_nll(logits, batch.tokens), batch.mask)
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


def pruning_curves(
    model: GPT2,
    ids: torch.Tensor,
    scores: pd.DataFrame,
    # (ranking, "none" | "mean" | "optimal"); ranking: a method, "<method>@layer", "random"
    variants: list[tuple[str, str]],
    options: CurveOptions,
    compensation: Compensation = NO_COMPENSATION,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
    recovery: Recovery | None = None,
) -> pd.DataFrame:
    """The tidy curve table (:data:`CURVE_COLUMNS` and ``fill_data``), one row per (method, compensation, fraction).

    ``delta_nll_ci_lo/hi``: 95% paired-bootstrap interval over the evaluation windows (``options.bootstrap``
    replicates, seeded by ``options.selection.seed``; NaN with 0 replicates).
    ``recovery``: trains each pruned model in place before it is evaluated (``curve --recover``: fraction 0 is then
    the unpruned model after the same training); the rows get ``recover_steps``, deltas stay against the untrained
    unpruned model.
    ``options.head_sets``: the heads to prune for a method that is not a ranking of ``scores`` but chooses one set
    per fraction (the learned gates: :func:`headprune.pruning.gates.gate_head_sets`).
    """
    model.require_heads("a pruning curve")
    progress = progress or NoProgress()
    w = options.windowing or Windowing.resolve(model.cfg.n_positions)
    for _, comp in variants:
        compensation.check(comp)
    recover_steps = recovery.steps if recovery is not None else 0
    selection, seed, head_sets = options.selection, options.selection.seed, options.head_sets
    batches = w.batches(ids)
    n = torch.cat([b.mask.sum(1) for b in batches]).double()  # [W] scored tokens per window
    params = int(param_table(model).params.sum())
    evaluator: Evaluator | None = None

    def evaluator_() -> Evaluator:
        nonlocal evaluator
        evaluator = evaluator or Evaluator(model, batches)
        return evaluator

    base = run_units([("curve/w/baseline", lambda: evaluator_().base)], progress)["curve/w/baseline"]
    # Each distinct pruned model is evaluated once: methods often pick the same heads, every fraction 0 is the
    # baseline. The same model gives bit-identical numbers, so sharing changes no value.
    evaluated: dict[tuple, dict] = {} if recovery is not None else {(frozenset(), "none"): {"sums": base,
                                                                                           "params": params}}

    def point(method: str, comp: str, fraction: float, s: int) -> dict:
        if head_sets is not None and (method, fraction) in head_sets:
            heads = list(head_sets[(method, fraction)])
        else:
            name, by_layer = split_ranking(method)
            ranking = selection.by_layer() if by_layer else selection
            heads = select_heads(scores, name, fraction=fraction, selection=ranking.with_seed(s))
        comp = comp if heads else "none"
        key = (frozenset(heads), comp)
        if key not in evaluated:
            # optimal: fitted for this set (single-head constants do not compose)
            fills = compensation.fills(comp, heads)
            pruned = prune_model(model, heads, fills)  # a new model: recovering it leaves ``model`` as it is
            if recovery is not None:
                recovery.train(pruned)  # every layer may change: evaluated from the embeddings on
            start = min((l for l, _ in heads), default=0) if recovery is None else 0
            evaluated[key] = {"sums": evaluator_()(pruned, start),
                              "params": int(param_table(pruned).params.sum())}
        return {**evaluated[key], "heads_pruned": len(heads)}

    jobs = [(m, c, f, s) for m, c in variants for f in options.fractions
            for s in (range(seed, seed + options.seeds) if m == RANDOM else [seed])]
    bar = lambda it: tqdm(it, desc=bar_label(variants), disable=not show_progress, leave=False)
    results = run_units([(_key(job, recover_steps), partial(point, *job)) for job in jobs], progress, bar)
    counts = window_counts(len(base), options.bootstrap, seed) if options.bootstrap else None
    base_nll = sum(base) / float(n.sum())
    rows = []
    for m, c in variants:
        for f in options.fractions:
            runs = [results[_key(job, recover_steps)] for job in jobs if job[:3] == (m, c, f)]
            nll = np.array([sum(r["sums"]) for r in runs]) / float(n.sum())
            ppl = np.exp(nll)
            std = (lambda x, m=m: float(x.std(ddof=1)) if len(x) > 1 else (0.0 if m == RANDOM else math.nan))
            lo, hi = (delta_interval([r["sums"] for r in runs], base, n, counts, seed + 1) if counts is not None
                      else (math.nan, math.nan))
            rows.append({"method": m, "compensation": c, "fraction": f, "heads_pruned": runs[0]["heads_pruned"],
                         "params": runs[0]["params"], "nll": float(nll.mean()), "ppl": float(ppl.mean()),
                         "delta_nll": float(nll.mean() - base_nll), "delta_ppl": float(ppl.mean() - math.exp(base_nll)),
                         "nll_std": std(nll), "ppl_std": std(ppl), "n_seeds": len(runs),
                         "delta_nll_ci_lo": lo, "delta_nll_ci_hi": hi})
    df = pd.DataFrame(rows, columns=CURVE_COLUMNS).assign(model_fingerprint=model_fingerprint(model))
    if recovery is not None:
        df[RECOVER_COLUMN] = recover_steps
    df[FILL_COLUMN] = [compensation.fill_data if c != "none" else "" for c in df["compensation"]]
    df.attrs["baseline"] = {"tokens": int(n.sum()), "nll": base_nll, "ppl": math.exp(base_nll)}
    return df
