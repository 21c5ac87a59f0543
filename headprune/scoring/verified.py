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

Cost: the estimate (taylor: a forward and a backward, about two forwards), K/2 forward-equivalents per round on
average for V and R forwards for the subsets, against H/2 for the exact sweep of every head. Ablating many heads at
once is not additive, so p is small (each subset ablates about p·|U| heads), and each head sits in exactly
round(p·R) subsets, clipped to 2..R−2 (:func:`draw_subsets`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from headprune.data.tokens import check_ids
from headprune.errors import HeadpruneError
from headprune.io.work.distributed import run_units
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.heads import head_id
from headprune.models.interventions import Head, fill_tensors, mask_gates
from headprune.models.nll import unembed_nll
from headprune.patching.missed import subsample_estimates
from headprune.perplexity import Batch, Windowing, window_sums
from headprune.schema import VERIFIABLE, VERIFY_INCLUSION, VERIFY_ROUNDS, VERIFY_SUBSETS
from headprune.scoring.ablation import batch_caches
from headprune.scoring.base import rows_per_forward

DEFAULT_LEVEL = 0.95
CHUNK = 8  # head sets per resumable unit


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

    method: str  # the ablation verified (abl_zero or abl_mean)
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


def draw_subsets(n_heads: int, subsets: int, inclusion: float, seed: int) -> np.ndarray:
    """[R, N] bool: each head in exactly m = round(inclusion·R) of the R subsets (clipped to 2..R−2), the m drawn
    uniformly for each head alone. The columns are independent and every subset holds a given head with
    probability m/R whatever the other heads, so mean_in − mean_out stays unbiased under additive effects, and no
    head rests on fewer than min(m, R − m) samples on either side (Welch's degrees of freedom at least
    min(m, R − m) − 1)."""
    if subsets < 4:
        raise HeadpruneError(f"{subsets} subsets cannot hold every head in two and leave it out of two (give at least "
                             "4)", "subsets")
    m = min(max(2, round(inclusion * subsets)), subsets - 2)
    rng = np.random.default_rng(seed)
    order = np.argsort(rng.random((subsets, n_heads)), axis=0)  # a random permutation of the subsets per head
    return order < m


def corrected_estimates(masks: np.ndarray, changes: np.ndarray, estimate: np.ndarray, level: float = DEFAULT_LEVEL
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ĉ, se and u (each [N]) of the N heads in ``masks`` [R, N] from the subsets' changes [R], with ``estimate``
    [N] as the control variate: d_r = c_r − Σ_{n∈S_r} e(n), ĉ(n) = e(n) + (mean of d_r over the subsets holding n
    − mean over the others), u(n) = |ĉ(n)| + t_{1−δ/(2N), ν(n)}·se(n) (Welch's t: a head sits in few subsets)."""
    residual = changes - masks.astype(float) @ estimate
    correction, se, upper = subsample_estimates(masks, residual, level, welch=True)
    corrected = estimate + correction
    return corrected, se, np.abs(corrected) + (upper - np.abs(correction))


@torch.no_grad()
def ablated_sums(
    model: HeadModel,
    batch: Batch,
    resid_pre: dict[int, Tensor],  # (b, T, d) entering each layer, from cache_batch
    sets: list[list[Head]],
    fills: list[Tensor | None],  # per layer [n_heads_l, d_head], None for zero ablation
    rows: int = 8,
) -> list[list[float]]:
    """NLL sum of each window of ``batch`` with each head set ablated together: [len(sets)][b]. Sets run as
    batched copies, each from the lowest layer of its chunk (pass sets sorted by their lowest layer)."""
    b = batch.tokens.shape[0]
    tokens, mask = batch.tokens.to(model.device), batch.mask.to(model.device)
    copies = max(1, rows // b)
    sums: list[list[float]] = []
    for first in range(0, len(sets), copies):
        chunk = sets[first : first + copies]
        start = min((layer for heads in chunk for layer, _ in heads), default=0)  # an empty set: the baseline
        keep = [torch.stack(layer) for layer in zip(*(mask_gates(model, heads) for heads in chunk))]  # [c, h_l]
        gates = [k.to(model.device).repeat_interleave(b, dim=0) if not bool(k.all()) else None for k in keep]
        resid = model.run_blocks(resid_pre[start].repeat(len(chunk), 1, 1), start=start, gates=gates, fills=fills)
        for copy in resid.split(b):
            sums.append(window_sums(unembed_nll(model, copy, tokens), mask))
    return sums


def _lowest_layer_first(sets: list[list[Head]]) -> list[int]:
    return sorted(range(len(sets)), key=lambda i: min((layer for layer, _ in sets[i]), default=0))


def _estimate_vector(estimate: Tensor | Iterable[float], n_heads: int, name: str) -> Tensor:
    """The estimate as a float64 [H] tensor, checked: one finite value per head."""
    e = (estimate.detach().cpu().double() if isinstance(estimate, Tensor)
         else torch.as_tensor(list(estimate), dtype=torch.float64))
    if e.shape != (n_heads,):
        raise HeadpruneError(f"the estimate has {e.numel()} values for {n_heads} heads", "estimate")
    if not bool(torch.isfinite(e).all()):
        raise HeadpruneError(f"the estimate {name} holds NaN or infinite values", "estimate")
    return e


def _ranking_table(heads: list[Head], e: Tensor, round_of: np.ndarray, exact: np.ndarray,
                   upper: np.ndarray) -> pd.DataFrame:
    """The per-head table of a ranking (:class:`VerifiedRanking`), ``top`` False and no subsampling estimate yet."""
    return pd.DataFrame({"head_id": [head_id(*h) for h in heads], "layer": [l for l, _ in heads],
                         "head": [h for _, h in heads], "estimate": e.numpy(), "round": round_of,
                         "verified": round_of > 0, "top": False, "exact": exact, "sub_estimate": np.nan,
                         "se": np.nan, "upper": upper})


def verify_ranking(
    model: HeadModel,
    ids: Tensor,
    estimate: Tensor | Iterable[float],  # [H] in model.head_ids order: an estimate of each head's ΔL
    method: str = "abl_zero",
    *,
    estimate_name: str = "taylor",
    verification: Verification = Verification(),
    windowing: Windowing | None = None,
    means: dict[Head, Tensor] | None = None,  # z̄ per head: abl_mean's fills (measured here when not given)
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> VerifiedRanking:
    """The verified ranking of ``method`` by ``estimate`` on token ids ``ids`` (1-D): see the module docstring.
    Resumable through ``progress``: per batch, a unit for its baseline and one per :data:`CHUNK` head sets."""
    if method not in VERIFIABLE:
        raise HeadpruneError(f"cannot verify {method!r}: give one of {', '.join(VERIFIABLE)}", "method")
    model.require_heads(f"verifying {method}")
    check_ids(ids, model.cfg.vocab_size, "verify_ranking")
    heads = model.head_ids
    e = _estimate_vector(estimate, len(heads), estimate_name)
    k = verification.check(len(heads))
    windowing = windowing or Windowing.for_model(model)
    batches = windowing.batches(ids)
    if method == "abl_mean" and means is None:
        from headprune.scoring import head_means

        means = head_means(model, ids, windowing, progress=progress, show_progress=show_progress)
    fills: list[Tensor | None] = (list(fill_tensors(model, means)) if method == "abl_mean" and means is not None
                                  else [None] * model.cfg.n_layers)

    order = np.argsort(-e.abs().numpy(), kind="stable")
    first, rest = np.sort(order[:k]), np.sort(order[k:])  # head order
    masks = draw_subsets(len(rest), verification.subsets, verification.inclusion, verification.seed)  # [R, |U|]

    cache = batch_caches(model, batches)
    rows = rows_per_forward(model, verification.rows)
    n = float(sum(int(b.mask.sum()) for b in batches))  # scored tokens
    bases: dict[int, list[float]] = {}  # the unablated NLL sum of each window, per batch

    def measure(groups: dict[str, list[list[Head]]], what: str) -> dict[str, np.ndarray]:
        """Corpus ΔL of each head set of each group (``tag: sets``, the sets ablated together), in the sets' own
        order: resumable units, batch by batch (one cached residual stream held), of :data:`CHUNK` sets, lowest layer
        first; the first call also measures each batch's baseline."""
        run_order = {tag: _lowest_layer_first(sets) for tag, sets in groups.items()}
        parts = {tag: [[sets[i] for i in run_order[tag][c : c + CHUNK]] for c in range(0, len(sets), CHUNK)]
                 for tag, sets in groups.items()}
        units: list[tuple[str, Callable[[], object]]] = []
        for kb in range(len(batches)):
            if not bases:
                units.append((f"verify/{method}/b{kb}/base", partial(lambda kb: cache(kb)[1], kb)))
            units += [(f"{tag}/b{kb}/{c}", partial(lambda kb, part: ablated_sums(
                model, batches[kb], cache(kb)[0], part, fills, rows), kb, part))
                      for tag, chunks in parts.items() for c, part in enumerate(chunks)]
        bar: Callable[[Iterable], Iterable] = lambda it: tqdm(it, desc=f"{what} ({method})", leave=False,
                                                              disable=not show_progress)
        results = run_units(units, progress or NoProgress(), bar)
        for kb in range(len(batches)):
            bases.setdefault(kb, results.get(f"verify/{method}/b{kb}/base", []))
        base = np.concatenate([np.array(bases[kb]) for kb in range(len(batches))])  # [W]
        out = {}
        for tag, chunks in parts.items():
            sums = np.concatenate([np.array([row for c in range(len(chunks)) for row in results[f"{tag}/b{kb}/{c}"]])
                                   for kb in range(len(batches))], axis=1)  # [sets, W], in run order
            out[tag] = np.empty(len(groups[tag]))
            out[tag][run_order[tag]] = (sums - base).sum(1) / n
        return out

    def heads_tag(kind: str, chosen: np.ndarray) -> str:  # which heads, so a resumed run with others recomputes
        digest = hashlib.sha256(",".join(map(str, chosen)).encode()).hexdigest()[:12]
        return f"verify/{method}/{estimate_name}/{kind}/{digest}"

    subsets_tag = (f"{heads_tag('subsets', first)}/r{verification.subsets}/p{verification.inclusion}/"
                   f"s{verification.seed}")
    round_of = np.zeros(len(heads), dtype=int)
    exact = np.full(len(heads), np.nan)
    upper_all = np.full(len(heads), np.nan)
    chosen = first
    for r in range(1, verification.rounds + 1):
        groups = {heads_tag(f"round{r}", chosen): [[heads[i]] for i in chosen]}
        if r == 1:
            groups[subsets_tag] = [[heads[rest[j]] for j in np.flatnonzero(row)] for row in masks]
        measured = measure(groups, f"verifying, round {r} of {verification.rounds}")
        if r == 1:
            est, se, upper = corrected_estimates(masks, measured[subsets_tag], e.numpy()[rest], verification.level)
            upper_all[rest] = upper
        exact[chosen] = measured[next(iter(groups))]
        round_of[chosen] = r
        left = np.flatnonzero(round_of == 0)
        chosen = np.sort(left[np.argsort(-upper_all[left], kind="stable")[:k]])  # the bound's most open heads

    verified = round_of > 0
    top = np.flatnonzero(verified)[np.argsort(-np.abs(exact[verified]), kind="stable")[:k]]
    table = _ranking_table(heads, e, round_of, exact, upper_all)
    table.loc[top, "top"] = True
    table.loc[rest, "sub_estimate"], table.loc[rest, "se"] = est, se
    unverified = upper_all[~verified]
    return VerifiedRanking(method, estimate_name, table, float(unverified.max()), float(np.abs(exact[top]).min()),
                           certified_recall(exact[verified], unverified, k),
                           float(sum(map(sum, bases.values())) / n), int(n),
                           verification.subsets, verification.inclusion, verification.level)


def exact_ranking(
    model: HeadModel,
    ids: Tensor,
    estimate: Tensor | Iterable[float],  # [H] in model.head_ids order
    method: str = "abl_zero",
    *,
    estimate_name: str = "taylor",
    verified: int | None = None,
    windowing: Windowing | None = None,
    rows: int | None = None,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> VerifiedRanking:
    """What :func:`verify_ranking` answers, with every head ablated exactly (the exact sweep of ``method``, where
    it costs less than verifying): all heads verified in one round, the top ``verified`` (default 10%) by |ΔL|, no
    unverified head left to bound (bound 0, certified recall 1)."""
    from headprune.scoring import ScoringOptions, score_heads

    if method not in VERIFIABLE:
        raise HeadpruneError(f"cannot verify {method!r}: give one of {', '.join(VERIFIABLE)}", "method")
    heads = model.head_ids
    e = _estimate_vector(estimate, len(heads), estimate_name)
    k = Verification().check(len(heads)) if verified is None else verified  # the default: 10% of the heads
    if not 0 < k <= len(heads):
        raise HeadpruneError(f"verified {k} of {len(heads)} heads: give 1 to {len(heads)}", "verified")
    scored = score_heads(model, ids, [method], windowing=windowing,
                         options=ScoringOptions(bootstrap=0, ablation_rows=rows), progress=progress,
                         show_progress=show_progress)
    exact = scored.table[method].to_numpy(dtype=float)  # model.head_ids order
    top = np.argsort(-np.abs(exact), kind="stable")[:k]
    table = _ranking_table(heads, e, np.ones(len(heads), dtype=int), exact, np.full(len(heads), np.nan))
    table.loc[top, "top"] = True
    baseline = scored.baseline or {}
    return VerifiedRanking(method, estimate_name, table, 0.0, float(np.abs(exact[top]).min()), 1.0,
                           float(baseline.get("nll", np.nan)), int(baseline.get("tokens", 0)), 0, 0.0, DEFAULT_LEVEL)


def certified_recall(exact: np.ndarray, upper: np.ndarray, k: int | None = None) -> float:
    """Lower bound on the recall of the true top K by |ΔL| (default K = len(``exact``)) by the K verified heads with
    the largest |ΔL| (``exact``: every verified head's), given the unverified heads' upper bounds ``upper``: with t
    the K-th largest |exact|, at most m = #{u ≥ t} unverified heads can outrank a claimed one, so at least K − m of
    the true top K are claimed."""
    k = len(exact) if k is None else k
    threshold = np.sort(np.abs(exact))[::-1][k - 1]
    return max(0, k - int((upper >= threshold).sum())) / k


def recall_at_k(exact_all: Iterable[float], verified: Iterable[bool]) -> float:
    """The share of the true top K heads by |ΔL| (``exact_all``: every head's exact ΔL, e.g. the exact sweep's
    abl_zero column) that the verified set (K = its size) contains."""
    values, chosen = np.abs(np.asarray(list(exact_all), dtype=float)), np.asarray(list(verified), dtype=bool)
    k = int(chosen.sum())
    if not 0 < k <= len(values):
        raise HeadpruneError(f"{k} verified heads of {len(values)}: nothing to compare")
    true_top = np.argsort(-values, kind="stable")[:k]
    return float(chosen[true_top].sum() / k)
