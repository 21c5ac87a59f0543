"""What a command will cost, said before it is spent: FLOPs counted from the model itself, converted to time by one
timed forward on this machine.

One forward of N tokens in windows of T costs N·F FLOPs, F per token from the model's own shapes (multiply-add = 2):

    F = Σ_l [ 2·d·(h_l + 2·h_kv,l)·d_k + 2·h_l·d_k·d      Q/K/V and W_O (the ledger's attention table)
            + 4·h_l·d_k·T                                 QKᵀ and A·V over the window
            + 2·m·d·d_mlp ]                               the MLP: m = 3 matrices (gated: SwiGLU, GeGLU) or 2
        + 2·d·V                                           the LM head

Each scoring family in forward-equivalents (fe) of the tokens scored: weights ≈ 0, data (activations) 1,
gradients 2, each ablation method A = 1 + Σ_l h_l·((c_l··c_L) + u) / F: a head of layer l reruns layers l..L−1
and the LM head from the cached residual stream (u = 2·d·V, c_l the FLOPs of block l); the default ``score``
runs two ablation sweeps (abl_zero, abl_mean). ``rate`` (FLOP/s) comes from timing one forward of one window
(:func:`measured_rate`), so the estimate holds for this machine, its threads and this model's kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from headprune.models.base import HeadModel
from headprune.models.families import family_of
from headprune.models.ledger import attention_table
from headprune.models.nll import model_nll
from headprune.schema import METHOD_SPECS, VERIFIABLE, VERIFY_ROUNDS, VERIFY_SUBSETS

#: Estimated CPU time beyond which a command names the option that makes it cheaper.
WARN_SECONDS = 600.0


def block_flops(model: HeadModel, seq_len: int) -> list[float]:
    """FLOPs per token of each block (attention projections, scores over ``seq_len``, MLP)."""
    t = attention_table(model, seq_len)
    d, d_mlp = model.cfg.d_model, model.cfg.d_mlp
    mlp_mats = 3 if family_of(model).mlp == "gated" else 2  # gated (SwiGLU / GeGLU): gate, up, down
    attn = t.qkv_flops_per_token + t.W_O_flops_per_token + t.score_flops_per_token
    return [float(a) + 2 * mlp_mats * d * d_mlp for a in attn]


def head_flops(model: HeadModel) -> float:
    """FLOPs per token of the LM head, 2·d·V."""
    return 2.0 * model.cfg.d_model * model.cfg.vocab_size


def forward_flops(model: HeadModel, seq_len: int) -> float:
    """FLOPs per token of one forward: F = Σ_l c_l + u."""
    return sum(block_flops(model, seq_len)) + head_flops(model)


def ablation_fe(model: HeadModel, seq_len: int) -> float:
    """Forward-equivalents of one ablation method's sweep: the shared baseline forward, then every head of layer l
    rerunning layers l..L−1 and the LM head."""
    blocks, u = block_flops(model, seq_len), head_flops(model)
    per_head = sum(blk.attn.n_heads * (sum(blocks[layer:]) + u) for layer, blk in enumerate(model.h))
    return 1.0 + per_head / forward_flops(model, seq_len)


def verify_fe(model: HeadModel, seq_len: int, verified: int, subsets: int, estimate: bool = True,
              rounds: int = VERIFY_ROUNDS) -> dict[str, float]:
    """Forward-equivalents of :func:`headprune.scoring.verified.verify_ranking` (``total``), beside the exact
    sweep's (``sweep``): the estimate (``taylor``: a forward and a backward), the baseline forward (again for each
    later round's cached residual stream), the ``verified`` heads of each round at the sweep's mean cost per head,
    and a forward per subset (its lowest layer is nearly always early)."""
    sweep = ablation_fe(model, seq_len)
    per_head = (sweep - 1.0) / len(model.head_ids)
    estimate_fe = (METHOD_SPECS["taylor"].shared_fe or 0.0) if estimate else 0.0
    total = estimate_fe + rounds * (1.0 + verified * per_head) + subsets
    return {"total": total, "sweep": sweep}


def methods_fe(model: HeadModel, methods: list[str], seq_len: int) -> dict[str, float]:
    """Forward-equivalents of ``methods`` from their records (:class:`~headprune.schema.MethodSpec`): one shared
    pass per family (keyed by family), each ablation method's own sweeps (keyed by method)."""
    out: dict[str, float] = {}
    sweep = ablation_fe(model, seq_len)
    for method in methods:
        spec = METHOD_SPECS[method]
        if spec.shared_fe is not None:
            out[spec.family] = spec.shared_fe
        else:
            out[method] = sweep * spec.sweeps
    return out


def measured_rate(model: HeadModel, seq_len: int, repeats: int = 2) -> float:
    """FLOP/s of this machine on this model: the fastest of ``repeats`` timed forwards of one window (after one
    untimed warm-up), in the model's dtype and threads; the LM head in chunks (:func:`~headprune.models.nll.model_nll`)
    as every pass runs it, never the window's (T,V) logits (1 GiB at Gemma 3's vocabulary)."""
    tokens = torch.zeros(1, seq_len, dtype=torch.long, device=model.device)
    best = float("inf")
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        model_nll(model, tokens)
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            model_nll(model, tokens)
            sync()
            best = min(best, time.perf_counter() - start)
    return forward_flops(model, seq_len) * seq_len / best


@dataclass(frozen=True)
class Estimate:
    """Seconds per scoring family (wall time on this machine) for ``tokens`` tokens."""

    tokens: int
    seconds: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def line(self) -> str:
        parts = ", ".join(f"{k} {duration(v)}" for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])
                          if v >= 1)
        return f"estimated time: {duration(self.total)} on {self.tokens:,} tokens" + (f" ({parts})" if parts else "")


def seconds_per_fe(model: HeadModel, seq_len: int, tokens: int, rate: float | None = None) -> float:
    """Wall seconds of one forward-equivalent over ``tokens`` tokens in windows of ``seq_len``, at ``rate`` FLOP/s
    (default: :func:`measured_rate`)."""
    return forward_flops(model, seq_len) * tokens / (rate or measured_rate(model, seq_len))


def estimate_scoring(model: HeadModel, methods: list[str], tokens: int, seq_len: int,
                     rate: float | None = None) -> Estimate:
    """Wall seconds of scoring ``methods`` on ``tokens`` tokens in windows of ``seq_len``."""
    per_fe = seconds_per_fe(model, seq_len, tokens, rate)
    return Estimate(tokens, {k: fe * per_fe for k, fe in methods_fe(model, methods, seq_len).items()})


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cheaper_hint(estimate: Estimate, methods: list[str]) -> str | None:
    """Past :data:`WARN_SECONDS`: the options that make scoring cheaper, with what they cost instead."""
    if estimate.total <= WARN_SECONDS:
        return None
    sweeps = [m for m in methods if not METHOD_SPECS[m].cheap]
    cheap = [m for m in methods if m not in sweeps]
    if sweeps and cheap:
        rest = sum(v for k, v in estimate.seconds.items() if k not in sweeps)  # the shared passes
        return (f"over {duration(WARN_SECONDS)}: the ablation sweeps ({', '.join(sweeps)}) cost the most; "
                f"--methods {','.join(cheap)} takes about {duration(rest)}, or lower --max-tokens")
    return f"over {duration(WARN_SECONDS)}: lower --max-tokens (the time is proportional to it) or name fewer --methods"


def scoring_lines(model: HeadModel, methods: list[str], tokens: int, seq_len: int) -> list[str]:
    """What ``score`` and ``run`` say before scoring: the estimate, and past :data:`WARN_SECONDS` the cheaper
    options; nothing for the weight methods alone (no data, no forward)."""
    if not any(METHOD_SPECS[m].data_dependent for m in methods):
        return []
    from headprune.io.work.distributed import rank_and_world

    # one timed forward for both estimates; under --workers each of the processes runs its share at this rate
    rate = measured_rate(model, seq_len) * rank_and_world()[1]
    estimate = estimate_scoring(model, methods, tokens, seq_len, rate)
    hint = cheaper_hint(estimate, methods)
    lines = [estimate.line(), *([hint] if hint is not None else [])]
    verifiable = [m for m in methods if m in VERIFIABLE]
    if hint is not None and verifiable:
        from headprune.scoring.verified import Verification

        k = Verification().check(len(model.head_ids))  # the default: 10% of the heads
        seconds = verify_fe(model, seq_len, k, VERIFY_SUBSETS)["total"] * seconds_per_fe(model, seq_len, tokens, rate)
        lines.append(f"or rank by {verifiable[0]} without its full sweep: headprune verify --method {verifiable[0]} "
                     "(the estimate's top 10% ablated exactly, then the 10% its bound leaves most open) takes about "
                     f"{duration(seconds)}")
    return lines


# --- the whole run, and the token budget it picks for itself -------------------------------------------------

#: The wall time ``run`` aims at when it picks its own token budget (no ``--max-tokens``): 25 minutes of the
#: reference machine, so that the run ends within 30 with loading, tokenizing and the report.
RUN_BUDGET_SECONDS = 25 * 60.0
#: FLOP/s of ``run`` on the reference machine, two single-threaded processes on a 2-core AMD EPYC (the slower of
#: this project's two machine kinds), fitted to a run of SmolLM2-135M on 1,024 tokens per split (reports/benchmarks.md,
#: "A real model's run"). A constant, not a measurement, so that the budget, and with it every number of the run, is
#: the same on every machine and in every process.
REFERENCE_RATE = 1.4e11
#: The fewest windows a budget keeps (the 95% intervals resample windows), and the shortest window it picks.
MIN_WINDOWS, MIN_SEQ_LEN = 8, 128
#: The report's fixed part, the head anatomy (probes, attention roles, W_U W_E blocks) and the serving table's
#: uniform exports loaded and timed in transformers, in tokens of forwards (fitted: 42 s and 111 s on SmolLM2).
REPORT_TOKENS = 75_000
#: Mean tokens of a built-in patching task's prompt (the brackets' are 6-12, the induction's 21), whose study makes
#: the clean and corrupt runs, AtP's forward and backward and the exact patch of every head (a sweep) per pair.
PATCH_PROMPT_TOKENS = 12


@dataclass(frozen=True)
class RunPlan:
    """What one ``run`` computes, in the terms of its cost: the scored methods, the rankings the curves measure
    besides random, the fractions, random seeds and the patching task's prompt pairs (0: no patching)."""

    methods: list[str]
    rankings: int
    fractions: tuple[float, ...]
    seeds: int
    patch_pairs: int


def run_fe(model: HeadModel, plan: RunPlan, seq_len: int) -> dict[str, float]:
    """Forward-equivalents per stage, per token of a split (scoring: the validation split, curves: the test split):
    the scores (:func:`methods_fe`), and for the curves one evaluation per ranking, random seed and fraction above 0,
    plus the baseline and the best ranking's mean-compensated curve."""
    steps = sum(1 for f in plan.fractions if f > 0)
    return {"scoring": sum(methods_fe(model, plan.methods, seq_len).values()),
            "curves": 1.0 + (plan.rankings + plan.seeds + 1) * steps}


def patching_seconds(model: HeadModel, plan: RunPlan, rate: float) -> float:
    """Seconds of the patching study: clean, corrupt, AtP's forward and backward and the exact sweep of every head
    over ``2·pairs`` prompts of :data:`PATCH_PROMPT_TOKENS`."""
    if not plan.patch_pairs:
        return 0.0
    tokens = 2 * plan.patch_pairs * PATCH_PROMPT_TOKENS
    passes = 4.0 + ablation_fe(model, PATCH_PROMPT_TOKENS)
    return passes * forward_flops(model, PATCH_PROMPT_TOKENS) * tokens / rate


def fixed_seconds(model: HeadModel, plan: RunPlan, rate: float) -> dict[str, float]:
    """Wall seconds of the stages whose cost does not grow with the token budget: patching and the report."""
    report = forward_flops(model, MIN_SEQ_LEN) * REPORT_TOKENS / rate
    return {"patching": patching_seconds(model, plan, rate), "report": report}


def run_seconds(model: HeadModel, plan: RunPlan, tokens: int, seq_len: int, rate: float,
                stride: int | None = None) -> dict[str, float]:
    """Wall seconds per stage of a run on ``tokens`` tokens per split in windows of ``seq_len`` (overlapping ones,
    ``stride`` < ``seq_len``, repeat tokens), at ``rate``."""
    per_token = forward_flops(model, seq_len) * tokens / rate * seq_len / min(stride or seq_len, seq_len)
    out = {stage: fe * per_token for stage, fe in run_fe(model, plan, seq_len).items()}
    return out | fixed_seconds(model, plan, rate)


@dataclass(frozen=True)
class Budget:
    """The tokens per split and window length ``run`` picked, and the run's seconds per stage at the reference
    rate with them (``seconds``) and with the default budget (``default_seconds``)."""

    tokens: int
    seq_len: int
    seconds: dict[str, float]
    default_seconds: float

    def line(self, default_tokens: int) -> str:
        cut = self.tokens < default_tokens
        why = (f"for the model's size: {duration(sum(self.seconds.values()))} estimated on the reference machine "
               f"(2 cores), {default_tokens:,} tokens {duration(self.default_seconds)}; --max-tokens sets it"
               if cut else "the default")
        return f"budget: {self.tokens:,} tokens per split in windows of {self.seq_len} ({why})"


def run_budget(model: HeadModel, plan: RunPlan, default_tokens: int, seq_len: int | None, stride: int | None = None,
               seconds: float = RUN_BUDGET_SECONDS, rate: float = REFERENCE_RATE) -> Budget:
    """The largest token budget per split (at most ``default_tokens``) whose run takes at most ``seconds`` at
    ``rate``, in whole windows: ``seq_len`` when given, else the longest of the model's default window and its
    halvings down to :data:`MIN_SEQ_LEN` (none shorter than ``stride``) that leaves :data:`MIN_WINDOWS` windows. A
    budget below ``MIN_WINDOWS`` windows of the last candidate is raised to it (and overruns ``seconds``: the patching
    and the report alone may). Pure arithmetic on the model's shapes."""
    from headprune.perplexity import DEFAULT_MAX_SEQ_LEN

    default_seq = min(model.cfg.n_positions - (model.origin.bos_token_id is not None), DEFAULT_MAX_SEQ_LEN)
    if seq_len is not None:
        windows = [seq_len]
    else:
        windows = [default_seq >> k for k in range(default_seq.bit_length())
                   if (default_seq >> k) >= max(MIN_SEQ_LEN, stride or 1) or k == 0]
    fixed = sum(fixed_seconds(model, plan, rate).values())

    def seconds_per_token(window: int) -> float:
        return (sum(run_seconds(model, plan, 1, window, rate, stride).values()) - fixed)

    for window in windows:
        tokens = min(default_tokens, int(max(seconds - fixed, 0.0) / seconds_per_token(window)))
        if tokens >= MIN_WINDOWS * window:
            break
    tokens = max(tokens // window * window, min(default_tokens, MIN_WINDOWS * window))

    return Budget(tokens, window, run_seconds(model, plan, tokens, window, rate, stride),
                  sum(run_seconds(model, plan, default_tokens, windows[0], rate, stride).values()))
