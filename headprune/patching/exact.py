"""Exact activation patching of every head, batched, from the cached residual stream.

Denoising (the default) runs the corrupt prompt with one head's activation taken from the clean run; noising
(``direction="noise"``) runs the clean prompt with the corrupt activation. For head i of layer l and pair p:

    patch_z        z_i ← z_i(source), all positions (or one position: ``by_position``)       (B,h,T,d_k)
    patch_q/k/v    q_i, k_i or v_i ← the source run's (after rotary), then attention recomputed  (B,h,T,d_k)
    patch_pattern  A_i ← the source run's attention probabilities (rows: query positions)       (B,h,T,T)

Under grouped-query attention the query heads G_g of KV group g share k_g and v_g, so k and v are patched per KV
group: one row per group, named ``L{l}G{g}`` (patching k_g changes the keys of every head in G_g, as the model has
no key of its own per query head). q, z and the pattern are per query head in every family.

and m_p = the metric at pair p's last position (:mod:`.metrics`). This equals TransformerLens's
``get_act_patch_attn_head_{out,q,k,v,pattern}_all_pos`` (``by_position``: ``..._by_pos``), but instead of a
full forward per head: the patched run's residual stream entering layer l is the unpatched one (cached once),
so a head of layer l reruns only layers l..L−1, several patched copies (one per head, each with its own gate
row) share one batched forward, and only the last positions are unembedded. A patched z is the model's own
ablation with gate 0 and a per-position fill (the source z); q, k, v and the pattern are replaced inside layer l's
attention by an :class:`~headprune.models.base.AttentionHook`, in any family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from headprune.bootstrap import ratio
from headprune.errors import HeadpruneError
from headprune.io.work.distributed import run_units
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.heads import group_id, head_id
from headprune.models.hooks import AttentionHook, Capture, hooked
from headprune.patching.metrics import DEFAULT_METRIC, check_metric, last_logits, metric_values
from headprune.patching.pairs import PromptPairs

DIRECTIONS = ("denoise", "noise")
ACTIVATIONS = ("z", "q", "k", "v", "pattern")  # what patch_<activation> replaces


@dataclass
class Runs:
    """The two unpatched runs of the pairs: the one patched (``base``) and the one patched from (``source``)."""

    pairs: PromptPairs
    metric: str
    direction: str
    m_clean: Tensor  # (P,) float32
    m_corrupt: Tensor  # (P,)
    clean_logprobs: Tensor  # (P, V) log p_clean at the last positions (kl's reference)
    base_resid: dict[int, Tensor] = field(default_factory=dict)  # resid_pre[l] (P,T,d) of the patched run
    source_resid: dict[int, Tensor] = field(default_factory=dict)  # resid_pre[l] of the source run
    source_z: dict[int, Tensor] = field(default_factory=dict)  # z[l] (P,h,T,d_k) of the source run

    @property
    def m_base(self) -> Tensor:
        """(P,) the metric of the unpatched run that is patched (corrupt denoising, clean noising)."""
        return self.m_corrupt if self.direction == "denoise" else self.m_clean

    def evaluate(self, model: HeadModel, resid: Tensor, rows: Tensor) -> Tensor:
        """The metric (N,) of final residual streams resid (N,T,d) of the pairs ``rows`` (N,)."""
        pairs = self.pairs
        logits = last_logits(model, resid, pairs.last[rows])
        return metric_values(self.metric, logits, pairs.answer[rows], pairs.wrong[rows], self.clean_logprobs[rows])


def per_kv_head(model, activation: str) -> bool:
    """Whether ``activation`` is patched per KV group: k and v of a grouped-query model."""
    return activation in ("k", "v") and getattr(model.cfg, "n_kv_heads", model.cfg.n_heads) < model.cfg.n_heads


def layer_units(model, layer: int, kv_heads: bool) -> list[int]:
    """Original indices of what patching replaces one at a time in ``layer``: its KV heads (``kv_heads``, see
    :func:`per_kv_head`) or its query heads."""
    return model.cfg.kept_kv_heads(layer) if kv_heads else model.cfg.kept_heads[layer]


def patch_units(model, kv_heads: bool) -> list[tuple[int, int]]:
    """(layer, original index) of every patched unit, layer-major: the columns of a :class:`Patching`."""
    return [(layer, u) for layer in model.active_layers for u in layer_units(model, layer, kv_heads)]


def unit_ids(model, kv_heads: bool) -> list[str]:
    """``L{l}H{i}`` per query head, or ``L{l}G{g}`` per KV group (``kv_heads``: k and v shared under GQA)."""
    name = group_id if kv_heads else head_id
    return [name(layer, u) for layer, u in patch_units(model, kv_heads)]


def patch_rows(model, rows: int | None = None) -> int:
    """Patched copies × pairs per forward: ``rows``, or 64 on a GPU and 16 on the CPU."""
    return rows or (64 if model.device.type == "cuda" else 16)


def check_direction(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise HeadpruneError(f"unknown direction {direction!r}; choose denoise or noise", "direction")
    return direction


@torch.no_grad()
def run_pairs(model: HeadModel, pairs: PromptPairs, metric: str = DEFAULT_METRIC, direction: str = "denoise") -> Runs:
    """Both unpatched runs (one forward each): their metrics, and the caches the patched runs start from."""
    check_metric(metric), check_direction(direction)
    pairs = pairs.check(model.cfg.vocab_size, model.cfg.n_positions).to(model.device)
    caps, logits = {}, {}
    for name, tokens in (("clean", pairs.clean), ("corrupt", pairs.corrupt)):
        caps[name] = Capture()
        logits[name] = last_logits(model, model.run_blocks(model.embed(tokens), capture=caps[name]), pairs.last)
    clean_lp = logits["clean"].float().log_softmax(-1)
    m = {k: metric_values(metric, v, pairs.answer, pairs.wrong, clean_lp) for k, v in logits.items()}
    base, source = ("corrupt", "clean") if direction == "denoise" else ("clean", "corrupt")
    return Runs(pairs, metric, direction, m["clean"], m["corrupt"], clean_lp, caps[base].resid_pre,
                caps[source].resid_pre, caps[source].z)


class ActivationPatch(AttentionHook):
    """q, k, v or the attention pattern replaced by ``source`` where ``keep`` is 0, in one layer's attention.

    keep (N,U,T): 1 keeps, 0 takes the source, per unit (query head; KV head for k and v) and position (the query
    position for the pattern); source: the activation's shape, (N,U,T,d_k) or (N,h,T,T). Exact: 1·t + 0·s = t."""

    def __init__(self, activation: str, keep: Tensor, source: Tensor):
        self.activation, self.keep, self.source = activation, keep, source
        self.needs_pattern = activation == "pattern"

    def _mix(self, t: Tensor) -> Tensor:
        g = self.keep.unsqueeze(-1).to(t.dtype)
        return g * t + (1 - g) * self.source.to(t.dtype)

    def qkv(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = (self._mix(t) if name == self.activation else t for name, t in (("q", q), ("k", k), ("v", v)))
        return q, k, v

    def pattern(self, probs: Tensor) -> Tensor:
        return self._mix(probs) if self.needs_pattern else probs


def source_activation(model, runs: Runs, layer: int, activation: str, rows: slice) -> Tensor:
    """The source run's q (N,h,T,d_k), k or v (N,h_kv,T,d_k) or pattern (N,h,T,T) of ``layer`` for the pairs
    ``rows``."""
    q, k, v = model.qkv(layer, runs.source_resid[layer][rows])
    return {"q": q, "k": k, "v": v}[activation] if activation != "pattern" else model.h[layer].attn.probs(q, k)


@torch.no_grad()
def patch_layer(model: HeadModel, runs: Runs, layer: int, activation: str = "z", by_position: bool = False,
                rows: int = 64) -> list:
    """The metric of every pair with each unit of ``layer`` (:func:`layer_units`) patched, one unit (and position)
    at a time: [P][U] (or [P][U][T] with ``by_position``), as lists."""
    P, T = runs.pairs.clean.shape
    U = len(layer_units(model, layer, per_kv_head(model, activation)))
    items = [(i, t) for i in range(U) for t in (range(T) if by_position else [None])]  # (unit, position)
    b = min(P, rows)
    copies = max(1, rows // b)
    gates: list[Tensor | None] = [None] * model.cfg.n_layers
    fills: list[Tensor | None] = [None] * model.cfg.n_layers
    out = torch.empty(P, len(items), device=model.device)
    for first_pair in range(0, P, b):
        sl = slice(first_pair, min(first_pair + b, P))
        n = sl.stop - sl.start
        pair_rows = torch.arange(sl.start, sl.stop, device=model.device)
        resid_l = runs.base_resid[layer][sl]
        source = runs.source_z[layer][sl] if activation == "z" else source_activation(model, runs, layer,
                                                                                       activation, sl)
        for first in range(0, len(items), copies):
            chunk = items[first : first + copies]
            c = len(chunk)
            keep = torch.ones(c, U, T, device=model.device)
            for j, (i, t) in enumerate(chunk):
                keep[j, i, slice(None) if t is None else t] = 0
            keep = keep.repeat_interleave(n, dim=0)  # (c·n, U, T): copy j patches item first+j
            if activation == "z":
                gates[layer] = keep if by_position else keep[:, :, 0]
                fills[layer] = source.repeat(c, 1, 1, 1)
                resid = model.run_blocks(resid_l.repeat(c, 1, 1), start=layer, gates=gates, fills=fills)
            else:
                with hooked(model, {layer: ActivationPatch(activation, keep, source.repeat(c, 1, 1, 1))}):
                    resid = model.run_blocks(resid_l.repeat(c, 1, 1), start=layer, stop=layer + 1)
                resid = model.run_blocks(resid, start=layer + 1)
            out[sl, first : first + c] = runs.evaluate(model, resid, pair_rows.repeat(c)).view(c, n).T
    return (out.view(P, U, T) if by_position else out).tolist()


@dataclass
class Patching:
    """Per-pair metrics with each head patched, and how they normalise (one method's result)."""

    method: str  # patch_z, patch_q, ..., atp_z, atp_star_z
    values: Tensor  # [P, H] (or [P, H, T]): the (estimated) metric of pair p with unit h patched, float64
    m_clean: Tensor  # [P]
    m_corrupt: Tensor  # [P]
    direction: str = "denoise"
    kv_heads: bool = False  # units are KV groups (k, v under GQA: :func:`per_kv_head`), else query heads

    def _shifted(self) -> Tensor:
        return self.values - self.m_corrupt.view(-1, *[1] * (self.values.dim() - 1))

    @property
    def effect(self) -> Tensor:
        """[H] (or [H, T]): (mean_p m_p − mean_p m_corrupt) / (mean_p m_clean − mean_p m_corrupt)."""
        return self._shifted().mean(0) / (self.m_clean.mean() - self.m_corrupt.mean())

    @property
    def change(self) -> Tensor:
        """The normalised effect minus the unpatched run's (0 denoising, 1 noising): what the head moves."""
        return self.effect - (0.0 if self.direction == "denoise" else 1.0)

    def replicates(self, counts: Tensor) -> Tensor:
        """Normalised effects [B, H...] of pair-resampling counts [B, P] (:func:`headprune.bootstrap.window_counts`)."""
        return ratio(self._shifted(), self.m_clean - self.m_corrupt)(counts)


@dataclass(frozen=True)
class PatchOptions:
    """How :func:`patch` patches: the ``metric`` read at each pair's last position (:mod:`.metrics`), the
    ``direction`` (denoise: the corrupt run patched from the clean one; noise: the reverse), each position
    separately (``by_position``) or all at once, and ``rows`` patched copies × pairs per forward (default 64 on a
    GPU, 16 on the CPU)."""

    metric: str = DEFAULT_METRIC
    direction: str = "denoise"
    by_position: bool = False
    rows: int | None = None


DEFAULT_PATCHING = PatchOptions()


def patch(
    model: HeadModel,
    pairs: PromptPairs,
    activation: str = "z",
    options: PatchOptions = DEFAULT_PATCHING,
    progress: Progress | NoProgress | None = None,
    bar: Callable = iter,
    runs: Runs | None = None,
) -> Patching:
    """Exact patching of every head's ``activation`` (z, q, k, v or pattern) as ``options`` say; see the module
    docstring.

    ``progress``: records a unit per layer, so a killed sweep resumes (and torchrun shares the layers). ``runs``: the
    unpatched runs, when already computed (:func:`run_pairs` with the same metric and direction)."""
    metric, direction, by_position = options.metric, options.direction, options.by_position
    if activation not in ACTIVATIONS:
        raise HeadpruneError(f"unknown activation {activation!r}; choose from {', '.join(ACTIVATIONS)}")
    model.require_heads(f"patch_{activation}")
    if by_position and not pairs.same_length:
        raise HeadpruneError("by_position needs pairs of one length (positions must mean the same in every pair)")
    runs = runs or run_pairs(model, pairs, metric, direction)
    rows = patch_rows(model, options.rows)
    tag = f"patch_{activation}/{metric}/{direction}/{'pos' if by_position else 'all'}"
    units: list[tuple[str, Callable[[], Any]]] = [
        (f"{tag}/L{l}", partial(patch_layer, model, runs, l, activation, by_position, rows))
        for l in model.active_layers]
    results = run_units(units, progress or NoProgress(), bar)
    values = torch.cat([torch.tensor(results[key], dtype=torch.float64) for key, _ in units], dim=1)  # [P, H(, T)]
    return Patching(f"patch_{activation}", values, runs.m_clean.double().cpu(), runs.m_corrupt.double().cpu(),
                    direction, per_kv_head(model, activation))


def patch_z(model: HeadModel, pairs: PromptPairs, metric: str = DEFAULT_METRIC, direction: str = "denoise",
            by_position: bool = False, rows: int | None = None, **kwargs) -> Patching:
    """Exact patching of every head's output z_i (all positions, or each position with ``by_position``)."""
    options = PatchOptions(metric=metric, direction=direction, by_position=by_position, rows=rows)
    return patch(model, pairs, "z", options=options, **kwargs)
