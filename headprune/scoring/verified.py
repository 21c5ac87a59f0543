"""A verified ablation ranking: a cheap estimate for every head, exact ablation of the heads it ranks first, and a
bound on what the others can still hide (AtP*'s recipe, Kramár et al. 2024, applied to the corpus NLL).

With ΔL(S) the corpus NLL change (nats/token) from ablating the head set S together (zero or mean ablation, as
:mod:`.ablation` defines them) and e(n) an estimate of ΔL({n}) for every head (default ``taylor``, the first-order
estimate −∂L/∂g_n of zero ablation: AtP on the head's output, one forward and backward per batch):

1. verified V: the K heads with the largest |e(n)|; each gets its exact ΔL({n}) (one ablated copy per head,
   rerun from its own layer on the cached residual stream, as the exact sweep does);
2. the other heads U are ablated together in R random subsets S_r (each head in with probability p, seeded);
   with the estimate as a control variate, the residuals d_r = ΔL(S_r) − Σ_{n∈S_r} e(n) go through
   :func:`~headprune.patching.missed.subsample_estimates`, which gives each head's correction δ(n) (mean of d_r
   over the subsets holding n minus the mean over the others) and its standard error se(n); then
   ĉ(n) = e(n) + δ(n) and u(n) = |ĉ(n)| + t_{1−δ/(2|U|), ν(n)}·se(n), with Welch's degrees of freedom ν(n) (a head
   sits in few subsets, where the normal quantile would under-cover). Under additive effects ĉ(n) is unbiased whatever
   the estimate, and a good estimate shrinks the spread of the d_r (so se) from Σ ΔL² to Σ (ΔL − e)²;
3. further rounds (``rounds`` > 1) verify, each, the K unverified heads with the largest u(n): those the bound
   says could hide the most, chosen by the corrected ĉ and its spread rather than by e alone. The bound holds for
   every head of U at once, so it still holds for those left;
4. bound = max_{n∈U} u(n) over the heads still unverified: at confidence 1 − δ (normal approximation, additive
   effects), none of them changes the NLL by more than ``bound``. The ranking claims as the top K the K verified
   heads with the largest |ΔL({n})|; with t the K-th largest, at most m = #{n∈U: u(n) ≥ t} unverified heads can
   belong to the true top K by |ΔL|, so the recall of the true top K is at least (K − m)/K.

For ``ctx_stream`` the units are the KV heads (:func:`verify_units`) and a set's KV heads are made streaming
instead of ablated (:class:`~.set_sweep.Intervention`); its default estimate is ``ctx_gate``.

Cost: the estimate (taylor: a forward and a backward, about two forwards), K/2 forward-equivalents per round on
average for V and R forwards for the subsets, against H/2 for the exact sweep of every head. Ablating many heads at
once is not additive, so p is small (each subset ablates about p·|U| heads), and each head sits in exactly
round(p·R) subsets, clipped to 2..R−2 (:func:`draw_subsets`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headprune.data.tokens import check_ids
from headprune.errors import HeadpruneError
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.heads import group_id, head_id
from headprune.models.interventions import Head, fill_tensors
from headprune.models.streaming import DEFAULT_RECENT, DEFAULT_SINK, check_streaming
from headprune.perplexity import Windowing
from headprune.schema import KV_SCORES, METHOD_SPECS, VERIFIABLE, VERIFY_INCLUSION, VERIFY_ROUNDS, VERIFY_SUBSETS
from headprune.scoring.base import rows_per_forward
from headprune.scoring.set_sweep import Intervention, SetSweep
from headprune.scoring.verified_stats import DEFAULT_LEVEL, certified_recall, corrected_estimates, draw_subsets


@dataclass(frozen=True)
class Verification:
    """How :func:`verify_ranking` checks an estimate: ``verified`` heads (K, default 10% of them, at least 1)
    ablated exactly in each of ``rounds`` rounds (the first by the estimate, the others by the bound), ``subsets``
    random subsets of the heads the first round leaves, each head in one with probability ``inclusion``, drawn with
    ``seed``; the bound holds at confidence ``level``; ``rows``: ablated copies × windows per forward (default:
    :func:`~headprune.scoring.base.rows_per_forward`)."""

    verified: int | None = None
    subsets: int = VERIFY_SUBSETS
    inclusion: float = VERIFY_INCLUSION
    level: float = DEFAULT_LEVEL
    seed: int = 0
    rows: int | None = None
    rounds: int = VERIFY_ROUNDS
    stream: tuple[int, int] = (DEFAULT_SINK, DEFAULT_RECENT)  # ctx_stream's streaming KV heads: (sink, recent)

    def check(self, n_heads: int | None = None) -> int:
        """The number of verified heads, after checking every field (the count against a model of ``n_heads``
        heads, where given)."""
        if n_heads is None:
            k = 1 if self.verified is None else self.verified
            if k < 1:
                raise HeadpruneError(f"verified {k}: give at least 1 head", "verified")
        else:
            k = max(1, round(0.1 * n_heads)) if self.verified is None else self.verified
            if not 0 < k <= n_heads - 2:
                raise HeadpruneError(f"verified {k} of {n_heads} heads leave too few to bound (give 1 to "
                                     f"{n_heads - 2})", "verified")
            if self.rounds >= 1 and k * self.rounds > n_heads - 2:
                raise HeadpruneError(f"{self.rounds} rounds of {k} verified heads leave fewer than 2 of {n_heads} "
                                     "heads to bound: give fewer rounds or fewer heads per round", "rounds")
        if self.rounds < 1:
            raise HeadpruneError(f"rounds {self.rounds}: give at least 1", "rounds")
        if self.subsets < 8:
            raise HeadpruneError(f"subsets {self.subsets}: too few to estimate a spread (give at least 8)", "subsets")
        if not 0 < self.inclusion < 1:
            raise HeadpruneError(f"inclusion {self.inclusion} must lie strictly between 0 and 1", "inclusion")
        if not 0 < self.level < 1:
            raise HeadpruneError(f"level {self.level} must lie strictly between 0 and 1", "level")
        if self.rows is not None and self.rows < 1:
            raise HeadpruneError(f"rows {self.rows} must be at least 1", "rows")
        return k


@dataclass
class VerifiedRanking:
    """What :func:`verify_ranking` gives: per head its estimate, exact ΔL where verified, the subsampling estimate
    and upper bound where not; the bound and the recall it certifies."""

    method: str  # the ablation verified (abl_zero or abl_mean), or ctx_stream (KV heads made streaming)
    estimate: str  # the name of the estimate that chose the first round's heads
    # head_id, layer, head, estimate, round (0: unverified), verified, top (the claimed top K), exact, and for every
    # head the first round left: sub_estimate, se, upper
    table: pd.DataFrame
    bound: float  # max upper over the unverified heads, nats/token
    threshold: float  # the K-th largest |exact| among the verified heads: the smallest of the claimed top K
    recall_lower: float  # certified lower bound on the recall of the true top K (at ``level``)
    baseline_nll: float  # the unablated model's mean NLL on the scored tokens
    tokens: int  # scored tokens
    subsets: int
    inclusion: float
    level: float

    @property
    def verified(self) -> list[str]:
        """The verified heads, largest |estimate| first."""
        rows = self.table[self.table["verified"]]
        return rows.iloc[np.argsort(-rows["estimate"].abs().to_numpy(), kind="stable")]["head_id"].tolist()

    @property
    def top(self) -> list[str]:
        """The claimed top K: the K verified heads with the largest |exact|, largest first."""
        rows = self.table[self.table["top"]]
        return rows.iloc[np.argsort(-rows["exact"].abs().to_numpy(), kind="stable")]["head_id"].tolist()

    @property
    def worst(self) -> str | None:
        """The unverified head with the largest upper bound (None: every head is verified)."""
        rest = self.table[~self.table["verified"]]
        return str(rest["head_id"].iloc[int(rest["upper"].to_numpy().argmax())]) if len(rest) else None

    @property
    def unresolved(self) -> int:
        """Unverified heads whose upper bound reaches the smallest verified |ΔL|: those that could still belong
        to the true top K."""
        return int((self.table.loc[~self.table["verified"], "upper"] >= self.threshold).sum())

    def summary(self) -> dict:
        """The JSON summary a command writes beside the table."""
        return {"method": self.method, "estimate": self.estimate, "heads": len(self.table),
                "verified": len(self.verified), "rounds": int(self.table["round"].max()), "top": self.top,
                "bound": self.bound, "threshold": self.threshold,
                "recall_lower": self.recall_lower, "unresolved": self.unresolved, "worst": self.worst,
                "baseline_nll": self.baseline_nll, "tokens": self.tokens,
                "subsets": self.subsets, "inclusion": self.inclusion, "level": self.level}


def _estimate_vector(estimate: Tensor | Iterable[float], n_heads: int) -> tuple[Tensor, str]:
    """The estimate as a float64 [H] tensor, checked: one finite value per head; and its name (a pandas Series'
    name, such as a scores table's column: ``taylor``; else ``estimate``)."""
    name = str(getattr(estimate, "name", None) or "estimate")
    e = (estimate.detach().cpu().double() if isinstance(estimate, Tensor)
         else torch.as_tensor(list(estimate), dtype=torch.float64))
    if e.shape != (n_heads,):
        raise HeadpruneError(f"the estimate has {e.numel()} values for {n_heads} heads", "estimate")
    if not bool(torch.isfinite(e).all()):
        raise HeadpruneError(f"the estimate {name} holds NaN or infinite values", "estimate")
    return e, name


def _ranking_table(heads: list[Head], e: Tensor, round_of: np.ndarray, exact: np.ndarray,
                   upper: np.ndarray, kv: bool = False) -> pd.DataFrame:
    """The per-unit table of a ranking (:class:`VerifiedRanking`; ``kv``: the units are KV heads, named L{l}G{g},
    their index in ``head``), ``top`` False and no subsampling estimate yet."""
    return pd.DataFrame({"head_id": [(group_id if kv else head_id)(*h) for h in heads], "layer": [l for l, _ in heads],
                         "head": [h for _, h in heads], "estimate": e.numpy(), "round": round_of,
                         "verified": round_of > 0, "top": False, "exact": exact, "sub_estimate": np.nan,
                         "se": np.nan, "upper": upper})


def verify_units(model: HeadModel, method: str) -> list[Head]:
    """What ``method`` is verified over: query heads (layer, head), or for ``ctx_stream`` (a KV head's need for the
    whole context) the KV heads (layer, KV head)."""
    if not METHOD_SPECS[method].kv_sweep:
        return model.head_ids
    return [(layer, kv) for layer in range(model.cfg.n_layers) for kv in range(model.h[layer].attn.n_kv_heads)]


def unit_values(model: HeadModel, method: str, per_head: np.ndarray, estimate: str | None = None) -> np.ndarray:
    """``per_head`` (one value per query head, ``model.head_ids`` order) per unit of :func:`verify_units`: as given
    for query heads; per KV head the value its query heads share where ``estimate`` is a KV head's score
    (:data:`~headprune.schema.KV_SCORES`), else their sum (an additive estimate of the whole group)."""
    if not METHOD_SPECS[method].kv_sweep:
        return per_head
    group = [(layer, model.h[layer].attn.kv_positions[i]) for layer in range(model.cfg.n_layers)
             for i in range(model.h[layer].attn.n_heads)]  # each query head's KV head, in model.head_ids order
    units = verify_units(model, method)
    rows = [[i for i, g in enumerate(group) if g == unit] for unit in units]
    return np.array([per_head[r[0]] if estimate in KV_SCORES else per_head[r].sum() for r in rows])


def intervention(model: HeadModel, method: str, ids: Tensor, windowing: Windowing, stream: tuple[int, int],
                 progress: Progress | NoProgress | None, show_progress: bool) -> Intervention:
    """What a verified set undergoes: zero ablation (abl_zero), z̄ fills (abl_mean: each head's mean output,
    measured on ``ids``), or its KV heads streaming (ctx_stream, ``stream`` = (sink, recent))."""
    if METHOD_SPECS[method].kv_sweep:
        check_streaming(*stream, windowing.seq_len)
        return Intervention([None] * model.cfg.n_layers, stream)
    if method != "abl_mean":
        return Intervention([None] * model.cfg.n_layers)
    from headprune.scoring import head_means

    return Intervention(list(fill_tensors(model, head_means(model, ids, windowing, progress=progress,
                                                             show_progress=show_progress))))


def _heads_tag(prefix: str, kind: str, chosen: np.ndarray) -> str:
    """A unit tag naming which heads (a digest), so that a resumed run with other heads recomputes."""
    return f"{prefix}/{kind}/{hashlib.sha256(','.join(map(str, chosen)).encode()).hexdigest()[:12]}"


def verify_ranking(
    model: HeadModel,
    ids: Tensor,
    estimate: Tensor | Iterable[float],  # [H] in model.head_ids order: an estimate of each head's ΔL
    method: str = "abl_zero",
    *,
    verification: Verification = Verification(),
    windowing: Windowing | None = None,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> VerifiedRanking:
    """The verified ranking of ``method`` by ``estimate`` on token ids ``ids`` (1-D): see the module docstring. The
    estimate is named by its Series' name (``scored.table["taylor"]``: taylor).
    Resumable through ``progress``: per batch, a unit for its baseline and one per :data:`~.set_sweep.CHUNK` head
    sets."""
    if method not in VERIFIABLE:
        raise HeadpruneError(f"cannot verify {method!r}: give one of {', '.join(VERIFIABLE)}", "method")
    model.require_heads(f"verifying {method}")
    check_ids(ids, model.cfg.vocab_size, "verify_ranking")
    heads = verify_units(model, method)
    e, estimate_name = _estimate_vector(estimate, len(heads))
    k = verification.check(len(heads))
    windowing = windowing or Windowing.for_model(model)
    how = intervention(model, method, ids, windowing, verification.stream, progress, show_progress)
    order = np.argsort(-e.abs().numpy(), kind="stable")
    first, rest = np.sort(order[:k]), np.sort(order[k:])  # head order
    masks = draw_subsets(len(rest), verification.subsets, verification.inclusion, verification.seed)  # [R, |U|]

    sweep = SetSweep(model, method, windowing.batches(ids), how, rows_per_forward(model, verification.rows),
                     progress or NoProgress(), show_progress)

    heads_tag = partial(_heads_tag, f"verify/{method}/{estimate_name}")
    subsets_tag = (f"{heads_tag('subsets', first)}/r{verification.subsets}/p{verification.inclusion}/"
                   f"s{verification.seed}")
    round_of, chosen = np.zeros(len(heads), dtype=int), first
    exact, upper_all = np.full(len(heads), np.nan), np.full(len(heads), np.nan)
    for r in range(1, verification.rounds + 1):
        groups = {heads_tag(f"round{r}", chosen): [[heads[i]] for i in chosen]}
        if r == 1:
            groups[subsets_tag] = [[heads[rest[j]] for j in np.flatnonzero(row)] for row in masks]
        measured = sweep.measure(groups, f"verifying, round {r} of {verification.rounds}")
        if r == 1:
            est, se, upper = corrected_estimates(masks, measured[subsets_tag], e.numpy()[rest], verification.level)
            upper_all[rest] = upper
        exact[chosen] = measured[next(iter(groups))]
        round_of[chosen] = r
        left = np.flatnonzero(round_of == 0)
        chosen = np.sort(left[np.argsort(-upper_all[left], kind="stable")[:k]])  # the bound's most open heads

    verified = round_of > 0
    top = np.flatnonzero(verified)[np.argsort(-np.abs(exact[verified]), kind="stable")[:k]]
    table = _ranking_table(heads, e, round_of, exact, upper_all, METHOD_SPECS[method].kv_sweep)
    table.loc[top, "top"] = True
    table.loc[rest, "sub_estimate"], table.loc[rest, "se"] = est, se
    unverified = upper_all[~verified]
    return VerifiedRanking(method, estimate_name, table, float(unverified.max()), float(np.abs(exact[top]).min()),
                           certified_recall(exact[verified], unverified, k), sweep.baseline_nll, int(sweep.tokens),
                           verification.subsets, verification.inclusion, verification.level)


def exact_ranking(
    model: HeadModel,
    ids: Tensor,
    estimate: Tensor | Iterable[float],  # [H] in model.head_ids order
    method: str = "abl_zero",
    *,
    verification: Verification = Verification(),  # its verified (the K claimed) and rows
    windowing: Windowing | None = None,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> VerifiedRanking:
    """What :func:`verify_ranking` answers, with every head ablated exactly (the exact sweep of ``method``, where
    it costs less than verifying): all heads verified in one round, the top ``verified`` (default 10%) by |ΔL|, no
    unverified head left to bound (bound 0, certified recall 1)."""
    from headprune.scoring import ScoringOptions, score_heads

    if method not in VERIFIABLE:
        raise HeadpruneError(f"cannot verify {method!r}: give one of {', '.join(VERIFIABLE)}", "method")
    heads = verify_units(model, method)
    e, estimate_name = _estimate_vector(estimate, len(heads))
    k = Verification().check(len(heads)) if verification.verified is None else verification.verified  # default 10%
    if not 0 < k <= len(heads):
        raise HeadpruneError(f"verified {k} of {len(heads)} heads: give 1 to {len(heads)}", "verified")
    sink, recent = verification.stream
    scored = score_heads(model, ids, [method], windowing=windowing, progress=progress, show_progress=show_progress,
                         options=ScoringOptions(bootstrap=0, ablation_rows=verification.rows, stream_sink=sink,
                                                stream_recent=recent))
    exact = unit_values(model, method, scored.table[method].to_numpy(dtype=float), method)  # per unit
    top = np.argsort(-np.abs(exact), kind="stable")[:k]
    table = _ranking_table(heads, e, np.ones(len(heads), dtype=int), exact, np.full(len(heads), np.nan),
                           METHOD_SPECS[method].kv_sweep)
    table.loc[top, "top"] = True
    baseline = scored.baseline or {}
    return VerifiedRanking(method, estimate_name, table, 0.0, float(np.abs(exact[top]).min()), 1.0,
                           float(baseline.get("nll", np.nan)), int(baseline.get("tokens", 0)), 0, 0.0, DEFAULT_LEVEL)
