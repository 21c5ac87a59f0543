"""Attribution patching: the first-order estimate of every head's patching effect from one backward pass.

AtP (Nanda 2023; Kramár et al. 2024, eq. 4), for head i and pair p, denoising (base = corrupt, source = clean):

    atp_z(i; p) = Σ_{t,k} (z_i(source) − z_i(base))[t,k] · ∂m/∂z_i[t,k] |_base          (one forward + one backward)

AtP* GradDrop (Kramár et al. 2024, §3.1.2): AtP cancels where a head's direct effect and its effect through
later layers have opposite signs. With ∂⁽ℓ⁾ the gradient when the backward pass through layer ℓ's residual
contribution (its block output minus input) is zeroed, the skip connection left intact:

    atp_star_z(i; p) = 1/(L−1) Σ_ℓ |Σ_{t,k} Δz_i[t,k] · ∂⁽ℓ⁾m/∂z_i[t,k]|                 (one forward + L backwards)

The ℓ = layer(i) term is 0 (every path from z_i leaves through its own layer), hence L − 1. It is a magnitude,
≥ 0. Each method's per-pair estimate of m with the head patched is the base run's m plus the estimate, so it
normalises as exact patching does (:class:`~.exact.Patching`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from headprune.models.base import HeadModel
from headprune.models.hooks import Capture
from headprune.patching.exact import Patching, Runs, run_pairs
from headprune.patching.metrics import DEFAULT_METRIC, last_logits, metric_values
from headprune.patching.pairs import PromptPairs


class _DropBranch(torch.autograd.Function):
    """Forward: a block's output. Backward: all of it, or (while ``holder[0]`` is this layer) only the skip path:
    the gradient goes to the block's input directly and nothing flows through the block."""

    @staticmethod
    def forward(ctx: Any, resid_in: Tensor, resid_out: Tensor, layer: int, holder: list) -> Tensor:
        ctx.layer, ctx.holder = layer, holder
        return resid_out.view_as(resid_out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        if ctx.holder[0] == ctx.layer:
            return grad, None, None, None
        return None, grad, None, None


def _base_forward(model: HeadModel, runs: Runs, holder: list | None = None) -> tuple[Tensor, dict[int, Tensor]]:
    """The base run with autograd: its metric (P,) and every active layer's z (P,h,T,d_k) in the graph.
    ``holder``: route each block through :class:`_DropBranch` (GradDrop)."""
    pairs = runs.pairs
    base = pairs.corrupt if runs.direction == "denoise" else pairs.clean
    resid = model.embed(base).detach().requires_grad_(True)  # the weights need no grad: z depends on this
    capture = Capture()
    for layer in range(model.cfg.n_layers):
        out = model.run_blocks(resid, start=layer, stop=layer + 1, capture=capture)  # one block, any family
        resid = out if holder is None else _DropBranch.apply(resid, out, layer, holder)
    logits = last_logits(model, resid, pairs.last)
    m = metric_values(runs.metric, logits, pairs.answer, pairs.wrong, runs.clean_logprobs)
    return m, {l: capture.z[l] for l in model.active_layers}


def _dot(model: HeadModel, runs: Runs, z: dict[int, Tensor], grads: tuple[Tensor, ...]) -> Tensor:
    """Σ_{t,k} (z_source − z_base) · grad per pair and head: [P, H] float64, layer-major."""
    return torch.cat([torch.einsum("phtk,phtk->ph", (runs.source_z[l] - z[l].detach()).double(), g.double())
                      for l, g in zip(model.active_layers, grads)], dim=1).cpu()


def _result(method: str, runs: Runs, estimate: Tensor, kv_heads: bool = False) -> Patching:
    return Patching(method, runs.m_base.double().cpu().view(-1, 1) + estimate, runs.m_clean.double().cpu(),
                    runs.m_corrupt.double().cpu(), direction=runs.direction, kv_heads=kv_heads)


def atp_z(model: HeadModel, pairs: PromptPairs, metric: str = DEFAULT_METRIC, direction: str = "denoise",
          runs: Runs | None = None) -> Patching:
    """AtP of every head's z (see the module docstring): the base run's forward and one backward."""
    model.require_heads("atp_z")
    runs = runs or run_pairs(model, pairs, metric, direction)
    with torch.enable_grad():
        m, z = _base_forward(model, runs)
        grads = torch.autograd.grad(m.sum(), list(z.values()))  # pairs are independent: row p holds ∂m_p/∂z
    return _result("atp_z", runs, _dot(model, runs, z, grads))


def atp_star_z(model: HeadModel, pairs: PromptPairs, metric: str = DEFAULT_METRIC, direction: str = "denoise",
               runs: Runs | None = None) -> Patching:
    """AtP* GradDrop of every head's z (see the module docstring): one forward, a backward per layer."""
    model.require_heads("atp_star_z")
    runs = runs or run_pairs(model, pairs, metric, direction)
    L = model.cfg.n_layers
    holder: list = [None]
    total = torch.zeros(len(pairs), len(model.head_ids), dtype=torch.float64)
    with torch.enable_grad():
        m, z = _base_forward(model, runs, holder)
        for layer in range(L):
            holder[0] = layer
            grads = torch.autograd.grad(m.sum(), list(z.values()), retain_graph=layer < L - 1, allow_unused=True)
            grads = tuple(torch.zeros_like(z[l]) if g is None else g for l, g in zip(z, grads))
            total += _dot(model, runs, z, grads).abs()
    sign = 1.0 if runs.direction == "denoise" else -1.0  # noising moves m away from the clean run
    return _result("atp_star_z", runs, sign * total / max(L - 1, 1))
