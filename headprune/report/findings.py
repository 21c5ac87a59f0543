"""The report's headline: three to six sentences computed from the tables, shown before anything else.

1. which layer matters most: its heads removed together, chosen on the validation split and measured on the test
   split with intervals (:mod:`.layers_section`), or, where the run did not remove layers whole, ``abl_zero`` summed
   over each layer's heads (said to be a sum);
2. how far the ranking is decided: the heads certainly in, certainly out of and contested for the top 10% by their
   rank intervals, the costliest named with theirs (:mod:`.rank_precision`);
3. at 30% and at 50% of heads pruned: which scores beat the random band (ΔNLL below the random mean minus one
   standard deviation over seeds) and by how much, which are worse than it;
4. which scores rank heads inversely to ``abl_zero`` (the 95% interval of Spearman ρ below 0 or of the ROC-AUC
   below 0.5);
5. what mean (and optimal) compensation buys (ΔNLL with and without, same method and fraction).

A sentence whose numbers are missing (no ``abl_zero``, no random curve, no compensated curve) is left out.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from headprune.errors import HeadpruneError
from headprune.report.breaks import break_sentence
from headprune.report.choice import choose
from headprune.report.layers import layer_finding
from headprune.report.numbers import names
from headprune.report.rank_precision import rank_sentence
from headprune.report.tables import FRACTION_TOL, nearest_row
from headprune.schema import DESCRIPTIVE, RANDOM, TRUTH

FINDING_FRACTIONS = (0.3, 0.5)
INVERSE_DETAIL = 2  # more inverse scores than this: one range of ρ and of ROC-AUC instead of each


def nats(value: float) -> str:
    return f"{value:.3f}"


def layer_totals(scores: pd.DataFrame) -> pd.Series:
    """abl_zero summed over each layer's heads (finite values), largest first; ties: smaller layer first."""
    if TRUTH not in scores.columns:
        return pd.Series(dtype=float)
    finite = scores[np.isfinite(scores[TRUTH].to_numpy(float))]
    totals = finite.groupby("layer")[TRUTH].sum()
    return totals.sort_values(ascending=False, kind="stable")


def layer_sentence(scores: pd.DataFrame) -> str | None:
    totals = layer_totals(scores)
    if totals.empty:
        return None
    top, value = int(totals.index[0]), float(totals.iloc[0])
    text = f"Layer {top} matters most: its heads' {TRUTH} (NLL increase when one head is zero-ablated) sum to " \
           f"{nats(value)} nats/token (a sum of single ablations: the layer's heads were not removed together)"
    if totals.sum() > 0 and (totals >= 0).all():
        text += f", {value / totals.sum():.0%} of all heads' total"
    if len(totals) > 1:
        text += f"; next is layer {int(totals.index[1])} ({nats(float(totals.iloc[1]))})"
    return text + "."


def _at(group: pd.DataFrame, target: float) -> pd.Series:
    return nearest_row(group, target)


def versus_random(curves: pd.DataFrame, target: float):
    """(random row, [(method, delta_nll, margin)] beating the band, [methods above it]) at ``target``;
    None without a random curve. margin = random mean ΔNLL − method ΔNLL; beaters sorted by margin, largest first."""
    none = curves[curves["compensation"] == "none"]
    rand = none[none["method"] == RANDOM]
    if rand.empty:
        return None
    r = _at(rand, target)
    std = 0.0 if math.isnan(r["nll_std"]) else float(r["nll_std"])
    beat, worse = [], []
    for method, group in none[none["method"] != RANDOM].groupby("method", sort=False):
        delta = float(_at(group, target)["delta_nll"])
        if delta < r["delta_nll"] - std:
            beat.append((method, delta, float(r["delta_nll"]) - delta))
        elif delta > r["delta_nll"] + std:
            worse.append(method)
    beat.sort(key=lambda b: -b[2])
    return r, beat, worse


BEATS, WITHIN, WORSE = "beats", "within", "worse"  # against the random band at one fraction


def verdict(curves: pd.DataFrame, method: str, target: float) -> str | None:
    """Where ``method``'s uncompensated ΔNLL nearest ``target`` lies against the random band (mean ± 1 std over
    seeds at the same point): :data:`BEATS` below it, :data:`WORSE` above it, :data:`WITHIN` inside (None: no
    random curve or no such method)."""
    found = versus_random(curves, target)
    if found is None or not (curves["method"] == method).any():
        return None
    _, beat, worse = found
    return BEATS if method in {m for m, _, _ in beat} else WORSE if method in worse else WITHIN


def band_text(r: pd.Series) -> str:
    """``the random band (ΔNLL 1.420 ± 0.271 nats/token, mean ± 1 std over 5 seeds)``."""
    std = 0.0 if math.isnan(r["nll_std"]) else float(r["nll_std"])
    seeds = int(r["n_seeds"]) if "n_seeds" in r and not math.isnan(float(r["n_seeds"])) else None
    over = f", mean ± 1 std over {seeds} seed{'s' if seeds != 1 else ''}" if seeds is not None else ""
    return f"the random band (ΔNLL {nats(float(r['delta_nll']))} ± {nats(std)} nats/token{over})"


def random_sentence(curves: pd.DataFrame, target: float) -> str | None:
    found = versus_random(curves, target)
    if found is None:
        return None
    r, beat, worse = found
    where = f"At {target:.0%} of heads pruned"
    if abs(float(r["fraction"]) - target) > FRACTION_TOL:
        where += f" (nearest point: {float(r['fraction']):.1%})"
    band = band_text(r)
    if beat:
        parts = [f"{m} {nats(delta)} ({nats(margin)} below random)" for m, delta, margin in beat]
        n = f"{len(beat)} scores beat" if len(beat) > 1 else "1 score beats"
        text = f"{where}, {n} {band}, with ΔNLL: {', '.join(parts)}"
    else:
        text = f"{where}, no score beats {band}"
    if worse:
        text += f"; {names(worse)} {'is' if len(worse) == 1 else 'are'} worse than random"
    return text + "."


def inverse_methods(pred: pd.DataFrame) -> pd.DataFrame:
    """The importance rows of ``predictiveness`` that rank heads inversely: the 95% interval of Spearman ρ below
    0 or of the ROC-AUC below 0.5 (point estimates where a table has no intervals)."""
    if pred.empty:
        return pred
    rows = pred[~pred["method"].isin(DESCRIPTIVE)]
    rho = rows["spearman_ci_hi"] if "spearman_ci_hi" in rows else rows["spearman_rho"]
    auc = rows["roc_auc_ci_hi"] if "roc_auc_ci_hi" in rows else rows["roc_auc_top10"]
    return rows[(rho < 0) | (auc < 0.5)]


def inverse_sentence(pred: pd.DataFrame) -> str | None:
    text = _inverse_sentence(pred)
    if text is None or "within_layer_ci_hi" not in pred:
        return text
    inverse = inverse_methods(pred)
    across = inverse[inverse["within_layer_ci_hi"] >= 0]
    if across.empty:
        return text
    them = list(across["method"])
    return (f"{text[:-1]}; within a layer, {names(them)} {'does' if len(them) == 1 else 'do'} not (within-layer ρ "
            f"{span(across['within_layer_rho'])}, {'its' if len(them) == 1 else 'every'} 95% interval reaching 0 "
            "or above): the inverse order is one of layers, not of heads within a layer.")


def _inverse_sentence(pred: pd.DataFrame) -> str | None:
    if pred.empty:
        return None
    inverse = inverse_methods(pred)
    if inverse.empty:
        return (f"No score ranks heads inversely to {TRUTH}: no 95% interval of Spearman ρ lies below 0 and none of "
                "the ROC-AUC below 0.5.")
    test = "95% interval of Spearman ρ below 0 or of the ROC-AUC for the top heads below 0.5"
    if len(inverse) <= INVERSE_DETAIL:
        parts = [f"{r.method} (ρ {r.spearman_rho:.2f}, ROC-AUC {r.roc_auc_top10:.2f})" for r in inverse.itertuples()]
        verb, them = ("ranks", "it") if len(parts) == 1 else ("rank", "them")
        return f"{names(parts)} {verb} heads inversely to {TRUTH} ({test}): pruning by {them} removes important " \
               "heads early."
    rho, auc = inverse["spearman_rho"], inverse["roc_auc_top10"]
    return (f"{names(list(inverse['method']))} rank heads inversely to {TRUTH} ({test}; here ρ {span(rho)}, "
            f"ROC-AUC {span(auc)}): pruning by them removes important heads early.")


def span(values) -> str:
    """The span of ``values`` (a sequence or Series; NaN skipped) at 2 decimals: ``lo to hi``, or one number
    where both read the same."""
    lo, hi = f"{float(np.nanmin(values)):.2f}", f"{float(np.nanmax(values)):.2f}"
    return lo if lo == hi else f"{lo} to {hi}"


COMPENSATION_WORDS = {"mean": "Mean compensation (the pruned heads' mean output folded into the bias)",
                      "optimal": "Optimal compensation (constants fitted to be optimal for ablating the pruned heads "
                                 "together, folded into the bias; Li & Janson 2024)"}


def compensation_sentences(curves: pd.DataFrame) -> list[str]:
    """Per compensated curve: its ΔNLL against the same method's uncompensated one at 30% and 50%."""
    out = []
    for comp, words in COMPENSATION_WORDS.items():
        for method in dict.fromkeys(curves.loc[curves["compensation"] == comp, "method"]):
            plain = curves[(curves["method"] == method) & (curves["compensation"] == "none")]
            fills = curves[(curves["method"] == method) & (curves["compensation"] == comp)]
            if plain.empty:
                continue
            parts = []
            for target in FINDING_FRACTIONS:
                a, b = float(_at(plain, target)["delta_nll"]), float(_at(fills, target)["delta_nll"])
                saves = a - b
                change = "no change" if nats(abs(saves)) == nats(0.0) else \
                    f"{'saves' if saves > 0 else 'costs'} {nats(abs(saves))}"
                parts.append(f"at {target:.0%} {nats(a)} → {nats(b)} nats/token ({change})")
            out.append(f"{words} changes {method}'s ΔNLL {' and '.join(parts)}.")
    return out


def findings(scores: pd.DataFrame, curves: pd.DataFrame, pred: pd.DataFrame, layers: pd.DataFrame | None = None
             ) -> list[str]:
    """The headline sentences, in order (validated tables; ``pred`` from :func:`predictiveness`; ``layers`` the
    checked layers table, where the run removed each layer's heads together: the layer sentence then says what that
    cost, else what the single ablations sum to)."""
    first = layer_finding(layers, scores) if layers is not None else layer_sentence(scores)
    sentences = [first, rank_sentence(scores), *(random_sentence(curves, t) for t in FINDING_FRACTIONS),
                 pick_break(curves), inverse_sentence(pred), *compensation_sentences(curves)]
    return [s for s in sentences if s]


def pick_break(curves: pd.DataFrame) -> str | None:
    """Where the ranking the run prunes by (:func:`.choice.choose`'s pick) breaks (:func:`.breaks.break_sentence`)."""
    try:
        return break_sentence(curves, choose(curves).pick)
    except HeadpruneError:  # no ranking to choose
        return None
