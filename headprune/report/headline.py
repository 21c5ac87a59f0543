"""The report's first screen: three questions answered in words, each sentence computed from the tables.

1. **Which heads matter?** The :data:`NAMED_HEADS` heads with the largest ``abl_zero`` (the NLL increase when one
   head alone is zero-ablated: the score every other one is judged against), and the layer whose heads hold the
   largest share of *the total*: Σ abl_zero over the heads of that layer / Σ abl_zero over all heads (finite
   values; stated only where every layer's sum is ≥ 0, so shares lie in [0, 1]).
2. **Which cheap score to trust?** Of the cheap scores (families weights, activations, gradients: no ablation
   sweep), the one with the largest Spearman ρ against ``abl_zero``, with its 95% head-bootstrap interval, is
   trusted where that interval lies above 0; those whose interval reaches 0 or below are not. Rankings that prune
   worse than random (ΔNLL above the random mean + 1 std) at every finding fraction are named, with where each
   one's ranking normalised per layer (``<method>@layer``) lies against that band at each fraction: better (below
   the mean − 1 std), within, or worse.
3. **What does pruning cost?** Perplexity unpruned → after pruning the best ranking's :data:`FINDING_FRACTIONS`
   of heads (and the best ``@layer`` ranking's), relative change ppl / ppl₀ − 1, next to random's; then how each
   was chosen, held out or not (:func:`.choice.choice_sentences`).

A sentence whose numbers are missing is left out.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.report.choice import choice_sentences, choose, layer_choice
from headprune.report.findings import (
    BEATS,
    FINDING_FRACTIONS,
    WITHIN,
    WORSE,
    layer_totals,
    span,
    verdict,
)
from headprune.report.layers import layer_answer
from headprune.report.numbers import names
from headprune.report.tables import FRACTION_TOL, read_at, top_heads
from headprune.schema import DESCRIPTIVE, LAYER_NORMALIZED, RANDOM, TRUTH, is_cheap

NAMED_HEADS = 5
SUM_OF_SINGLES = "single ablations summed"
DETAIL = 2  # more untrusted scores than this: one range of ρ and of the intervals instead of each


class Rho(NamedTuple):
    """One cheap score's Spearman ρ against abl_zero and its 95% head-bootstrap interval (NaN: none)."""

    method: str
    n: int
    rho: float
    lo: float
    hi: float

    @property
    def lower(self) -> float:
        return self.rho if math.isnan(self.lo) else self.lo

    @property
    def upper(self) -> float:
        return self.rho if math.isnan(self.hi) else self.hi


def rho_text(r: Rho) -> str:
    """``ρ 0.81 (95% interval 0.64 to 0.90)``; without an interval only the point."""
    text = f"ρ {r.rho:.2f}"
    return text if math.isnan(r.lo) or math.isnan(r.hi) else text + f" (95% interval {r.lo:.2f} to {r.hi:.2f})"


def heads_answer(scores: pd.DataFrame, layers: pd.DataFrame | None = None) -> str | None:
    """Which heads matter: the top heads by abl_zero, then the layer whose heads removed together cost most
    (:func:`.layers.layer_answer`, with ``layers``) or else the share of the summed abl_zero its leading layer holds."""
    top = top_heads(scores, NAMED_HEADS)
    if top.empty:
        return None
    text = (f"The heads that matter most by {TRUTH} (the NLL increase when the head alone is zero-ablated): "
            f"{names(list(top['head_id']))}.")
    if layers is not None:
        return f"{text} {layer_answer(layers)}"
    totals = layer_totals(scores)
    total, n = float(totals.sum()), int(scores[TRUTH].notna().sum())
    layer, value = int(totals.index[0]), float(totals.iloc[0])
    if total > 0 and (totals >= 0).all():
        text += (f" Layer {layer} holds {value / total:.0%} of {TRUTH} summed over all {n} heads ({value:.3f} of "
                 f"{total:.3f} nats/token; {SUM_OF_SINGLES}).")
    else:
        text += f" Layer {layer} has the largest sum of {TRUTH} ({value:.3f} nats/token)."
    return text


def cheap_rows(pred: pd.DataFrame) -> list[Rho]:
    """The cheap importance scores with a finite ρ, largest ρ first (ties: table order)."""
    if pred.empty:
        return []
    rows = pred[~pred["method"].isin(DESCRIPTIVE) & pred["method"].map(is_cheap)]
    rows = rows[rows["spearman_rho"].notna()].sort_values("spearman_rho", ascending=False, kind="stable")

    def col(name: str) -> list[float]:
        return [float(v) for v in rows[name]] if name in rows else [math.nan] * len(rows)

    return [Rho(str(m), int(n), float(r), lo, hi) for m, n, r, lo, hi in zip(
        rows["method"], rows["n"], rows["spearman_rho"], col("spearman_ci_lo"), col("spearman_ci_hi"))]


VERDICT_WORDS = {BEATS: "better than random", WITHIN: "within the random band", WORSE: "worse than random"}


def verdict_phrase(verdicts: tuple[str, ...]) -> str:
    """``worse than random at 30%, within the random band at 50%``: one clause per verdict, in the order of
    :data:`FINDING_FRACTIONS` (fractions sharing a verdict joined)."""
    by: dict[str, list[str]] = {}
    for v, t in zip(verdicts, FINDING_FRACTIONS, strict=True):
        by.setdefault(v, []).append(f"{t:.0%}")
    return ", ".join(f"{VERDICT_WORDS[v]} at {names(at)}" for v, at in by.items())


def layer_verdicts(curves: pd.DataFrame) -> dict[str, tuple[str, ...]]:
    """For each method worse than random at every finding fraction that has a ``<method>@layer`` curve: that
    ranking's verdict against the random band at each of :data:`FINDING_FRACTIONS` (:func:`verdict`)."""
    out: dict[str, tuple[str, ...]] = {}
    variants = set(curves["method"])
    for m in dict.fromkeys(curves["method"]):
        if m + LAYER_NORMALIZED not in variants:
            continue
        plain = [verdict(curves, m, t) for t in FINDING_FRACTIONS]
        if all(v == WORSE for v in plain):
            found = tuple(verdict(curves, m + LAYER_NORMALIZED, t) for t in FINDING_FRACTIONS)
            out[m] = tuple(v for v in found if v is not None)
    return out


def normalised_sentence(curves: pd.DataFrame) -> str | None:
    """The scores that prune worse than random at every finding fraction, and where each one's ``@layer`` ranking
    lies against the random band at each (better, within, worse: mean ± 1 std over seeds)."""
    found = layer_verdicts(curves)
    if not found:
        return None
    at = names([f"{t:.0%}" for t in FINDING_FRACTIONS])
    groups: dict[tuple[str, ...], list[str]] = {}
    for m, v in found.items():
        groups.setdefault(v, []).append(m + LAYER_NORMALIZED)
    clauses = [f"{names(ms)} {verdict_phrase(v)}" for v, ms in groups.items()]
    return (f"{names(list(found))} prune worse than random at {at} of heads; normalised per layer: "
            + "; ".join(clauses) + ".")


def trust_answer(pred: pd.DataFrame, curves: pd.DataFrame) -> str | None:
    """Which cheap score to trust (largest ρ, interval above 0) and which not (interval reaching 0 or below)."""
    rows = cheap_rows(pred)
    if not rows:
        return None
    best = rows[0]
    if best.lower > 0:
        text = (f"Trust {best.method}, the best of the cheap scores: Spearman {rho_text(best)} with {TRUTH} over "
                f"{best.n} heads.")
        also = [r for r in rows[1:] if r.lower > 0]
        if also:
            text += " Its interval lies above 0, and so does that of " \
                    f"{'; '.join(f'{r.method} ({rho_text(r)})' for r in also)}."
    else:
        text = f"No cheap score ranks heads like {TRUTH}: the best, {best.method}, has Spearman {rho_text(best)}."
    order = {m: i for i, m in enumerate(pred["method"])}  # the table's order
    bad = sorted((r for r in rows[1:] if r.lower <= 0), key=lambda r: order[r.method])
    if len(bad) > DETAIL:
        text += (f" Do not trust {names([r.method for r in bad])}: their ρ lies between "
                 f"{min(r.rho for r in bad):.2f} and {max(r.rho for r in bad):.2f}, and every 95% interval reaches 0 "
                 f"or below (together {min(r.lower for r in bad):.2f} to {max(r.upper for r in bad):.2f}).")
    elif bad:
        text += f" Do not trust {'; '.join(f'{r.method} ({rho_text(r)})' for r in bad)}: the interval reaches 0 " \
                "or below."
    extra = [x for x in (within_sentence(pred), normalised_sentence(curves)) if x]
    return " ".join([text, *extra])


FLIPS = {(1, 0): "rank heads like {t} across layers but not within a layer",
         (1, -1): "rank heads like {t} across layers but inversely within a layer",
         (0, 1): "rank heads like {t} within a layer but not across layers",
         (-1, 0): "rank heads inversely to {t} across layers only, not within a layer",
         (-1, 1): "rank heads inversely to {t} across layers but like it within a layer",
         (0, -1): "rank heads inversely to {t} within a layer but not across layers"}


def sign_class(lo: float, hi: float) -> int:
    """+1 where a 95% interval lies above 0, −1 below 0, 0 where it holds 0 (or is missing)."""
    return 1 if lo > 0 else -1 if hi < 0 else 0


def within_layer_flips(pred: pd.DataFrame) -> dict[tuple[int, int], list[tuple[str, float, float, float]]]:
    """The cheap scores whose global ρ interval and within-layer ρ interval (``predictiveness``) say different
    things: (global class, within class) -> [(method, within ρ, lo, hi)], table order."""
    out: dict[tuple[int, int], list[tuple[str, float, float, float]]] = {}
    if pred.empty or "within_layer_rho" not in pred:
        return out
    columns = ["method", "spearman_ci_lo", "spearman_ci_hi", "within_layer_rho", "within_layer_ci_lo",
               "within_layer_ci_hi"]
    for method, g_lo, g_hi, rho, lo, hi in pred[columns].itertuples(index=False):
        m = str(method)
        if m in DESCRIPTIVE or not is_cheap(m) or math.isnan(float(rho)):
            continue
        key = (sign_class(float(g_lo), float(g_hi)), sign_class(float(lo), float(hi)))
        if key[0] != key[1]:
            out.setdefault(key, []).append((m, float(rho), float(lo), float(hi)))
    return out


SIDE_WORDS = {1: "above 0", -1: "below 0", 0: "reaching 0"}


def within_sentence(pred: pd.DataFrame) -> str | None:
    """Where the within-layer ρ flips the global verdict (both 95% intervals against 0): the scores of each kind of
    flip named together with the span of their within-layer ρ (their own values: the predictiveness table)."""
    flips = within_layer_flips(pred)
    if not flips:
        return None
    parts = []
    for key, rows in flips.items():
        parts.append(f"{names([m for m, _, _, _ in rows])} {FLIPS[key].format(t=TRUTH)} (within-layer ρ "
                     f"{span([rho for _, rho, _, _ in rows])}, "
                     f"{'its' if len(rows) == 1 else 'every'} 95% interval {SIDE_WORDS[key[1]]})")
    return "Compared within each layer only, the verdict changes: " + "; ".join(parts) + "."


def best_layer_ranking(curves: pd.DataFrame) -> str | None:
    """The ``<method>@layer`` ranking chosen as :func:`.choice.best_method` chooses (None: there is none)."""
    choice = layer_choice(curves)
    return None if choice is None else choice.pick


def _ppl_at(curves: pd.DataFrame, method: str, target: float) -> tuple[float, float] | None:
    """(fraction read, perplexity) of ``method``'s uncompensated curve nearest ``target``."""
    return read_at(curves, method, "ppl", target)


def change(ppl: float, base: float) -> str:
    """Relative perplexity change ppl / base − 1, e.g. ``+3.1%``."""
    return f"{ppl / base - 1:+.1%}"


def cost_answer(curves: pd.DataFrame, baseline: dict) -> str | None:
    """Perplexity unpruned → pruned at 30% and 50% by the best ranking (and best @layer one), next to random; then
    how each was chosen (:func:`.choice.choice_sentences`) and where the best ranking breaks
    (:func:`.breaks.break_sentence`)."""
    try:
        choice = choose(curves)
    except HeadpruneError:
        return None
    base = float(baseline["ppl"])
    if not math.isfinite(base) or base <= 0:
        return None
    best, layer = choice.pick, layer_choice(curves)
    rankings = [(best, f" ({choice.label})")]
    rankings += [(layer.pick, f" (best {LAYER_NORMALIZED})")] if layer is not None and layer.pick != best else []
    sentences = [f"Perplexity {base:.1f} unpruned."]
    for k, target in enumerate(FINDING_FRACTIONS):
        parts = []
        for method, role in rankings:
            read = _ppl_at(curves, method, target)
            if read is not None:
                parts.append(f"{method}{role if k == 0 else ''} {read[1]:.1f}, {change(read[1], base)}")
        rand = _ppl_at(curves, RANDOM, target)
        parts += [f"random {rand[1]:.1f}, {change(rand[1], base)}"] if rand is not None else []
        where = f"{target:.0%}"
        fraction = _ppl_at(curves, best, target)
        if fraction is not None and abs(fraction[0] - target) > FRACTION_TOL:
            where += f" (nearest point: {fraction[0]:.1%})"
        sentences.append(f"Pruning {where} of heads: {'; '.join(parts)}.")
    chosen = [choice, *([layer] if len(rankings) > 1 and layer is not None else [])]
    sentences += choice_sentences(chosen, curves, FINDING_FRACTIONS)
    return " ".join(sentences)


QUESTIONS = ("Which heads matter?", "Which cheap score to trust?", "What does pruning cost?")


def answers(scores: pd.DataFrame, curves: pd.DataFrame, pred: pd.DataFrame, baseline: dict,
            layers: pd.DataFrame | None = None) -> list[tuple[str, str]]:
    """(question, answer) for each of :data:`QUESTIONS` whose numbers are there (``layers``: the checked layers
    table, where the run has one)."""
    found = (heads_answer(scores, layers), trust_answer(pred, curves), cost_answer(curves, baseline))
    return [(q, a) for q, a in zip(QUESTIONS, found) if a]
