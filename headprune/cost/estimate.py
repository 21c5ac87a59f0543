"""What a command will cost, said before it is spent: the work in forward-equivalents (:mod:`.flops`) at this
machine's pace (:mod:`.rate`), printed as a range.

The range is the point estimate divided and multiplied by :data:`ESTIMATE_SPREAD`: the spread of measured over
estimated time across the commands, models, worker counts and cold or warm caches of ``benchmarks/bench_estimates.py``
(reports/benchmarks.md, "Cost estimates"), plus the minute-to-minute noise of a shared host.
"""

from __future__ import annotations

from dataclasses import dataclass

from headprune.cost.flops import ablation_fe, layers_fe, methods_fe, verify_fe
from headprune.cost.rate import Pace
from headprune.models.base import HeadModel
from headprune.schema import METHOD_SPECS, RANKABLE, VERIFY_SUBSETS

#: Estimated time beyond which a command names the option that makes it cheaper.
WARN_SECONDS = 600.0
#: The printed range: point / spread to point · spread.
ESTIMATE_SPREAD = 1.5


def duration(seconds: float) -> str:
    """Seconds to 2 significant figures in s, min or h: '41 s', '3.5 min', '12 min', '1.2 h'."""
    if seconds < 99.5:
        return f"{seconds:.0f} s"
    if seconds < 5970:
        minutes = seconds / 60
        return f"{minutes:.1f} min" if minutes < 9.95 else f"{minutes:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Estimate:
    """Wall seconds per part of a command's work on this machine; ``what`` says what it covers ('on 8,192
    tokens')."""

    what: str
    seconds: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def low(self) -> float:
        return self.total / ESTIMATE_SPREAD

    @property
    def high(self) -> float:
        return self.total * ESTIMATE_SPREAD

    def line(self) -> str:
        """'estimated time: 27 s to 1 min (about 41 s) on 8,192 tokens (abl_zero 20 s, abl_mean 20 s)'."""
        parts = ", ".join(f"{k} {duration(v)}" for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])
                          if v >= 1 and len(self.seconds) > 1)
        return (f"estimated time: {duration(self.low)} to {duration(self.high)} (about {duration(self.total)}) "
                f"{self.what}" + (f" ({parts})" if parts else ""))


def estimate_scoring(model: HeadModel, methods: list[str], tokens: int, seq_len: int, pace: Pace) -> Estimate:
    """Wall seconds of scoring ``methods`` on ``tokens`` tokens in windows of ``seq_len``."""
    return Estimate(f"on {tokens:,} tokens", {k: pace.seconds(model, seq_len, tokens, fe)
                                              for k, fe in methods_fe(model, methods, seq_len).items()})


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


def scoring_lines(model: HeadModel, methods: list[str], tokens: int, seq_len: int,
                  pace: Pace | None = None) -> list[str]:
    """What ``score`` says before scoring: the estimate, and past :data:`WARN_SECONDS` the cheaper options;
    nothing for the weight methods alone (no data, no forward)."""
    if not any(METHOD_SPECS[m].data_dependent for m in methods):
        return []
    pace = pace or Pace.here(model, seq_len)
    estimate = estimate_scoring(model, methods, tokens, seq_len, pace)
    return [estimate.line(), *hint_lines(model, estimate, methods, tokens, seq_len, pace)]


def hint_lines(model: HeadModel, estimate: Estimate, methods: list[str], tokens: int, seq_len: int,
               pace: Pace) -> list[str]:
    """Past :data:`WARN_SECONDS`: the cheaper options, and ``verify`` and ``rank`` for the first verifiable method."""
    hint = cheaper_hint(estimate, methods)
    if hint is None:
        return []
    lines = [hint]
    verifiable = [m for m in methods if m in RANKABLE]
    if verifiable:
        from headprune.scoring.verified import Verification

        k = Verification().check(len(model.head_ids))  # the default: 10% of the heads
        seconds = pace.seconds(model, seq_len, tokens, verify_fe(model, seq_len, k, VERIFY_SUBSETS)["total"])
        lines.append(f"or rank by {verifiable[0]} without its full sweep: headprune verify --method {verifiable[0]} "
                     "(the estimate's top 10% ablated exactly, then the 10% its bound leaves most open) takes about "
                     f"{duration(seconds)}")
        from headprune.scoring.adaptive import AdaptiveOptions

        first = min(tokens, AdaptiveOptions().first_windows * seq_len)
        first_round = estimate_scoring(model, verifiable[:1], first, seq_len, pace).total
        lines.append(f"or certify its top 10% exactly within a time you choose: headprune rank --method "
                     f"{verifiable[0]} --margin 0.005 --max-minutes M (its first round, every head on {first:,} "
                     f"tokens, takes about {duration(first_round)}; then only the heads whose place is open)")
    return lines


def estimate_curves(model: HeadModel, points: int, tokens: int, seq_len: int, pace: Pace,
                    fill_tokens: int = 0) -> Estimate:
    """Wall seconds of ``curve``: the unpruned baseline and ``points`` pruned models, a forward each over
    ``tokens``, and the mean fills' forward over ``fill_tokens`` (0: none)."""
    seconds = {"curves": pace.seconds(model, seq_len, tokens, 1.0 + points)}
    if fill_tokens:
        seconds["fills"] = pace.seconds(model, seq_len, fill_tokens)
    return Estimate(f"for {points} pruned models on {tokens:,} tokens", seconds)


def estimate_layers(model: HeadModel, tokens: int, seq_len: int, pace: Pace) -> Estimate:
    """Wall seconds of each layer's heads removed together (:func:`~.flops.layers_fe`) on ``tokens`` tokens."""
    seconds = pace.seconds(model, seq_len, tokens, layers_fe(model, seq_len))
    return Estimate(f"on {tokens:,} tokens", {"layers": seconds})


def estimate_verify(model: HeadModel, seq_len: int, tokens: int, pace: Pace, fe: dict[str, float]
                    ) -> tuple[Estimate, Estimate]:
    """(verifying, the exact sweep of every unit) on ``tokens``, from their forward-equivalents ``fe``
    (:func:`~headprune.cost.flops.verify_fe`): both with the estimate's own pass where it is computed here (it
    orders the table either way)."""
    what = f"on {tokens:,} tokens"
    return (Estimate(what, {"verify": pace.seconds(model, seq_len, tokens, fe["total"])}),
            Estimate(what, {"sweep": pace.seconds(model, seq_len, tokens, fe["sweep"] + fe["estimate"])}))


def patching_fe(model: HeadModel, prompt_len: int, activations: int, approximations: int, subsets: int,
                by_position: bool = False) -> float:
    """Forward-equivalents of a patching study per prompt token: the clean and corrupt runs, AtP's forward and
    backward (3), each patched activation's exact sweep of every head (of every position with ``by_position``), and
    one forward per bound subset of each approximation."""
    sweeps = activations * (ablation_fe(model, prompt_len) - 1.0) * (prompt_len if by_position else 1)
    return 2.0 + (3.0 if approximations else 0.0) + sweeps + subsets * approximations


def estimate_patching(model: HeadModel, pairs: int, prompt_len: int, activations: int, approximations: int,
                      subsets: int, pace: Pace, by_position: bool = False) -> Estimate:
    """Wall seconds of a patching study over ``pairs`` clean/corrupt prompt pairs of ``prompt_len`` tokens."""
    fe = patching_fe(model, prompt_len, activations, approximations, subsets, by_position)
    return Estimate(f"for {pairs} prompt pairs", {"patching": pace.seconds(model, prompt_len, pairs * prompt_len, fe)})


def estimate_context(model: HeadModel, methods: list[str], score_tokens: int, seq_len: int, points: int,
                     point_tokens: int, pace: Pace) -> Estimate:
    """Wall seconds of ``context``: the ctx_* scores on ``score_tokens`` and ``points`` streaming patterns, a
    forward each over ``point_tokens`` (the curve's windows and prompts)."""
    seconds = estimate_scoring(model, methods, score_tokens, seq_len, pace).seconds
    seconds["curve"] = pace.seconds(model, seq_len, point_tokens, points)
    return Estimate(f"for the scores on {score_tokens:,} tokens and {points} streaming patterns on "
                    f"{point_tokens:,} tokens each", seconds)
