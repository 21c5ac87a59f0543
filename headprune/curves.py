"""Pruning curves: perplexity of the physically pruned model against the fraction of heads removed.

For each method and fraction f, the round(f·N) lowest-scored heads are removed (:func:`select_heads`),
the pruned model is evaluated with the sliding-window perplexity, and

    delta_nll = NLL(pruned) − NLL(unpruned),     delta_ppl = ppl(pruned) − ppl(unpruned).

``random`` is evaluated for K seeds and reported as mean and standard deviation (ddof=1; 0 for K=1).
With compensation ``mean`` the pruned heads' mean outputs z̄_i (measured on the scoring data) are folded
into b_O. Every (method, compensation, fraction, seed) point is one progress unit.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .distributed import run_units
from .errors import HeadpruneError
from .interventions import Head
from .ledger import param_table
from .loading import model_fingerprint
from .model import GPT2
from .outputs import NoProgress, Progress
from .perplexity import Windowing, evaluate
from .pruning import prune_model
from .schema import CURVE_COLUMNS, RANDOM
from .selection import select_heads


def _key(job: tuple) -> str:
    method, comp, fraction, seed = job
    return f"curve/{method}/{comp}/{fraction!r}/s{seed}"


def pruning_curves(
    model: GPT2,
    ids: torch.Tensor,
    scores: pd.DataFrame,
    variants: list[tuple[str, str]],  # (method or "random", "none" | "mean")
    fractions: list[float],
    windowing: Windowing | None = None,
    seeds: int = 3,
    means: dict[Head, torch.Tensor] | None = None,  # {(layer, head): z̄} for compensation "mean"
    per_layer: bool = False,
    normalize: str | None = None,
    standardize: bool = False,
    seed: int = 0,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
    head_sets: dict[tuple[str, float], list[Head]] | None = None,  # (method, fraction) -> heads, chosen elsewhere
) -> pd.DataFrame:
    """The tidy curve table (:data:`CURVE_COLUMNS`), one row per (method, compensation, fraction).

    ``head_sets``: the heads to prune for a method that is not a ranking of ``scores`` but chooses one set per
    fraction (the learned gates: :func:`headprune.gates.gate_head_sets`)."""
    model.require_heads("a pruning curve")
    progress = progress or NoProgress()
    w = windowing or Windowing.resolve(model.cfg.n_positions)
    if any(comp == "mean" for _, comp in variants) and means is None:
        raise HeadpruneError("mean compensation needs the heads' mean outputs; give the scoring data")

    baseline = run_units([("curve/baseline", lambda: evaluate(model, ids, w.seq_len, w.stride, w.batch_size,
                                                              progress=False).as_dict())], progress)["curve/baseline"]
    # Each distinct pruned model is evaluated once: methods often pick the same heads, every fraction 0 is the
    # baseline. The same model gives bit-identical numbers, so sharing changes no value.
    evaluated: dict[tuple, dict] = {(frozenset(), "none"): {"nll": baseline["nll"], "tokens": baseline["tokens"],
                                                            "params": int(param_table(model).params.sum())}}

    def point(method: str, comp: str, fraction: float, s: int) -> dict:
        if head_sets is not None and (method, fraction) in head_sets:
            heads = list(head_sets[(method, fraction)])
        else:
            heads = select_heads(scores, method, fraction=fraction, per_layer=per_layer, normalize=normalize,
                                 standardize=standardize, seed=s)
        fills = {h: means[h] for h in heads} if means is not None and comp == "mean" and heads else None
        key = (frozenset(heads), "mean" if fills else "none")
        if key not in evaluated:
            pruned = prune_model(model, heads, fills)
            result = evaluate(pruned, ids, w.seq_len, w.stride, w.batch_size, progress=False)
            evaluated[key] = {"nll": result.nll, "tokens": result.tokens, "params": int(param_table(pruned).params.sum())}
        return {**evaluated[key], "heads_pruned": len(heads)}

    base = baseline["nll"]
    jobs = [(m, c, f, s) for m, c in variants for f in fractions
            for s in (range(seed, seed + seeds) if m == RANDOM else [seed])]
    bar = lambda it: tqdm(it, desc="pruning curves", disable=not show_progress, leave=False)
    results = run_units([(_key(job), partial(point, *job)) for job in jobs], progress, bar)
    points = {job: results[_key(job)] for job in jobs}
    rows = []
    for m, c in variants:
        for f in fractions:
            runs = [v for (jm, jc, jf, _), v in points.items() if (jm, jc, jf) == (m, c, f)]
            nll = np.array([r["nll"] for r in runs])
            ppl = np.exp(nll)
            std = (lambda x, m=m: float(x.std(ddof=1)) if len(x) > 1 else (0.0 if m == RANDOM else math.nan))
            rows.append({"method": m, "compensation": c, "fraction": f, "heads_pruned": runs[0]["heads_pruned"],
                         "params": runs[0]["params"], "nll": float(nll.mean()), "ppl": float(ppl.mean()),
                         "delta_nll": float(nll.mean() - base), "delta_ppl": float(ppl.mean() - math.exp(base)),
                         "nll_std": std(nll), "ppl_std": std(ppl), "n_seeds": len(runs)})
    df = pd.DataFrame(rows, columns=CURVE_COLUMNS).assign(model_fingerprint=model_fingerprint(model))
    df.attrs["baseline"] = baseline
    return df
