"""Attribution patching of every head's queries or keys (all positions at once), plain and with AtP*'s QK-fix.

For head i of layer l and pair p, base = corrupt and source = clean (denoising; swapped with ``direction="noise"``),
x ∈ {q, k} (each (T, d_k)) and A_i the head's attention probabilities (T, T), rows the query positions:

    atp_x(i; p)       = Σ_{t,c} (x_i(source) − x_i(base))[t,c] · ∂m/∂x_i[t,c] |_base        (one forward + one backward)

AtP linearises m at the softmax's input, so a saturated head (a row of A_i near one-hot) reads as unimportant
however far the patch moves its scores. The QK-fix (Kramár et al. 2024, §3.1.1) computes the patched attention
probabilities exactly and linearises only from the softmax's output on:

    A_i'              = softmax(q_i' k_i'ᵀ · scale + causal mask)    (x = q: q' = q_i(source), k' = k_i(base); k: swap)
    atp_qkfix_x(i; p) = Σ_{t,s} (A_i' − A_i)[t,s] · ∂m/∂A_i[t,s] |_base                  (one forward + one backward)

with the model's own scale and mask (the attention's ``probs``, rotary included); heads do not mix in the softmax,
so A' for every head of a layer is one call. For a key patched at one position s the paper sums this over the
queries that see s; patching all positions of the head at once, the sum over every (t, s) is the same formula.

Under grouped-query attention keys are per KV group g (exact patching's rows ``L{l}G{g}``): atp_k(g) takes
k_g and ∂m/∂k_g, and the QK-fix sums Σ_{t,s} (A_i' − A_i) · ∂m/∂A_i over the query heads i that read g.

AtP* is the QK-fix and GradDrop together (the paper's AtP* applies both changes): ∂⁽ℓ⁾ is the gradient with the
backward pass through layer ℓ's residual contribution zeroed (:class:`.attribution._DropBranch`; the ℓ = l term is
0, every path from A_i leaves through its own layer), and

    atp_star_x(i; p)  = 1/(L−1) Σ_ℓ |Σ_{t,s} (A_i' − A_i)[t,s] · ∂⁽ℓ⁾m/∂A_i[t,s]|         (one forward + L backwards)

a magnitude, signed like :func:`.attribution.atp_star_z` (+ denoising, − noising). Each estimate is added to the
base run's m, so it normalises as exact patching (:func:`.exact.patch` with q or k) does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.hooks import AttentionHook, Capture, hooked
from headprune.patching.attribution import _DropBranch, _result
from headprune.patching.exact import Patching, Runs, patch_units, per_kv_head, run_pairs
from headprune.patching.metrics import DEFAULT_METRIC, last_logits, metric_values
from headprune.patching.pairs import PromptPairs

QK = ("q", "k")


class _Record(AttentionHook):
    """Keeps the layer's q (P,h,T,d_k) and k (P,h_kv,T,d_k) of the forward, in its graph."""

    def qkv(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        self.q, self.k = q, k
        return q, k, v


def _forward(model: HeadModel, runs: Runs, holder: list | None = None) -> tuple[Tensor, dict[int, _Record], Capture]:
    """The base run with autograd and explicit attention probabilities: its metric (P,), every active layer's
    q and k (:class:`_Record`) and a Capture whose attn[l] (P,h,T,T) is the pattern z is computed from.
    ``holder``: route each block through :class:`_DropBranch` (GradDrop)."""
    pairs = runs.pairs
    base = pairs.corrupt if runs.direction == "denoise" else pairs.clean
    resid = model.embed(base).detach().requires_grad_(True)  # the weights need no grad
    capture, records = Capture(), {l: _Record() for l in model.active_layers}
    with hooked(model, records):
        for layer in range(model.cfg.n_layers):
            out = model.run_blocks(resid, start=layer, stop=layer + 1, capture=capture, need_weights=True)
            resid = out if holder is None else _DropBranch.apply(resid, out, layer, holder)
    logits = last_logits(model, resid, pairs.last)
    return metric_values(runs.metric, logits, pairs.answer, pairs.wrong, runs.clean_logprobs), records, capture


def _check(model: HeadModel, activation: str, method: str) -> None:
    if activation not in QK:
        raise HeadpruneError(f"{method} patches q or k, not {activation!r}")
    model.require_heads(method)


def atp_qk(model: HeadModel, pairs: PromptPairs, activation: str, metric: str = DEFAULT_METRIC,
           direction: str = "denoise", runs: Runs | None = None) -> Patching:
    """Plain AtP of every head's q or k (``activation``; the module docstring's atp_x; k per KV group under GQA)."""
    _check(model, activation, f"atp_{activation}")
    runs = runs or run_pairs(model, pairs, metric, direction)
    which = QK.index(activation)
    with torch.enable_grad():
        m, rec, _ = _forward(model, runs)
        base = {l: (rec[l].q, rec[l].k)[which] for l in model.active_layers}
        grads = torch.autograd.grad(m.sum(), list(base.values()))  # row p: ∂m_p/∂x
    parts = []
    for (l, x), g in zip(base.items(), grads):
        with torch.no_grad():
            source = model.qkv(l, runs.source_resid[l])[which]
        parts.append(torch.einsum("phtc,phtc->ph", (source - x.detach()).double(), g.double()))
    return _result(f"atp_{activation}", runs, torch.cat(parts, dim=1).cpu(), per_kv_head(model, activation))


def _pattern_change(model: HeadModel, runs: Runs, rec: dict[int, _Record], activation: str) -> dict[int, Tensor]:
    """A' − A (P,h,T,T) per active layer: the base run's pattern against the one with every head's q (or every
    KV head's k) from the source run, both from the attention's own ``probs`` (heads are independent in the
    softmax, so one call patches them all)."""
    change = {}
    with torch.no_grad():
        for l in model.active_layers:
            attn = model.h[l].attn
            q, k = rec[l].q.detach(), rec[l].k.detach()
            q_s, k_s, _ = model.qkv(l, runs.source_resid[l])
            patched = attn.probs(q_s, k) if activation == "q" else attn.probs(q, k_s)
            change[l] = (patched.double() - attn.probs(q, k).double())
    return change


def _dot(model: HeadModel, change: dict[int, Tensor], grads: tuple[Tensor | None, ...], activation: str) -> Tensor:
    """Σ_{t,s} (A' − A) · grad per pair and unit: [P, U] float64, layer-major (a missing grad is 0). For k under
    GQA a KV group's value sums its query heads' (patching k_g moves every pattern of the group)."""
    parts = []
    for l, g in zip(model.active_layers, grads):
        P, h = change[l].shape[:2]
        d = (torch.zeros(P, h, dtype=torch.float64, device=change[l].device) if g is None
             else torch.einsum("phts,phts->ph", change[l], g.double()))
        if per_kv_head(model, activation):
            attn: Any = model.h[l].attn
            d = d.new_zeros(P, attn.n_kv_heads).index_add_(1, attn.kv_group, d)
        parts.append(d)
    return torch.cat(parts, dim=1).cpu()


def atp_qkfix(model: HeadModel, pairs: PromptPairs, activation: str, metric: str = DEFAULT_METRIC,
              direction: str = "denoise", runs: Runs | None = None) -> Patching:
    """AtP with the QK-fix of every head's q or k (the module docstring's atp_qkfix_x): one forward, one backward."""
    _check(model, activation, f"atp_qkfix_{activation}")
    runs = runs or run_pairs(model, pairs, metric, direction)
    with torch.enable_grad():
        m, rec, cap = _forward(model, runs)
        grads = torch.autograd.grad(m.sum(), [cap.attn[l] for l in model.active_layers])
    estimate = _dot(model, _pattern_change(model, runs, rec, activation), grads, activation)
    return _result(f"atp_qkfix_{activation}", runs, estimate, per_kv_head(model, activation))


def atp_star_qk(model: HeadModel, pairs: PromptPairs, activation: str, metric: str = DEFAULT_METRIC,
                direction: str = "denoise", runs: Runs | None = None) -> Patching:
    """AtP* of every head's q or k: the QK-fix with GradDrop (the module docstring's atp_star_x)."""
    _check(model, activation, f"atp_star_{activation}")
    runs = runs or run_pairs(model, pairs, metric, direction)
    L = model.cfg.n_layers
    holder: list = [None]
    total = torch.zeros(len(runs.pairs), len(patch_units(model, per_kv_head(model, activation))), dtype=torch.float64)
    with torch.enable_grad():
        m, rec, cap = _forward(model, runs, holder)
        change = _pattern_change(model, runs, rec, activation)
        for layer in range(L):
            holder[0] = layer
            grads = torch.autograd.grad(m.sum(), [cap.attn[l] for l in model.active_layers],
                                        retain_graph=layer < L - 1, allow_unused=True)
            total += _dot(model, change, grads, activation).abs()
    sign = 1.0 if runs.direction == "denoise" else -1.0  # noising moves m away from the clean run
    return _result(f"atp_star_{activation}", runs, sign * total / max(L - 1, 1), per_kv_head(model, activation))


def atp_q(model: HeadModel, pairs: PromptPairs, metric: str = DEFAULT_METRIC, direction: str = "denoise",
          runs: Runs | None = None) -> Patching:
    return atp_qk(model, pairs, "q", metric, direction, runs)


def atp_k(model: HeadModel, pairs: PromptPairs, metric: str = DEFAULT_METRIC, direction: str = "denoise",
          runs: Runs | None = None) -> Patching:
    return atp_qk(model, pairs, "k", metric, direction, runs)
