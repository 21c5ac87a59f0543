"""Head-importance scoring: one tidy DataFrame, one row per head, one column per method.

Methods (higher = more important for all but ``entropy``, which describes a head):
  weights     wo_fro, wo_spec, ov_fro, ov_spec                      (see :mod:`.weights`)
  data        out_norm, fluct, entropy                              (see :mod:`.activations`)
  gradients   grad, taylor                                          (see :mod:`.gradients`)
  ablation    abl_zero, abl_mean                                    (see :mod:`.ablation`)

Data methods run over sliding windows exactly as ``eval`` does. Every per-batch (and, for ablation,
per-layer) result is a unit of a :class:`~headprune.outputs.Progress`, so a killed sweep resumes.
"""

from __future__ import annotations

import time
from typing import Callable

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..errors import HeadpruneError
from ..distributed import run_units
from ..heads import head_id
from ..loading import model_fingerprint
from ..model import GPT2
from ..outputs import NoProgress, Progress
from ..perplexity import check_window, window_batches
from ..pruning import fill_tensors
from . import activations, gradients
from .ablation import ABLATION_METHODS, ablate_layer, cache_batch
from .activations import ACTIVATION_METHODS
from .gradients import GRADIENT_METHODS
from .weights import WEIGHT_METHODS, weight_scores

METHODS = WEIGHT_METHODS + ACTIVATION_METHODS + GRADIENT_METHODS + ABLATION_METHODS
DESCRIPTIVE = ("entropy",)  # not importances: never used to choose heads to prune


def parse_methods(spec: str | list[str]) -> list[str]:
    """``all`` or a comma-separated list of method names, in canonical order."""
    names = [m.strip() for m in (spec.split(",") if isinstance(spec, str) else spec) if m.strip()]
    if names == ["all"]:
        return list(METHODS)
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise HeadpruneError(f"unknown scoring method(s) {', '.join(unknown) or '(none)'}; choose from all, {', '.join(METHODS)}")
    return [m for m in METHODS if m in names]


def _activation_stats(model: GPT2, batches, with_entropy: bool, progress, bar) -> dict[str, torch.Tensor]:
    """:func:`activations.combine` over one unit per batch (``act/{with_entropy}/b{k}``), shared by
    ``score_heads`` and ``head_means`` so the means of a run are never computed twice."""
    jobs = [(f"act/{with_entropy}/b{k}", lambda b=b: activations.batch_sums(model, b, with_entropy))
            for k, b in enumerate(batches)]
    return activations.combine(model, list(run_units(jobs, progress, bar).values()))


def score_heads(
    model: GPT2,
    ids: torch.Tensor,
    methods: str | list[str] = "all",
    seq_len: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    ablation_rows: int | None = None,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> pd.DataFrame:
    """Score every head of ``model`` on token ids ``ids`` (1-D).

    Returns columns ``layer, head, head_id, model_fingerprint`` and one per method; ``df.attrs`` holds
    ``baseline`` ({tokens, nll}, when a data method ran) and ``seconds`` per method group.
    ``ablation_rows``: ablated copies × windows per forward (default: 8 on the CPU, where larger batches
    only cost cache, 64 on a GPU, where batching copies is the win).
    """
    methods = parse_methods(methods)
    seq_len = seq_len or model.cfg.n_positions
    stride = stride or seq_len
    check_window(seq_len, stride, model.cfg.n_positions)
    progress = progress or NoProgress()
    heads = model.head_ids
    columns: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    attrs: dict = {}
    batches = window_batches(ids, seq_len, stride, batch_size) if set(methods) - set(WEIGHT_METHODS) else []
    bar = lambda desc: lambda it: tqdm(it, desc=desc, disable=not show_progress, leave=False)  # noqa: E731

    if set(methods) & set(WEIGHT_METHODS):
        t0 = time.perf_counter()
        columns |= {m: v for m, v in weight_scores(model).items() if m in methods}
        seconds["weights"] = time.perf_counter() - t0

    mean_z = None
    if set(methods) & {"out_norm", "fluct", "entropy", "abl_mean"}:
        t0 = time.perf_counter()
        stats = _activation_stats(model, batches, "entropy" in methods, progress, bar("activations"))
        mean_z = stats["mean_z"]
        columns |= {m: stats[m].tolist() for m in ACTIVATION_METHODS if m in methods}
        seconds["activations"] = time.perf_counter() - t0

    if set(methods) & set(GRADIENT_METHODS):
        t0 = time.perf_counter()
        jobs = [(f"grad/b{k}", lambda b=b: gradients.batch_gate_grad(model, b)) for k, b in enumerate(batches)]
        units = list(run_units(jobs, progress, bar("gradients")).values())
        columns |= {m: v.tolist() for m, v in gradients.combine(units).items() if m in methods}
        seconds["gradients"] = time.perf_counter() - t0

    abl = [m for m in ABLATION_METHODS if m in methods]
    if abl:
        t0 = time.perf_counter()
        fills = {"abl_zero": [None] * model.cfg.n_layers,
                 "abl_mean": fill_tensors(model, _by_head(model, mean_z)) if mean_z is not None else None}
        rows = ablation_rows or (64 if model.device.type == "cuda" else 8)
        results = run_units(_ablation_jobs(model, batches, abl, fills, rows), progress, bar("ablation"))
        layers = [l for l, blk in enumerate(model.h) if blk.attn.n_heads]
        base = sum(results[f"base/b{k}"] for k in range(len(batches)))
        n = sum(int(b.mask.sum()) for b in batches)
        for m in abl:
            per_batch = [[s for l in layers for s in results[f"{m}/b{k}/L{l}"]] for k in range(len(batches))]
            columns[m] = ((torch.tensor(per_batch, dtype=torch.float64).sum(0) - base) / n).tolist()
        attrs["baseline"] = {"tokens": n, "nll": base / n}
        seconds["ablation"] = time.perf_counter() - t0

    df = pd.DataFrame({"layer": [l for l, _ in heads], "head": [h for _, h in heads],
                       "head_id": [head_id(l, h) for l, h in heads], "model_fingerprint": model_fingerprint(model)})
    for m in methods:
        df[m] = columns[m]
    df.attrs = attrs | {"seconds": seconds}
    return df


def head_means(
    model: GPT2,
    ids: torch.Tensor,
    seq_len: int,
    stride: int,
    batch_size: int = 8,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
    with_entropy: bool = False,
) -> dict[tuple[int, int], torch.Tensor]:
    """{(layer, head): z̄ [d_head]}: each head's mean output over the scored tokens (mean ablation's fill).

    Reuses the activation units of a ``score_heads`` run recorded in ``progress`` (same windows and batches;
    ``with_entropy`` as that run had it).
    """
    bar = lambda it: tqdm(it, desc="head means", disable=not show_progress, leave=False)  # noqa: E731
    batches = window_batches(ids, seq_len, stride, batch_size)
    stats = _activation_stats(model, batches, with_entropy, progress or NoProgress(), bar)
    return _by_head(model, stats["mean_z"].to(model.dtype))


def _by_head(model: GPT2, flat: torch.Tensor) -> dict[tuple[int, int], torch.Tensor]:
    """A layer-major [H, ...] tensor -> {(layer, head): row}."""
    return {head: flat[i] for i, head in enumerate(model.head_ids)}


def _ablation_jobs(model, batches, methods, fills, rows) -> list[tuple[str, Callable]]:
    """Units: per batch its baseline NLL sum, and per (method, batch, layer) the ablated NLL sum of each head.

    A batch's residual-stream cache is computed once, when its first unit runs, and kept until the next batch.
    """
    memo: dict[int, tuple] = {}

    def cache(k: int) -> tuple:
        if k not in memo:
            memo.clear()
            memo[k] = cache_batch(model, batches[k])
        return memo[k]

    layers = [l for l, blk in enumerate(model.h) if blk.attn.n_heads]
    jobs: list[tuple[str, Callable]] = []
    for k in range(len(batches)):
        jobs.append((f"base/b{k}", lambda k=k: cache(k)[1]))
        jobs += [(f"{m}/b{k}/L{l}", lambda k=k, m=m, l=l: ablate_layer(model, batches[k], cache(k)[0][f"resid_pre.{l}"], l,
                                                                       fills[m][l], rows))
                 for m in methods for l in layers]
    return jobs
