"""What an approximation may have missed: a bound on the heads left unverified, by subsampling (AtP*, §4).

Kramár et al. (2024) verify the heads an estimate ranks first by exact patching and bound what the rest can
still hide by patching random subsets of them together. Here: the K heads with the largest estimate are the
verified ones; the other heads U are patched together (z from the source run, all positions) in R random
subsets S_r, each head in with probability p (seeded), one batched forward per subset. With c_r the
normalised change of the mean metric with all of S_r patched, and effects that add up (c_r = Σ_{n∈S_r} c(n)):

    ĉ(n)  = mean_{r: n∈S_r} c_r − mean_{r: n∉S_r} c_r                  an unbiased estimate of c(n)
    se(n) = sqrt(var_{r: n∈S_r} c_r / R_in(n) + var_{r: n∉S_r} c_r / R_out(n))
    u(n)  = |ĉ(n)| + z_{1−δ/(2|U|)} · se(n)                            two-sided, Bonferroni over U
    bound = max_{n∈U} u(n)

so that, at confidence 1 − δ (normal approximation), no unverified head moves the metric by more than
``bound`` in normalised units: the size of a false negative the ranking can still contain. The cost is R
forwards whatever the number of heads (exact patching of every head costs one per head). Interactions
(effects that do not add up) widen the spread of the c_r, so se and the bound, and can bias ĉ(n): the
bound holds under the additive model, as in the paper's diagnostic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy.stats import norm
from scipy.stats import t as student_t
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.heads import head_id
from headprune.models.interventions import Head, mask_gates
from headprune.patching.exact import Patching, Runs, patch_rows
from headprune.schema import DEFAULT_BOUND_SUBSETS

DEFAULT_INCLUSION, DEFAULT_LEVEL = 0.5, 0.95


@dataclass(frozen=True)
class Subsampling:
    """The random subsets behind :func:`missed_bound`: ``subsets`` R of them, each unverified head in one with
    probability ``inclusion`` (strictly between 0 and 1), drawn with ``seed``; the bound holds at confidence
    ``level``."""

    subsets: int = DEFAULT_BOUND_SUBSETS
    inclusion: float = DEFAULT_INCLUSION
    level: float = DEFAULT_LEVEL
    seed: int = 0


DEFAULT_SUBSAMPLING = Subsampling()


@dataclass
class MissedBound:
    """The bound on the unverified heads' effects, and each one's subsampling estimate."""

    method: str  # the approximation whose ranking chose the verified heads
    verified: list[str]  # head ids, best first
    table: pd.DataFrame  # head_id, estimate, se, upper: one row per unverified head
    bound: float  # max upper
    subsets: int
    inclusion: float
    level: float

    @property
    def worst(self) -> str:
        """The unverified head with the largest upper bound."""
        return str(self.table["head_id"].iloc[int(self.table["upper"].to_numpy().argmax())])


@torch.no_grad()
def subset_changes(model: HeadModel, runs: Runs, subsets: list[list[Head]], rows: int = 16) -> Tensor:
    """[R] normalised change of the mean metric with the heads of each subset patched together (z from the
    source run, all positions): each subset a list of (layer, head)."""
    P = len(runs.pairs.clean)
    values = torch.empty(P, len(subsets), dtype=torch.float64)
    copies = max(1, rows // P)
    pair_rows = torch.arange(P, device=model.device)
    for first in range(0, len(subsets), copies):
        chunk = subsets[first : first + copies]
        c = len(chunk)
        keep = [torch.stack(layer) for layer in zip(*(mask_gates(model, s) for s in chunk))]  # per layer [c, h_l]
        patched = [l for l, k in enumerate(keep) if not bool(k.all())]
        if not patched:
            values[:, first : first + c] = runs.m_base.double().cpu().view(-1, 1)
            continue
        gates = [k.repeat_interleave(P, dim=0) if l in patched else None for l, k in enumerate(keep)]  # [c·P, h_l]
        fills = [runs.source_z[l].repeat(c, 1, 1, 1) if l in patched else None for l in range(len(keep))]
        start = patched[0]
        resid = model.run_blocks(runs.base_resid[start].repeat(c, 1, 1), start=start, gates=gates, fills=fills)
        values[:, first : first + c] = runs.evaluate(model, resid, pair_rows.repeat(c)).view(c, P).T.double().cpu()
    return Patching("subsets", values, runs.m_clean.double().cpu(), runs.m_corrupt.double().cpu(),
                    runs.direction).change


def subsample_estimates(masks: np.ndarray, changes: np.ndarray, level: float = DEFAULT_LEVEL, welch: bool = False
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ĉ, se and u (each [N]) of the N heads in ``masks`` [R, N] (bool) from the subsets' changes [R].

    ``welch``: the quantile of Student's t with the Welch–Satterthwaite degrees of freedom
    ν = se⁴ / ((var_in/R_in)²/(R_in − 1) + (var_out/R_out)²/(R_out − 1)) instead of the normal's: needed where a
    head is in a few subsets only (small inclusion probabilities), where the normal quantile under-covers."""
    R, N = masks.shape
    inside, outside = masks.sum(0), R - masks.sum(0)
    if (inside < 2).any() or (outside < 2).any():
        raise HeadpruneError(f"{R} subsets leave a head in fewer than 2 or out of fewer than 2 of them: use more "
                             "subsets or an inclusion probability nearer 0.5")
    c = changes[:, None]
    mean_in = (masks * c).sum(0) / inside
    mean_out = (~masks * c).sum(0) / outside
    var_in = (masks * (c - mean_in) ** 2).sum(0) / (inside - 1)
    var_out = (~masks * (c - mean_out) ** 2).sum(0) / (outside - 1)
    estimate = mean_in - mean_out
    se = np.sqrt(var_in / inside + var_out / outside)
    q = 1 - (1 - level) / (2 * N)
    if welch:
        a, b = var_in / inside, var_out / outside
        with np.errstate(invalid="ignore", divide="ignore"):
            dof = np.where(se > 0, (a + b) ** 2 / (a**2 / (inside - 1) + b**2 / (outside - 1)), np.inf)
        return estimate, se, np.abs(estimate) + student_t.ppf(q, dof) * se
    return estimate, se, np.abs(estimate) + norm.ppf(q) * se


def split_verified(estimate: Patching, verified: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Head indices (``model.head_ids`` order) that ``estimate`` verifies, its ``verified`` largest |change|
    best first (default 10% of the heads, at least 1), and the others, in head order."""
    H = estimate.values.shape[1]
    verified = max(1, round(0.1 * H)) if verified is None else verified
    if not 0 < verified < H - 1:
        raise HeadpruneError(f"verifying {verified} of {H} heads leaves too few to bound (need 1 to {H - 2})")
    order = np.argsort(-estimate.change.abs().numpy(), kind="stable")
    return order[:verified], np.sort(order[verified:])


def missed_bound(model: HeadModel, runs: Runs, estimate: Patching, verified: int | None = None,
                 subsampling: Subsampling = DEFAULT_SUBSAMPLING, rows: int | None = None) -> MissedBound:
    """The bound above for the heads ``estimate`` (an approximation of z patching on ``runs``' pairs) leaves
    unverified after its ``verified`` best (:func:`split_verified`), from the subsets ``subsampling`` draws;
    ``rows``: patched copies × pairs per forward (default 64 on a GPU, 16 on the CPU)."""
    subsets, inclusion, level = subsampling.subsets, subsampling.inclusion, subsampling.level
    if not 0 < inclusion < 1:
        raise HeadpruneError(f"inclusion probability {inclusion} must lie strictly between 0 and 1")
    heads = model.head_ids
    top, rest = split_verified(estimate, verified)
    picks = np.random.default_rng(subsampling.seed).random((subsets, len(rest))) < inclusion  # [R, |U|]
    chosen = [[heads[i] for i in rest[row]] for row in picks]
    changes = subset_changes(model, runs, chosen, patch_rows(model, rows)).numpy()
    est, se, upper = subsample_estimates(picks, changes, level)
    table = pd.DataFrame({"head_id": [head_id(*heads[i]) for i in rest], "estimate": est, "se": se,
                          "upper": upper})
    return MissedBound(estimate.method, [head_id(*heads[i]) for i in top], table, float(upper.max()), subsets,
                       inclusion, level)
