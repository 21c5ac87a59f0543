"""The whole ``run``'s cost per stage, and the token budget it picks for itself (at a reference rate, the same on
every machine), or its estimate at this machine's pace."""

from __future__ import annotations

from dataclasses import dataclass

from headprune.cost.estimate import Estimate, duration, estimate_scoring, hint_lines, patching_fe
from headprune.cost.flops import forward_flops, layers_fe, methods_fe
from headprune.cost.rate import Pace
from headprune.models.base import HeadModel

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
    the scores (:func:`methods_fe`), each layer's heads removed together on both splits (:func:`layers_fe`), and for
    the curves one evaluation per ranking, random seed and fraction above 0, plus the baseline and the best ranking's
    mean-compensated curve."""
    steps = sum(1 for f in plan.fractions if f > 0)
    return {"scoring": sum(methods_fe(model, plan.methods, seq_len).values()),
            "layers": 2.0 * layers_fe(model, seq_len),
            "curves": 1.0 + (plan.rankings + plan.seeds + 1) * steps}


def patching_seconds(model: HeadModel, plan: RunPlan, rate: float) -> float:
    """Seconds of the patching study: clean, corrupt, AtP's forward and backward and the exact sweep of every head
    over ``2·pairs`` prompts of :data:`PATCH_PROMPT_TOKENS`."""
    if not plan.patch_pairs:
        return 0.0
    tokens = 2 * plan.patch_pairs * PATCH_PROMPT_TOKENS
    passes = patching_fe(model, PATCH_PROMPT_TOKENS, activations=1, approximations=1, subsets=0)
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


def estimate_run(model: HeadModel, plan: RunPlan, tokens: int, seq_len: int, pace: Pace,
                 stride: int | None = None) -> Estimate:
    """Wall seconds per stage of a run on ``tokens`` tokens per split at this machine's ``pace``."""
    seconds = run_seconds(model, plan, tokens, seq_len, pace.rate * pace.world, stride)
    return Estimate(f"for the run on {tokens:,} tokens per split", seconds)


def run_lines(model: HeadModel, plan: RunPlan, tokens: int, windowing, methods: list[str]) -> list[str]:
    """What ``run`` says before its work: the estimate per stage at this machine's pace, and past
    :data:`~headprune.cost.estimate.WARN_SECONDS` of scoring the cheaper options."""
    seq_len, stride = windowing.seq_len, windowing.stride
    pace = Pace.here(model, seq_len)
    estimate = estimate_run(model, plan, tokens, seq_len, pace, stride)
    scoring = estimate_scoring(model, methods, tokens, seq_len, pace)
    return [estimate.line(), *hint_lines(model, scoring, methods, tokens, seq_len, pace)]
