"""Optimal ablation (Li & Janson, 2024, "Optimal ablation for interpretability"): the constants it fills in.

A head is optimally ablated by replacing its output z_i with the constant that hurts the loss least,

    c_i* = argmin_{c ∈ R^{d_k}} L(z_i := c),        abl_opt_i = L(z_i := c_i*) − L,

L the mean NLL over the scoring windows' scored tokens. No constant does better, so abl_opt measures what a
head contributes beyond any fixed vector; mean ablation (c = z̄_i) is one candidate, so abl_opt ≤ abl_mean.

The fit, per layer l (one resumable unit; the result is the fitted constants as lists):
  * the residual stream entering l is computed once per batch and kept; every pass runs layers l..L−1 only,
    with one ablated copy per head of l (copy j gates head j to 0 and fills c_j), copies batched;
  * Σ_j L_j(c_j) separates by head, so one backward of the sum gives every head its own gradient ∂L_j/∂c_j;
  * each head runs its own BFGS (the full d_k×d_k inverse-Hessian estimate: d_k ≤ 128, so L-BFGS's memory
    saving is not needed) with Armijo backtracking, vectorised over the heads: one pass over the fit data
    evaluates every head's trial point (loss and gradient) at once, a head that fails halves its step. A
    quasi-Newton method needs fewer passes than Adam on this smooth, low-dimensional problem (test model, 12
    heads, mean NLL gain over z̄ per head: Adam at 0.3 σ 16 steps 0.0152, 60 steps 0.0202; BFGS 16 passes
    0.0189, 48 passes 0.0223), and per-head line searches keep the heads independent
    (torch's L-BFGS on the sum would share one line search among them). The first step is a gradient step of
    0.3 σ_j per coordinate (RMS; σ_j the spread of z_j around z̄_j), no step exceeds 1 σ_j per coordinate;
  * heads only ever accept decreasing points and start at z̄_j, so on the fit data abl_opt ≤ abl_mean by
    construction.

Default budget :data:`STEPS` = 16 passes after the one at z̄ (each a forward and a backward of the ablation
sweep, ≈ 3 abl_mean sweeps, the last forward only), so the fit costs ≈ 3·16 abl_mean sweeps: affordable for
`score`, too slow for the default `run` on 2 CPU cores (see benchmarks/bench_optimal.py). The budget is a
trade: on the test model 16 passes reach 85% of the gain that 48 reach.

Pruning a set S with optimal compensation needs the constants optimal for ablating S *together*:
:func:`fit_set` fits them jointly (torch's L-BFGS), because the single-head c_i* do not compose.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor

from headprune.models.base import HeadModel
from headprune.models.hooks import Capture
from headprune.models.nll import unembed_nll
from headprune.perplexity import Batch
from headprune.scoring.base import Family, FamilyScores, ScoringContext, SideOutputs, Unit, by_head

STEPS = 16  # passes over the fit data per layer after the one at z̄ (each a forward and backward, all heads)
FIRST_STEP = 0.3  # length of the first (gradient) step: 0.3 σ per coordinate (RMS)
MAX_STEP = 1.0  # no step longer than 1 σ per coordinate (RMS): a flat direction must not run off


def scored_positions(t: Tensor, mask: Tensor) -> Tensor:
    """(b,h,L,...) -> (n,h,...) at the scored input positions; mask (b,L-1)."""
    return t[:, :, : mask.shape[1]].transpose(1, 2)[mask]


def _layer_losses(model: HeadModel, batches: list[Batch], resid: list[Tensor], layer: int, positions: list[int],
                  fill: Tensor, rows: int, grad: bool) -> tuple[Tensor, Tensor | None]:
    """NLL sums [p] (float64) of the copies ablating ``positions`` of ``layer`` with ``fill`` [n_heads, d_k]
    over all batches, and (``grad``) their gradient with respect to ``fill``."""
    n_heads, p = model.h[layer].attn.n_heads, len(positions)
    sums = torch.zeros(p, dtype=torch.float64)
    total_grad = torch.zeros_like(fill) if grad else None
    gates: list[Tensor | None] = [None] * model.cfg.n_layers
    fills: list[Tensor | None] = [None] * model.cfg.n_layers
    for batch, resid_pre in zip(batches, resid):
        tokens, mask = batch.tokens, batch.mask
        b = tokens.shape[0]
        copies = max(1, min(p, rows // b))
        for first in range(0, p, copies):
            chunk = positions[first:first + copies]
            gate = torch.ones(len(chunk), n_heads, device=model.device)
            gate[torch.arange(len(chunk), device=model.device), torch.tensor(chunk, device=model.device)] = 0
            gates[layer] = gate.repeat_interleave(b, dim=0)  # (c·b, h): copy j ablates positions[first + j]
            with torch.set_grad_enabled(grad):
                leaf = fill.detach().requires_grad_(grad)
                fills[layer] = leaf
                out = model.run_blocks(resid_pre.repeat(len(chunk), 1, 1), start=layer, gates=gates, fills=fills)
                loss = [(unembed_nll(model, copy, tokens).double() * mask).sum() for copy in out.split(b)]
                if grad:
                    assert total_grad is not None
                    total_grad += torch.autograd.grad(torch.stack(loss).sum(), leaf)[0]
            sums[first:first + len(chunk)] += torch.stack(loss).detach().cpu()
    return sums, total_grad


@torch.no_grad()
def _layer_inputs(model: HeadModel, batches: list[Batch], layer: int, init: Tensor) -> tuple[list[Tensor], Tensor]:
    """The residual stream entering ``layer`` per batch ((b, T, d) each), and σ [n_heads] (float64): each head's
    RMS spread around ``init`` [n_heads, d_k] over the scored tokens, σ_j² = mean over tokens and coordinates of
    (z_j − init_j)² (at least 1e-6)."""
    resid = [model.run_blocks(model.embed(b.tokens), stop=layer) for b in batches]  # (b, T, d) each
    sq = torch.zeros(model.h[layer].attn.n_heads, dtype=torch.float64)
    n = 0
    for batch, r in zip(batches, resid):
        capture = Capture()
        model.run_blocks(r, start=layer, stop=layer + 1, capture=capture)
        # (tokens, h, d_k)
        dev = scored_positions(capture.z[layer], batch.mask).double() - init.double().to(r.device)
        sq += (dev ** 2).mean(-1).sum(0).cpu()
        n += dev.shape[0]
    return resid, (sq / max(n, 1)).sqrt().clamp_min(1e-6)


def _bfgs_update(H: Tensor, scaled: Tensor, s: Tensor, y: Tensor, ok: Tensor) -> Tensor:
    """The inverse-Hessian estimates H [p, d_k, d_k] after the step s [p, d_k] (new point − old) with gradient
    change y [p, d_k], for the heads that accept it (``ok`` [p]) with curvature sᵀy > 0: a head's first such update
    first resets H to (sᵀy / yᵀy) I (``scaled`` [p] bool marks those, updated in place), then every one takes
    H ← V H Vᵀ + ρ s sᵀ, V = I − ρ s yᵀ, ρ = 1 / sᵀy. Other heads keep their H."""
    p, dk = s.shape
    sy = (s * y).sum(1)
    upd = ok & (sy > 1e-12 * s.norm(dim=1) * y.norm(dim=1))
    first = upd & ~scaled
    H[first] = (sy / (y * y).sum(1).clamp_min(1e-30))[first].view(-1, 1, 1) * torch.eye(dk, dtype=torch.float64)
    scaled |= upd
    rho = torch.where(upd, 1 / sy.clamp_min(1e-300), torch.zeros_like(sy)).view(p, 1, 1)
    V = torch.eye(dk, dtype=torch.float64) - rho * s.unsqueeze(2) @ y.unsqueeze(1)
    H_new = V @ H @ V.transpose(1, 2) + rho * s.unsqueeze(2) @ s.unsqueeze(1)
    return torch.where(upd.view(p, 1, 1), H_new, H)


def fit_layer(model: HeadModel, batches: list[Batch], layer: int, init: Tensor, positions: list[int] | None = None,
              steps: int = STEPS, lr: float = FIRST_STEP, rows: int = 8) -> dict[str, Any]:
    """Optimal constants of the heads at ``positions`` of ``layer`` (default: all), starting at ``init``
    ([n_heads, d_k], the mean outputs z̄), by per-head BFGS with backtracking (``steps`` passes over the fit
    data after the one at z̄; ``lr``: the first step's RMS length per coordinate, in units of σ).

    Returns lists: ``c`` [p][d_k] (each head's best point), ``nll_init`` and ``nll_best`` [p] (NLL sums
    over the fit data), ``best_step`` [p] (the pass that found the best point; 0: z̄ itself)."""
    batches = [b.to(model.device) for b in batches]
    n_heads = model.h[layer].attn.n_heads
    positions = list(range(n_heads)) if positions is None else list(positions)
    p, dk = len(positions), init.shape[1]
    init = init.to(model.device, torch.float32)
    resid, sigma = _layer_inputs(model, batches, layer, init)
    sigma = sigma[positions]  # [p]
    index = torch.tensor(positions, device=model.device)

    def loss_and_grad(c: Tensor, grad: bool) -> tuple[Tensor, Tensor | None]:  # c [p, d_k] float64
        fill = init.clone().index_copy(0, index, c.to(init))  # [n_heads, d_k]
        sums, g = _layer_losses(model, batches, resid, layer, positions, fill, rows, grad)
        return sums, (g[index].double().cpu() if g is not None else None)

    x = init[positions].double().cpu()  # [p, d_k]: each head's current (and best) point
    f, g = loss_and_grad(x, steps > 0)
    nll_init, best_step = f.clone(), [0] * p
    if steps > 0:
        assert g is not None
        scale = lr * sigma * dk**0.5 / g.norm(dim=1).clamp_min(1e-30)  # first step: lr·σ per coordinate (RMS)
        H = scale.view(p, 1, 1) * torch.eye(dk, dtype=torch.float64).expand(p, dk, dk)  # inverse-Hessian estimate
        d = -(H @ g.unsqueeze(2)).squeeze(2)  # [p, d_k] search directions
        t = torch.ones(p, dtype=torch.float64)  # per-head step length along d
        scaled = torch.zeros(p, dtype=torch.bool)  # whether H has had its first secant rescaling
        for step in range(1, steps + 1):
            step_len = t * d.norm(dim=1)  # trust region: at most MAX_STEP·σ per coordinate (RMS) in one step
            t = torch.where(step_len > MAX_STEP * sigma * dk**0.5, MAX_STEP * sigma * dk**0.5 / step_len * t, t)
            trial = x + t.unsqueeze(1) * d
            f_t, g_t = loss_and_grad(trial, step < steps)
            ok = f_t <= f + 1e-4 * t * (g * d).sum(1)  # Armijo: enough decrease
            if g_t is not None:  # BFGS update of the heads that accept: s = trial − x, y = g_t − g
                H = _bfgs_update(H, scaled, trial - x, g_t - g, ok)
                g = torch.where(ok.unsqueeze(1), g_t, g)
            x = torch.where(ok.unsqueeze(1), trial, x)
            f = torch.where(ok, f_t, f)
            best_step = [step if a else b for a, b in zip(ok.tolist(), best_step)]
            d = torch.where(ok.unsqueeze(1), -(H @ g.unsqueeze(2)).squeeze(2), d)
            t = torch.where(ok, torch.ones_like(t), t / 2)  # backtrack the heads that did not decrease
    return {"c": x.tolist(), "nll_init": nll_init.tolist(), "nll_best": f.tolist(), "best_step": best_step}


def fit_set(model: HeadModel, batches: list[Batch], heads: list[tuple[int, int]], init: Tensor, steps: int = STEPS
            ) -> dict[str, Any]:
    """Jointly optimal constants for ablating the set ``heads`` together (what pruning them with compensation
    does): argmin over c_S of L(z_i := c_i for every i in S), from ``init`` [|S|, d_k] (their z̄), by L-BFGS
    with a strong-Wolfe line search (torch.optim.LBFGS): at most ``steps`` iterations and 5/4 as many passes
    over the fit data, each a forward and backward from the first layer of S. The best point seen is kept, so
    on the fit data the result is never worse than mean compensation (c = z̄).

    Constants fitted one head at a time (abl_opt's c_i*) do not compose: on the shipped model each c_i* carries
    a shift that lowers the loss on its own and these shifts share a direction, so folding 24 of them adds it
    24 times (docs/methods.md, Pruning). A set is therefore fitted as a set.

    Returns lists: ``c`` [|S|][d_k] (the heads in the given order), ``nll_init`` and ``nll_best`` (NLL sums
    over the fit data at z̄ and at c)."""
    batches = [b.to(model.device) for b in batches]
    start = min(layer for layer, _ in heads)
    kept = model.cfg.kept_heads
    positions = [kept[layer].index(h) for layer, h in heads]
    n_layers = model.cfg.n_layers
    rows = {layer: [i for i, (l, _) in enumerate(heads) if l == layer] for layer, _ in heads}  # rows of x per layer
    where = {layer: torch.tensor([positions[i] for i in r], device=model.device) for layer, r in rows.items()}
    gates: list[Tensor | None] = [None] * n_layers
    for layer in rows:
        gates[layer] = torch.ones(len(kept[layer]), device=model.device).index_fill(0, where[layer], 0)
    x = init.detach().to(model.device, torch.float32).clone().requires_grad_(True)  # [|S|, d_k]
    with torch.no_grad():
        resid = [model.run_blocks(model.embed(b.tokens), stop=start) for b in batches]  # entering layer `start`

    def fills() -> list[Tensor | None]:  # per layer [n_heads_l, d_k]: x's rows at the ablated heads' positions
        out: list[Tensor | None] = [None] * n_layers
        for layer, r in rows.items():
            out[layer] = torch.zeros(len(kept[layer]), x.shape[1], device=model.device).index_put((where[layer],), x[r])
        return out

    best: dict[str, Any] = {}

    def closure() -> Tensor:  # NLL sum over the fit data; its gradient (only with respect to x) into x.grad
        total, grad = torch.zeros((), dtype=torch.float64), torch.zeros_like(x)
        with torch.enable_grad():
            for batch, r in zip(batches, resid):
                out = model.run_blocks(r, start=start, gates=gates, fills=fills())
                loss = (unembed_nll(model, out, batch.tokens).double() * batch.mask).sum()
                grad += torch.autograd.grad(loss, x)[0]
                total += loss.detach().cpu()
        x.grad = grad
        if not best or total < best["nll"]:
            best.update(nll=total, c=x.detach().clone())
        return total

    nll_init = float(closure())
    if steps > 0:
        opt = torch.optim.LBFGS([x], lr=1.0, max_iter=steps, max_eval=steps * 5 // 4, history_size=10,
                                tolerance_grad=1e-12, tolerance_change=1e-12, line_search_fn="strong_wolfe")
        opt.step(closure)
    return {"c": best["c"].double().cpu().tolist(), "nll_init": nll_init, "nll_best": float(best["nll"])}


class OptimalFit(Family):
    """Fits abl_opt's constants: a unit per layer (after the activations family's ``mean_z``, before the
    ablation family evaluates abl_opt); output ``opt_c`` [H, d_k], layer-major."""

    name = "optimal fit"
    methods = ()  # scores nothing itself: AblationScores evaluates abl_opt with these fills

    def wanted(self, methods: list[str]) -> bool:
        return "abl_opt" in methods

    def units(self, ctx: ScoringContext) -> list[Unit]:
        assert ctx.side.mean_z is not None, "the activations family measures mean_z first"
        means = by_head(ctx.model, ctx.side.mean_z)
        model = ctx.model

        def fit(layer: int) -> dict[str, Any]:
            init = torch.stack([means[(layer, h)] for h in model.cfg.kept_heads[layer]]).float()
            return fit_layer(model, ctx.batches, layer, init, None, ctx.optimal_steps, FIRST_STEP, ctx.ablation_rows)

        return [(f"opt/s{ctx.optimal_steps}/L{l}", partial(fit, l)) for l in model.active_layers]

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> FamilyScores:
        c = torch.tensor([row for r in results.values() for row in r["c"]], dtype=torch.float64)  # [H, d_k]
        return FamilyScores(side=SideOutputs(opt_c=c))
