"""Scores of KV groups (``score --unit group``): a grouped-query layer's KV head g and the query heads G_g reading it.

Removing a KV head means removing all of G_g together (LLM-Pruner's choice), so a group gets

    <method> (summed):  S_g = Σ_{i∈G_g} s_i              every per-head score summed over the group
    abl_zero_group:     ΔNLL of zeroing z_i for all i ∈ G_g at once (nats/token; ablated − baseline)

and the question every GQA pruner answers by assumption: does the sum of single-head ablations predict the joint
one? ``summed_vs_joint`` is Spearman ρ(Σ_{i∈G_g} abl_zero_i, abl_zero_group) over all groups, with a 95% percentile
interval from resampling the windows (:mod:`headprune.bootstrap`; the same counts for both, so they stay paired).
The joint ablation is exact: from the cached residual entering the group's layer, one gated forward per group.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headprune.bootstrap import interval, window_counts
from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.heads import group_id, head_id
from headprune.models.nll import unembed_nll
from headprune.perplexity import Windowing, window_sums
from headprune.schema import DESCRIPTIVE, method_columns
from headprune.scoring.ablation import ablate_layer, cache_batch

GROUP_METHOD = "abl_zero_group"


def require_groups(model: HeadModel) -> None:
    """Refuse ``--unit group`` where it means nothing: no grouped-query attention."""
    if model.cfg.n_kv_heads == model.cfg.n_heads:
        raise HeadpruneError(f"--unit group needs grouped-query attention; this model has n_heads = n_kv_heads = "
                             f"{model.cfg.n_heads} (each KV head serves one query head, so a group is a head); use "
                             "--unit head")


def groups(model: HeadModel) -> list[tuple[int, int, list[int]]]:
    """(layer, original KV head, original query heads reading it) of every kept KV head."""
    out = []
    for layer, kept in enumerate(model.cfg.kept_heads):
        for kv in model.cfg.kept_kv_heads(layer):
            out.append((layer, kv, [h for h in kept if model.cfg.kv_head(h) == kv]))
    return out


@torch.no_grad()
def _group_sums(model: HeadModel, batch, resid_pre: Tensor, layer: int) -> list[list[float]]:
    """Per kept KV group of ``layer``: the NLL sum of each window with all its query heads zeroed, [g][b]."""
    attn, b = model.h[layer].attn, batch.tokens.shape[0]
    gates: list[Tensor | None] = [None] * model.cfg.n_layers
    out = []
    for g in range(attn.n_kv_heads):
        gate = torch.tensor([0.0 if p == g else 1.0 for p in attn.kv_positions], device=model.device)
        gates[layer] = gate.expand(b, -1)
        resid = model.run_blocks(resid_pre, start=layer, gates=gates)
        out.append(window_sums(unembed_nll(model, resid, batch.tokens), batch.mask))
    return out


@torch.no_grad()
def group_ablation(model: HeadModel, ids: Tensor, windowing: Windowing, rows: int = 8) -> dict[str, np.ndarray]:
    """Per-window NLL sums [W]: ``base``, ``tokens``; ``single`` [heads, W] (one query head zeroed, in head_ids
    order) and ``joint`` [groups, W] (all of a group's query heads zeroed, in :func:`groups` order)."""
    base, tokens, single, joint = [], [], [], []
    for batch in windowing.batches(ids):
        batch = batch.to(model.device)
        resid_pre, sums = cache_batch(model, batch)
        base += sums
        tokens += batch.mask.sum(1).tolist()
        heads_b, groups_b = [], []
        for layer in range(model.cfg.n_layers):
            if model.h[layer].attn.n_heads:
                heads_b += ablate_layer(model, batch, resid_pre[layer], layer, rows=rows)
                groups_b += _group_sums(model, batch, resid_pre[layer], layer)
        single.append(np.array(heads_b))
        joint.append(np.array(groups_b))
    return {"base": np.array(base), "tokens": np.array(tokens, dtype=np.float64),
            "single": np.concatenate(single, axis=1), "joint": np.concatenate(joint, axis=1)}


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy import stats

    return float(stats.spearmanr(x, y).statistic) if np.ptp(x) > 0 and np.ptp(y) > 0 else float("nan")


def summed_vs_joint(model: HeadModel, sums: dict[str, np.ndarray], replicates: int = 200, seed: int = 0) -> dict:
    """Spearman ρ(Σ_{i∈G} abl_zero_i, abl_zero_group) over the groups, with its bootstrap interval."""
    index = {h: n for n, h in enumerate(model.head_ids)}
    member = np.zeros((len(groups(model)), len(index)))
    for g, (layer, _, heads) in enumerate(groups(model)):
        member[g, [index[(layer, h)] for h in heads]] = 1

    def scores(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # c [W] window weights
        n = c @ sums["tokens"]
        single = (sums["single"] - sums["base"]) @ c / n
        return member @ single, (sums["joint"] - sums["base"]) @ c / n

    summed, joint = scores(np.ones(len(sums["base"])))
    rho = _spearman(summed, joint)
    lo = hi = float("nan")
    if replicates:
        counts = window_counts(len(sums["base"]), replicates, seed).numpy()
        lo_a, hi_a = interval([_spearman(*scores(c)) for c in counts])
        lo, hi = float(lo_a), float(hi_a)
    return {"spearman": rho, "lo": lo, "hi": hi, "groups": len(joint), "replicates": replicates,
            "summed": summed, "joint": joint}


def group_table(model: HeadModel, head_table: pd.DataFrame, joint: np.ndarray) -> pd.DataFrame:
    """One row per KV group: layer, kv_head, group_id (L{l}G{g}), heads, every per-head importance score summed
    over the group's query heads, and abl_zero_group."""
    rows = []
    summable = [m for m in method_columns(head_table) if m not in DESCRIPTIVE]
    value_of = {(int(r["layer"]), int(r["head"])): {m: float(r[m]) for m in summable}
                for r in head_table.to_dict("records")}
    for (layer, kv, heads), value in zip(groups(model), joint):
        row = {"layer": layer, "kv_head": kv, "group_id": group_id(layer, kv),
               "heads": ",".join(head_id(layer, h) for h in heads)}
        row |= {m: float(np.sum([value_of[(layer, h)][m] for h in heads])) for m in summable}
        rows.append(row | {GROUP_METHOD: float(value)})
    return pd.DataFrame(rows)


def score_groups(model: HeadModel, ids: Tensor, head_table: pd.DataFrame, windowing: Windowing, rows: int = 8,
                 replicates: int = 200, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """``score --unit group`` from Python: (one row per KV group, the summary) of a head scores table (which must
    hold ``abl_zero``) on ``ids`` (1-D). The summary: groups, Spearman ρ of summed vs joint ablation and its 95%
    interval over ``replicates`` window resamples (None without replicates: the summary stays valid JSON)."""
    require_groups(model)
    sums = group_ablation(model, ids, windowing, rows)
    fit = summed_vs_joint(model, sums, replicates, seed)
    ci = None if np.isnan(fit["lo"]) or np.isnan(fit["hi"]) else [fit["lo"], fit["hi"]]  # None: no replicates
    return group_table(model, head_table, fit["joint"]), {"groups": fit["groups"],
                                                           "summed_vs_joint_spearman": fit["spearman"],
                                                           "summed_vs_joint_ci": ci}
