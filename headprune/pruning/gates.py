"""Learned head gates: hard-concrete L0 gates trained with the model frozen (Voita et al., 2019).

Voita, Talbot, Moiseev, Sennrich & Titov (2019), "Analyzing Multi-Head Self-Attention: Specialized Heads Do
the Heavy Lifting, the Rest Can Be Pruned": every head i gets a stochastic gate z_i ∈ [0, 1] multiplying its
output (``model.forward``'s gates: z_i = 0 is zero ablation, the same as removing the head). The gate follows
the hard-concrete distribution of Louizos, Welling & Kingma (2018), "Learning Sparse Neural Networks through
L0 Regularization", with one parameter log α_i, temperature β = 2/3 and stretch (γ, ζ) = (−0.1, 1.1):

    u ~ U(0, 1),   s = σ((log u − log(1 − u) + log α_i) / β),   z_i = min(1, max(0, s (ζ − γ) + γ))

so that, for 0 ≤ x < 1 (and P(z_i ≤ 1) = 1),

    P(z_i ≤ x) = σ(β logit((x − γ)/(ζ − γ)) − log α_i),   P(z_i ≠ 0) = σ(log α_i − β log(−γ/ζ))

and the expected number of open gates E‖z‖₀ = Σ_i P(z_i ≠ 0) is differentiable in log α. The model's
weights stay frozen; only log α (one per head) is trained, by Adam on the scoring split, to minimise

    fixed penalty λ:    NLL + λ · E‖z‖₀                                              (Voita et al.)
    target sparsity t:  NLL + λ₁ (ŝ − t_k) + λ₂ (ŝ − t_k)²,   ŝ = 1 − E‖z‖₀ / N       (Lagrangian)

where the multipliers λ₁, λ₂ are learned by gradient *ascent* and the target t_k rises linearly from 0 to t
over the first half of the steps: the target-sparsity Lagrangian of Wang, Wohlwend & Lei (2020),
"Structured Pruning of Large Language Models", as used by CoFi (Xia, Zhong & Chen, 2022). NLL is the mean
over the batch's scored tokens; each window of a batch draws its own gate sample ([B, n_heads] per layer).

After training, each head's probability of staying open P(z_i ≠ 0) is its score (column ``gate``: higher =
keep), and the round(t·N) heads with the lowest are closed — exactly the heads ``select_heads(table,
"gate", fraction=t)`` picks, so ``prune --method gate --fraction t`` removes them.

Seeded (the noise u comes from one ``torch.Generator``), deterministic on the CPU, and resumable: every
``checkpoint_every`` steps the whole state (log α, multipliers, both optimisers' moments, the generator and
the loss history) is recorded as one unit of a :class:`~headprune.io.work.progress.Progress`, so a killed run resumes
from its last checkpoint to bit-identical results (JSON round-trips every float exactly).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from headprune.errors import HeadpruneError
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.heads import head_id
from headprune.models.interventions import Head
from headprune.models.nll import model_nll
from headprune.perplexity import Batch
from headprune.pruning.gate_state import GateState, checkpoint_key, latest_checkpoint

BETA, GAMMA, ZETA = 2 / 3, -0.1, 1.1  # Louizos et al.'s temperature and stretch interval
EPS = 1e-6  # u is drawn from [EPS, 1 − EPS]: log u and log(1 − u) stay finite
INIT_LOG_ALPHA = 3.0  # every gate starts almost surely open: P(z ≠ 0) = σ(3 + β log 11) ≈ 0.99
LR = 0.1  # Adam learning rate of log α
LAMBDA_LR = 0.01  # Adam learning rate (ascent) of the Lagrange multipliers (0.05 overshoots the target)
WARMUP = 0.5  # share of the steps over which the target sparsity rises from 0 to t
CHECKPOINT_EVERY = 10  # steps between checkpoints
GATE = "gate"  # the method name (schema.LEARNED_METHODS)


# ---------------------------------------------------------------- the hard-concrete distribution


def sample_gates(log_alpha: Tensor, u: Tensor) -> Tensor:
    """Hard-concrete gates z = clamp(σ((logit u + log α)/β)(ζ − γ) + γ, 0, 1); u ∈ (0, 1) broadcasts over log α."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def prob_open(log_alpha: Tensor) -> Tensor:
    """P(z ≠ 0) = σ(log α − β log(−γ/ζ)), elementwise; its sum is E‖z‖₀."""
    return torch.sigmoid(log_alpha - BETA * math.log(-GAMMA / ZETA))


def gate_cdf(log_alpha: Tensor, x: float) -> Tensor:
    """P(z ≤ x) for 0 ≤ x < 1: σ(β logit((x − γ)/(ζ − γ)) − log α) (x = 0: the probability that the gate is shut)."""
    if not 0.0 <= x < 1.0:
        raise ValueError(f"x {x} must lie in [0, 1)")
    c = (x - GAMMA) / (ZETA - GAMMA)
    return torch.sigmoid(BETA * math.log(c / (1 - c)) - log_alpha)


def deterministic_gates(log_alpha: Tensor) -> Tensor:
    """Louizos et al.'s test-time gate clamp(σ(log α)(ζ − γ) + γ, 0, 1) (it orders heads as P(z ≠ 0) does)."""
    return (torch.sigmoid(log_alpha) * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


# ---------------------------------------------------------------- training


@dataclass(frozen=True)
class GateOptions:
    """How :func:`learn_gates` trains: ``steps`` Adam steps (one batch each) towards a target share of closed
    heads ``sparsity`` (the Lagrangian) or under a fixed ``penalty`` λ on E‖z‖₀ (exactly one of the two); ``lr``
    and ``lambda_lr`` the learning rates of log α and of the multipliers; ``seed`` the gates' noise;
    ``checkpoint_every`` steps between checkpoints."""

    steps: int
    sparsity: float | None = None
    penalty: float | None = None
    lr: float = LR
    lambda_lr: float = LAMBDA_LR
    seed: int = 0
    checkpoint_every: int = CHECKPOINT_EVERY


@dataclass
class GateResult:
    """What :func:`learn_gates` returns."""

    table: pd.DataFrame  # layer, head, head_id, model_fingerprint, gate = P(z ≠ 0) (a scores table)
    closed: list[Head]  # the round(t·N) heads with the lowest gate, least likely open first ([] without a target)
    log_alpha: list[float]  # per head, model.head_ids order
    lambdas: list[float]  # λ₁, λ₂ (target sparsity) or [λ] (fixed penalty)
    history: list[dict] = field(default_factory=list)  # per checkpoint: step, loss, nll, open (means since the last)
    steps_run: int = 0  # steps this call computed (the others came from the progress file)

    def _repr_html_(self) -> str:  # Jupyter's view: the key numbers and the top heads
        from headprune.display import gates_html

        return gates_html(self)


def _split(flat: Tensor, model: HeadModel) -> list[Tensor | None]:
    """[B, N] layer-major gates -> per layer [B, n_heads_l] (None for a layer without heads)."""
    out: list[Tensor | None] = []
    start = 0
    for kept in model.cfg.kept_heads:
        out.append(flat[:, start:start + len(kept)] if kept else None)
        start += len(kept)
    return out


def _constant(value: Any) -> Callable[[], Any]:
    return lambda: value


def check_gate_settings(steps: int, sparsity: float | None, penalty: float | None) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise HeadpruneError(f"steps {steps!r} must be a whole number >= 1", "gate_steps")
    if (sparsity is None) == (penalty is None):
        raise HeadpruneError("give exactly one of sparsity (a target) and penalty (a fixed lambda)")
    if sparsity is not None and not 0.0 <= sparsity <= 1.0:
        raise HeadpruneError(f"sparsity {sparsity!r} must lie in [0, 1]", "sparsity")
    if penalty is not None and not (math.isfinite(penalty) and penalty >= 0):
        raise HeadpruneError(f"penalty {penalty!r} must be a number >= 0", "penalty")


def learn_gates(
    model: HeadModel,
    batches: list[Batch],  # the scoring split's windows (Windowing.batches); step k uses batch k mod len
    *,
    options: GateOptions,
    progress: Progress | NoProgress | None = None,
    prefix: str = "gates",  # progress keys: several trainings may share one progress file
    show_progress: bool = True,
) -> GateResult:
    """Train one hard-concrete gate per head of the frozen ``model`` as ``options`` say; see the module docstring."""
    model.require_heads("learning head gates")
    steps, sparsity, penalty = options.steps, options.sparsity, options.penalty
    check_gate_settings(steps, sparsity, penalty)
    if not batches:
        raise HeadpruneError("learning gates needs scoring data: the corpus gave no window")
    progress = progress or NoProgress()
    n = len(model.head_ids)
    state = _fresh_state(n, model.device, options)
    if (saved := latest_checkpoint(progress, prefix)) is not None:
        state.restore(saved, steps)
    start = state.step
    warmup = max(1, round(WARMUP * steps))
    sums = {"loss": 0.0, "nll": 0.0, "open": 0.0, "n": 0}
    bar = tqdm(range(start, steps), initial=start, total=steps, disable=not show_progress, leave=False,
               desc=f"gates ({'sparsity ' + format(sparsity, 'g') if sparsity is not None else f'lambda {penalty:g}'})")
    for step in bar:
        # the target sparsity t_k rises linearly from 0 to t over the warmup steps (None: a fixed penalty)
        target = sparsity * min(1.0, (step + 1) / warmup) if sparsity is not None else None
        loss, nll, expected_open = _train_step(model, batches[step % len(batches)], state, penalty, target)
        sums = {"loss": sums["loss"] + loss, "nll": sums["nll"] + nll, "open": sums["open"] + expected_open,
                "n": sums["n"] + 1}
        bar.set_postfix(loss=f"{loss:.4f}", open=f"{expected_open:.1f}/{n}")
        state.step = step + 1
        if (step + 1) % options.checkpoint_every == 0 or step + 1 == steps:
            state.history.append({"step": step + 1, **{k: sums[k] / sums["n"] for k in ("loss", "nll", "open")}})
            sums = {"loss": 0.0, "nll": 0.0, "open": 0.0, "n": 0}
            progress.get_or_compute(checkpoint_key(prefix, step + 1), _constant(state.checkpoint()))
    bar.close()
    return _gate_result(model, state, options, steps - start)


def _fresh_state(n: int, device: torch.device, options: GateOptions) -> GateState:
    """The state before the first step: every log α_i at :data:`INIT_LOG_ALPHA` (N of them), the multipliers at 0
    (two with a target sparsity, none under a fixed penalty), fresh Adam optimisers, the noise seeded."""
    target = options.sparsity is not None
    log_alpha = torch.full((n,), INIT_LOG_ALPHA, dtype=torch.float32, device=device, requires_grad=True)
    lambdas = torch.zeros(2 if target else 0, dtype=torch.float32, device=device, requires_grad=True)
    opt = torch.optim.Adam([log_alpha], lr=options.lr)
    lam_opt = torch.optim.Adam([lambdas], lr=options.lambda_lr, maximize=True) if target else None
    return GateState(log_alpha, lambdas, opt, lam_opt, torch.Generator().manual_seed(options.seed))


def _train_step(model: HeadModel, batch: Batch, state: GateState, penalty: float | None, target: float | None
                ) -> tuple[float, float, float]:
    """One step on ``batch``: draw the gates z [B, N], descend log α on the loss (NLL + λ E‖z‖₀, λ = ``penalty``,
    where ``target`` is None; else NLL + λ₁ (ŝ − t_k) + λ₂ (ŝ − t_k)², t_k = ``target``) and ascend λ₁, λ₂.
    Returns the loss, NLL and E‖z‖₀ before the update."""
    log_alpha, lambdas, n = state.log_alpha, state.lambdas, len(state.log_alpha)
    batch = batch.to(model.device)
    u = torch.rand(batch.tokens.shape[0], n, generator=state.gen) * (1 - 2 * EPS) + EPS  # [B, N], on the CPU: seeded
    with torch.enable_grad():
        z = sample_gates(log_alpha, u.to(model.device))  # [B, N]
        nll_tok = model_nll(model, batch.tokens, gates=_split(z, model))  # (B, T-1)
        nll = (nll_tok * batch.mask).sum() / batch.mask.sum()
        expected_open = prob_open(log_alpha).sum()
        if target is None:
            assert penalty is not None
            loss = nll + penalty * expected_open
            (g_alpha,) = torch.autograd.grad(loss, [log_alpha])
        else:
            gap = (1 - expected_open / n) - target  # ŝ − t_k
            loss = nll + lambdas[0] * gap + lambdas[1] * gap * gap
            g_alpha, g_lambda = torch.autograd.grad(loss, [log_alpha, lambdas])
    log_alpha.grad = g_alpha
    state.opt.step()
    if state.lam_opt is not None:
        lambdas.grad = g_lambda
        state.lam_opt.step()
    return loss.item(), nll.item(), expected_open.item()


def _gate_result(model: HeadModel, state: GateState, options: GateOptions, steps_run: int) -> GateResult:
    """The trained gates as a result: the scores table (column ``gate`` = P(z_i ≠ 0), float64), the round(t·N)
    heads with the lowest closed (none under a fixed penalty), log α, and the multipliers (or [λ])."""
    from headprune.io.read.fingerprint import model_fingerprint
    from headprune.pruning.selection import select_heads

    keep = prob_open(state.log_alpha.detach().double()).cpu()  # [N] float64
    heads = model.head_ids
    table = pd.DataFrame({"layer": [l for l, _ in heads], "head": [h for _, h in heads],
                          "head_id": [head_id(l, h) for l, h in heads], "model_fingerprint": model_fingerprint(model),
                          GATE: keep.tolist()})
    sparsity = options.sparsity
    closed = select_heads(table, GATE, fraction=sparsity) if sparsity is not None else []
    lambdas = state.lambdas.detach().cpu().tolist() if sparsity is not None else [float(options.penalty or 0.0)]
    return GateResult(table, closed, state.log_alpha.detach().cpu().tolist(), lambdas, state.history, steps_run)


def gate_objective(model: HeadModel, batches: list[Batch], log_alpha: Tensor, penalty: float, samples: int = 4,
                   seed: int = 1234) -> float:
    """NLL + λ·E‖z‖₀ averaged over ``batches`` and ``samples`` fixed gate draws each (for comparing log α's)."""
    gen = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    with torch.no_grad():
        for _ in range(samples):
            for batch in batches:
                batch = batch.to(model.device)
                u = torch.rand(batch.tokens.shape[0], len(log_alpha), generator=gen) * (1 - 2 * EPS) + EPS
                z = sample_gates(log_alpha.to(model.device), u.to(model.device))
                nll_tok = model_nll(model, batch.tokens, gates=_split(z, model))
                total += float((nll_tok * batch.mask).sum() / batch.mask.sum())
                count += 1
    return total / count + penalty * float(prob_open(log_alpha).sum())


def gate_head_sets(
    model: HeadModel,
    batches: list[Batch],
    fractions: list[float],
    steps: int,
    lr: float = LR,
    seed: int = 0,
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
) -> dict[tuple[str, float], list[Head]]:
    """{("gate", f): the round(f·N) heads closed by gates learned at target sparsity f}, one training per fraction
    (the head sets of ``pruning_curves``). Fractions that close no head or every head need no training."""
    progress = progress or NoProgress()
    heads = model.head_ids
    out: dict[tuple[str, float], list[Head]] = {}
    for f in fractions:
        k = round(f * len(heads))
        if k in (0, len(heads)):
            out[(GATE, f)] = list(heads) if k else []
            continue

        def train(f: float = f) -> list[list[int]]:
            options = GateOptions(steps, sparsity=f, lr=lr, seed=seed)
            result = learn_gates(model, batches, options=options, progress=progress, prefix=f"gates/{f!r}",
                                 show_progress=show_progress)
            return [list(h) for h in result.closed]

        out[(GATE, f)] = [(int(l), int(h)) for l, h in progress.get_or_compute(f"gates/{f!r}/closed", train)]
    return out
