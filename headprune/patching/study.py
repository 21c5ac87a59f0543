"""One patching study of a set of prompt pairs: exact patching, its approximations, how well they agree, and
what the approximations of z may still have missed. ``headprune patch`` and ``headprune run`` both run it.

    table      one row per head: each method's normalised effect [and interval]; or, by position, one row
               per head and position with each exact activation's effect (the approximations are per head)
    agreement  each approximation against the exact patching of the same activation (:func:`.table.agreement`)
    missed     per approximation of z: its subsampling bound over the heads it leaves unverified
               (:mod:`.missed`), with each unverified head's exact |change| where z was patched exactly
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from numbers import Integral

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from headprune.bootstrap import DEFAULT_REPLICATES, check_replicates
from headprune.errors import HeadpruneError
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.heads import head_id
from headprune.patching.attribution import atp_star_z, atp_z
from headprune.patching.attribution_qk import atp_qk, atp_qkfix, atp_star_qk
from headprune.patching.exact import ACTIVATIONS, Patching, PatchOptions, check_direction, patch, run_pairs
from headprune.patching.metrics import DEFAULT_METRIC, check_metric
from headprune.patching.missed import MissedBound, Subsampling, missed_bound, split_verified
from headprune.patching.pairs import PromptPairs
from headprune.patching.table import agreement, patch_table, position_table
from headprune.schema import DEFAULT_BOUND_SUBSETS

APPROXIMATIONS = ("atp", "atp_star", "atp_qkfix")  # atp_qkfix: q and k only
MISSED_COLUMNS = ("method", "head_id", "estimate", "se", "upper", "exact")
_Z_METHODS: dict[str, Callable[..., Patching]] = {"atp": atp_z, "atp_star": atp_star_z}
_QK_METHODS: dict[str, Callable[..., Patching]] = {"atp": atp_qk, "atp_star": atp_star_qk, "atp_qkfix": atp_qkfix}


#: Fewest subsets of the bound: with each head in a subset with probability ½, a head lands in (or out of)
#: fewer than 2 of 32 subsets with probability 33/2³² (the bound needs 2 each way).
MIN_BOUND_SUBSETS = 32
#: A clean-corrupt metric difference at most this, in every pair, is no gap.
GAP_TOLERANCE = 1e-6


@dataclass(frozen=True)
class StudyOptions:
    """What a study computes. ``verify``: heads each approximation's ranking verifies before the bound
    (default 10%); ``bound_subsets`` 0 skips the bound (as do fewer than 3 heads); ``rows``: patched copies ×
    pairs per forward."""

    metric: str = DEFAULT_METRIC
    direction: str = "denoise"
    activations: tuple[str, ...] = ("z",)
    approximations: tuple[str, ...] = ("atp", "atp_star")
    by_position: bool = False
    bootstrap: int = DEFAULT_REPLICATES
    seed: int = 0
    bound_subsets: int = DEFAULT_BOUND_SUBSETS
    verify: int | None = None
    rows: int | None = None

    def check(self) -> StudyOptions:
        check_metric(self.metric), check_direction(self.direction)
        if bad := [a for a in self.activations if a not in ACTIVATIONS]:
            raise HeadpruneError(f"activation {bad[0]!r} is not one of {', '.join(ACTIVATIONS)}")
        if bad := [a for a in self.approximations if a not in APPROXIMATIONS]:
            raise HeadpruneError(f"approximation {bad[0]!r} is not one of {', '.join(APPROXIMATIONS)}")
        if "atp_qkfix" in self.approximations and not {"q", "k"} & set(self.activations):
            raise HeadpruneError("the atp_qkfix approximation needs q or k among the patched activations")
        if not self.activations and not self.approximations:
            raise HeadpruneError("nothing to compute: give activations to patch or approximations")
        whole = lambda v: isinstance(v, Integral) and not isinstance(v, bool)
        check_replicates(self.bootstrap)
        if not whole(self.seed) or self.seed < 0:
            raise HeadpruneError(f"seed {self.seed!r} must be a whole number ≥ 0", "seed")
        if self.rows is not None and (not whole(self.rows) or self.rows < 1):
            raise HeadpruneError(f"rows {self.rows!r} must be a whole number ≥ 1 (or None: the device's default)")
        if self.verify is not None and (not whole(self.verify) or self.verify < 0):
            raise HeadpruneError(f"verify {self.verify!r} must be a whole number of heads ≥ 0 (or None: 10%)",
                                 "verify")
        if self.bound_subsets < 0 or 0 < self.bound_subsets < MIN_BOUND_SUBSETS:
            raise HeadpruneError(f"bound subsets {self.bound_subsets} must be 0 (no bound) or at least "
                                 f"{MIN_BOUND_SUBSETS} (each head in and out of at least 2 subsets)")
        return self


@dataclass
class Study:
    table: pd.DataFrame
    agreement: pd.DataFrame | None
    missed: pd.DataFrame | None  # MISSED_COLUMNS, one row per (approximation, unverified head)
    summary: dict = field(default_factory=dict)


def _approximations(model: HeadModel, pairs: PromptPairs, options: StudyOptions, runs, exact: dict) -> dict[str, list]:
    """{activation: [Patching]}: z's approximations always, q's and k's where q or k is patched exactly."""
    args = (options.metric, options.direction)
    approx: dict[str, list[Patching]] = {"z": [_Z_METHODS[n](model, pairs, *args, runs=runs)
                                               for n in options.approximations if n in _Z_METHODS]}
    for a in (a for a in ("q", "k") if a in exact):
        approx[a] = [_QK_METHODS[n](model, pairs, a, *args, runs=runs) for n in options.approximations]
    return approx


def _missed(model: HeadModel, runs, options: StudyOptions, estimates: list[Patching], exact: Patching | None
            ) -> tuple[pd.DataFrame, list[dict]]:
    parts, bounds = [], []
    ids = [head_id(*h) for h in model.head_ids]
    exact_change = dict(zip(ids, exact.change.abs().tolist(), strict=True)) if exact is not None else None
    found: dict[tuple[int, ...], MissedBound] = {}  # by the unverified heads: their subsets give the same bound
    for est in estimates:
        top, rest = split_verified(est, options.verify)
        key = tuple(rest.tolist())
        if key in found:
            result = replace(found[key], method=est.method, verified=[ids[i] for i in top])
        else:
            subsampling = Subsampling(subsets=options.bound_subsets, seed=options.seed)
            result = found[key] = missed_bound(model, runs, est, verified=options.verify, subsampling=subsampling,
                                               rows=options.rows)
        part = result.table.assign(method=est.method, exact=np.nan)
        if exact_change is not None:
            part["exact"] = part["head_id"].map(exact_change)
        parts.append(part)
        bounds.append({"method": est.method, "verified": result.verified, "bound": result.bound,
                       "worst": result.worst, "subsets": result.subsets, "level": result.level,
                       "largest_exact_unverified": float(part["exact"].max()) if exact_change is not None else None})
    return pd.DataFrame(pd.concat(parts, ignore_index=True), columns=list(MISSED_COLUMNS)), bounds


def patch_study(model: HeadModel, pairs: PromptPairs, options: StudyOptions,
                progress: Progress | NoProgress | None = None, show_progress: bool = False) -> Study:
    """The study of ``pairs`` (see the module docstring); ``progress`` records the exact sweeps per layer,
    ``show_progress`` draws a bar over each sweep's layers."""
    options = options.check()
    if options.by_position and not pairs.same_length:
        raise HeadpruneError("patching by position needs pairs of one length (positions must mean the same in "
                             "every pair)")
    H = len(model.head_ids)
    if options.verify is not None and options.bound_subsets and H >= 3 and not 0 < options.verify < H - 1:
        raise HeadpruneError(f"verifying {options.verify} of {H} heads leaves too few to bound (need 1 to {H - 2})",
                             "verify")
    runs = run_pairs(model, pairs, options.metric, options.direction)
    for run, metric in (("clean", runs.m_clean), ("corrupt", runs.m_corrupt)):
        if not bool(torch.isfinite(metric).all()):
            p = int((~torch.isfinite(metric)).nonzero()[0])
            raise HeadpruneError(f"the {run} run's {options.metric} is {float(metric[p])} in pair {p}: the model's "
                                 "logits are not finite there, so no effect can be measured")
    if float((runs.m_clean - runs.m_corrupt).abs().max()) <= GAP_TOLERANCE:
        raise HeadpruneError(f"the clean and corrupt prompts give the same {options.metric} (gap 0 in every pair): "
                             "nothing to restore; check the pairs (answer and wrong token the same, or clean = "
                             "corrupt)")
    patching = PatchOptions(metric=options.metric, direction=options.direction, by_position=options.by_position,
                            rows=options.rows)
    def bar(activation: str):
        return lambda units: tqdm(units, desc=f"patching {activation}", disable=not show_progress, leave=False)

    exact = {a: patch(model, pairs, a, options=patching, progress=progress, bar=bar(a), runs=runs)
             for a in options.activations}
    summary: dict = {"pairs": len(pairs), "metric": options.metric, "direction": options.direction,
                     "metric_clean": float(runs.m_clean.mean()), "metric_corrupt": float(runs.m_corrupt.mean()),
                     "gap": float((runs.m_clean - runs.m_corrupt).mean())}
    if options.by_position:
        table = position_table(model, list(exact.values()))
        return Study(table, None, None, summary | {"top_heads": [], "bounds": []})
    approx = _approximations(model, pairs, options, runs, exact)
    results = [*exact.values(), *(r for rs in approx.values() for r in rs)]
    table = patch_table(model, results, options.bootstrap, options.seed)
    parts = [agreement(exact[a], rs, bootstrap=options.bootstrap, seed=options.seed) for a, rs in approx.items()
             if a in exact and rs]
    agree = pd.concat(parts, ignore_index=True) if parts else None
    bounded = options.bound_subsets and approx["z"] and len(model.head_ids) >= 3  # 2 unverified at least
    missed, bounds = _missed(model, runs, options, approx["z"], exact.get("z")) if bounded else (None, [])
    main = results[0].method
    top = table.sort_values(main, ascending=False, key=abs)["head_id"].head(5).tolist()
    return Study(table, agree, missed, summary | {"ranked_by": main, "top_heads": top, "bounds": bounds})
