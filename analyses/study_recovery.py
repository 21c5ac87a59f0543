"""Distillation against its controls: the run's best ranking's prunes, a random prune of as many query heads, and the
unpruned model, each trained the same way (KL from the unpruned model, α = 1, T = 1) with several seeds, and measured
on the test split of the corpus it trained on and on a corpus it never saw.

One row per arm, fraction, seed and evaluation corpus: perplexity unpruned P₀ → pruned P_p → distilled P_d, the
share of the gap won back g = (P_p − P_d) / (P_p − P₀), and the distilled NLL's standard error over evaluation
windows ``nll_distilled_se``. A seed sets the training batches and, for the random arm, the heads drawn.

Intervals (:func:`summarise`) hold both noises. For an arm, over its n seeds, the mean distilled NLL
m ± √(t²·s²/n + z²·se²): s the seeds' spread with t the 97.5% Student quantile at n − 1 degrees of freedom, se the
mean window standard error with z the normal one (every seed is measured on the same windows, so that noise does not
shrink with seeds). Two arms: d = m_a − m_b ± √(t²·(s_a²/n_a + s_b²/n_b) + z²·(se_a² + se_b²)), t at
min(n_a, n_b) − 1. The rows keep each model's NLL and its window standard error, not the per-window sums, so the
window noise of a difference (and of the pruned → distilled change) is counted unpaired: conservative, since both
sides are measured on the same windows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from headprune.schema import gap_recovered

RECOVER_FRACTIONS = (0.3, 0.5)
RECOVER_SEEDS = 3
BATCH = 4  # windows of the run's length per training step
RANKING, RANDOM, UNPRUNED = "ranking", "random", "unpruned"
MOST = 0.5  # "most of the gap"


@dataclass(frozen=True)
class Arm:
    """One training run: which prune (``kind``), at which fraction, with which seed, and the heads it removes."""

    kind: str  # RANKING, RANDOM or UNPRUNED
    fraction: float
    seed: int
    heads: tuple[tuple[int, int], ...]

    @property
    def unit(self) -> str:
        return f"distill:{self.kind}:{self.fraction}:{self.seed}"


def held_out_corpus(trained_on: str) -> str:
    """The built-in corpus distillation never trains on: the other one of ``default`` (documentation) and ``code``."""
    return "code" if trained_on == "default" else "default"


def arms(scores: pd.DataFrame, best: str, seed: int, seeds: int = RECOVER_SEEDS,
         fractions=RECOVER_FRACTIONS) -> list[Arm]:
    """At each fraction, ``best``'s prune (per layer for an ``@layer`` ranking) and a random draw of as many query
    heads, each with ``seeds`` training seeds ``seed``, ``seed + 1``, …; then the unpruned model with those seeds."""
    from analyses.study_units import random_sets
    from headprune.pruning.options import Selection
    from headprune.pruning.selection import select_heads
    from headprune.schema import split_ranking

    name, by_layer = split_ranking(best)
    selection = Selection(seed=seed).by_layer() if by_layer else Selection(seed=seed)
    every = sorted(zip(scores["layer"].astype(int), scores["head"].astype(int)))
    out = []
    for f in fractions:
        chosen = tuple(select_heads(scores, name, fraction=f, selection=selection))
        drawn = random_sets(every, len(chosen), seeds, seed)
        for k in range(seeds):
            out.append(Arm(RANKING, f, seed + k, chosen))
            out.append(Arm(RANDOM, f, seed + k, tuple(sorted(drawn[k]))))
    return out + [Arm(UNPRUNED, 0.0, seed + k, ()) for k in range(seeds)]


def distill_arm(model, arm: Arm, train_ids, evals: dict, windowing, steps: int, checkpoint=None) -> list[dict]:
    """Train ``arm``'s prune of ``model`` ``steps`` steps (batches of :data:`BATCH` windows of the run's length, KL from
    ``model``) on ``train_ids``; its perplexity before and after on each of ``evals`` ({corpus: test ids})."""
    from headprune.perplexity import evaluate
    from headprune.pruning.finetune import Recipe, finetune
    from headprune.pruning.prune import prune_model

    student = prune_model(model, list(arm.heads))
    before = {name: evaluate(student, ids, windowing, progress=False) for name, ids in evals.items()}
    t0 = time.perf_counter()
    finetune(student, train_ids, Recipe(steps=steps, batch_size=BATCH, seq_len=windowing.seq_len, seed=arm.seed,
                                        distill_weight=1.0, temperature=1.0, checkpoint_every=25),
             teacher=model, checkpoint=checkpoint, show_progress=True)
    seconds = time.perf_counter() - t0
    out = []
    for name, ids in evals.items():
        after = evaluate(student, ids, windowing, progress=False)
        out.append({"measured_on": name, "heads_pruned": len(arm.heads), "nll_pruned": before[name].nll,
                    "nll_distilled": after.nll, "nll_distilled_se": after.nll_se, "seconds": seconds})
    return out


def recovery_table(model, best: str, arms_: list[Arm], evals: dict, windowing, steps: int,
                   run_arm: Callable[[Arm], list[dict]]) -> pd.DataFrame:
    """Every arm's rows (``run_arm``: :func:`distill_arm`, through the study's progress file) beside the unpruned
    model's NLL on each evaluation corpus; ``method`` names the ranking (``best``) an arm prunes by."""
    from headprune.perplexity import evaluate

    base = {name: evaluate(model, ids, windowing, progress=False).nll for name, ids in evals.items()}
    rows = []
    for arm in arms_:
        for r in run_arm(arm):
            rows.append({"arm": arm.kind, "method": {RANKING: best, RANDOM: "random"}.get(arm.kind, "none"),
                         "fraction": arm.fraction, "seed": arm.seed, **r, "steps": steps,
                         "train_tokens": steps * BATCH * windowing.seq_len, "nll_unpruned": base[r["measured_on"]]})
    t = pd.DataFrame(rows)
    for c in ("unpruned", "pruned", "distilled"):
        t[f"ppl_{c}"] = np.exp(t[f"nll_{c}"])
    ppl = t[["ppl_unpruned", "ppl_pruned", "ppl_distilled"]].to_numpy()
    return t.assign(gap_recovered=[gap_recovered(*v) for v in ppl])


def controlled(rec: pd.DataFrame) -> bool:
    """Whether ``rec`` is this module's table (arms and seeds) rather than the earlier one seed, no control table."""
    return "arm" in rec.columns


def distilled_points(rec: pd.DataFrame) -> pd.DataFrame:
    """For the figure: each pruned arm's distilled ΔNLL (mean over seeds) on the training corpus, by fraction; an
    earlier table's single rows as the ranking's."""
    if not controlled(rec):
        rec = rec.assign(arm=RANKING, measured_on="", nll_distilled=np.log(rec["ppl_distilled"]),
                         nll_unpruned=np.log(rec["ppl_unpruned"]))
    rows = rec[(rec["measured_on"] == rec["measured_on"].iloc[0]) & (rec["arm"] != UNPRUNED)]
    return (rows.assign(delta_nll=rows["nll_distilled"] - rows["nll_unpruned"])
            .groupby(["arm", "fraction"], as_index=False)[["heads_pruned", "delta_nll", "steps"]].mean())


# --- summaries: each arm over its seeds, with both noises ----------------------------------------------------------

Z = float(stats.norm.ppf(0.975))


def _t(n: int) -> float:
    """The 97.5% quantile for a mean over n seeds: Student's t with n − 1 degrees of freedom (0 for n = 1, where the
    seeds' spread is unknown and only the window noise is counted)."""
    return float(stats.t.ppf(0.975, n - 1)) if n > 1 else 0.0


def half_width(n: int, seed_var: float, window_var: float) -> float:
    """√((t_{n−1})² s²/n + z² se²): the seeds' part with Student's t, the windows' with the normal quantile."""
    return math.sqrt(_t(n) ** 2 * seed_var + Z**2 * window_var)


@dataclass(frozen=True)
class ArmSummary:
    """One arm at one fraction on one corpus, over its seeds."""

    n: int  # seeds
    heads: int
    ppl_unpruned: float
    ppl_pruned: float  # exp of the seeds' mean pruned NLL (one value for the ranking's prune)
    nll: float  # mean distilled NLL
    seed_var: float  # s²/n: the seeds' part of the variance of ``nll``
    window_var: float  # se²: the evaluation windows' part
    seeds_lo: float  # the lowest and highest seed's distilled perplexity
    seeds_hi: float

    @property
    def half(self) -> float:
        return half_width(self.n, self.seed_var, self.window_var)

    @property
    def ppl(self) -> tuple[float, float, float]:
        return math.exp(self.nll), math.exp(self.nll - self.half), math.exp(self.nll + self.half)

    @property
    def gap(self) -> tuple[float, float, float]:
        """The share of the gap won back at the mean, and at the interval's ends (a lower perplexity wins more)."""
        p, lo, hi = self.ppl
        return tuple(gap_recovered(self.ppl_unpruned, self.ppl_pruned, x) for x in (p, hi, lo))  # type: ignore[return-value]


def summarise(rec: pd.DataFrame, kind: str, fraction: float, measured_on: str) -> ArmSummary | None:
    """``kind``'s rows at ``fraction`` on ``measured_on``, over seeds; None where there are none."""
    rows = rec[(rec["arm"] == kind) & np.isclose(rec["fraction"], fraction) & (rec["measured_on"] == measured_on)]
    if rows.empty:
        return None
    n = len(rows)
    spread = float(rows["nll_distilled"].var(ddof=1)) / n if n > 1 else 0.0
    se = float(rows["nll_distilled_se"].fillna(0.0).mean())
    return ArmSummary(n, int(rows["heads_pruned"].iloc[0]), math.exp(float(rows["nll_unpruned"].iloc[0])),
                      math.exp(float(rows["nll_pruned"].mean())), float(rows["nll_distilled"].mean()),
                      spread, se**2, float(rows["ppl_distilled"].min()), float(rows["ppl_distilled"].max()))


def arms_at(rec: pd.DataFrame, fraction: float, corpus: str) -> tuple[ArmSummary, ArmSummary]:
    """The ranking's arm and the random arm at ``fraction`` on ``corpus``."""
    mine, rand = (summarise(rec, k, fraction, corpus) for k in (RANKING, RANDOM))
    if mine is None or rand is None:
        raise ValueError(f"study_recovery.csv lacks the ranking's or the random arm at {fraction} on {corpus}")
    return mine, rand


def ranking_fractions(rec: pd.DataFrame) -> list[float]:
    return sorted(set(rec.loc[rec["arm"] == RANKING, "fraction"]))


def difference(a: ArmSummary, b: ArmSummary) -> tuple[float, float, float]:
    """m_a − m_b in nats/token with its 95% interval (min(n_a, n_b) − 1 degrees of freedom)."""
    d = a.nll - b.nll
    half = half_width(min(a.n, b.n), a.seed_var + b.seed_var, a.window_var + b.window_var)
    return d, d - half, d + half


def verdict(a: ArmSummary, b: ArmSummary) -> str:
    """How ``a``'s distilled perplexity stands against ``b``'s: from the interval of their difference."""
    _, lo, hi = difference(a, b)
    return "ends below" if hi < 0 else "ends above" if lo > 0 else "is not told apart from"


def wins_most(s: ArmSummary) -> str:
    """Whether ``s`` wins back more than half its gap: "yes" where the interval's worst end does, "no" where its
    best end does not, else "open"."""
    _, lo, hi = s.gap
    return "yes" if lo > MOST else "no" if hi < MOST else "open"


# --- sentences ------------------------------------------------------------------------------------------------------

def _ppl(s: ArmSummary) -> str:
    p, lo, hi = s.ppl
    return f"{p:.2f} [{lo:.2f}, {hi:.2f}]"


def gap_text(s: ArmSummary) -> str:
    g, lo, hi = s.gap
    return f"{g:.0%} [{lo:.0%}, {hi:.0%}]" if math.isfinite(g) else "no gap"


def difference_text(a: ArmSummary, b: ArmSummary) -> str:
    return "{:+.3f} [{:+.3f}, {:+.3f}]".format(*difference(a, b))


def _gap(s: ArmSummary) -> str:
    return f"{gap_text(s)} of the gap won back" if math.isfinite(s.gap[0]) else "no gap to win back"


def corpora(rec: pd.DataFrame) -> list[str]:
    """The evaluation corpora in the table's order: the training corpus first."""
    return list(dict.fromkeys(rec["measured_on"]))


def _where(rec: pd.DataFrame, corpus: str) -> str:
    trained = corpora(rec)[0]
    return (f"the {corpus} corpus' test split (other text of the corpus it trained on)" if corpus == trained
            else f"the {corpus} corpus' test split (a corpus it never trained on)")


def ranking_of(rec: pd.DataFrame) -> str:
    return str(rec.loc[rec["arm"] == RANKING, "method"].iloc[0])


def recovery_sentences(rec: pd.DataFrame) -> list[str]:
    """The header, one sentence per fraction and evaluation corpus (the ranking's prune against the random prune),
    and the unpruned model's."""
    r0, best = rec.iloc[0], ranking_of(rec)
    n = rec.loc[rec["arm"] == RANKING, "seed"].nunique()
    out = [(f"Distillation from the unpruned model ({int(r0.steps)} steps, {int(r0.train_tokens):,} training tokens "
            f"of the {corpora(rec)[0]} corpus' train split, {n} seeds each), against a random prune of as many query "
            "heads and the unpruned model trained the same way; perplexity [95% interval over seeds and evaluation "
            "windows]:")]
    for f in ranking_fractions(rec):
        for corpus in corpora(rec):
            mine, rand = arms_at(rec, f, corpus)
            out.append(f"At {f:.0%} ({mine.heads} heads), on {_where(rec, corpus)}: {best}'s prune "
                       f"{mine.ppl_pruned:.2f} → {_ppl(mine)} ({_gap(mine)}; seeds {mine.seeds_lo:.2f}–"
                       f"{mine.seeds_hi:.2f}); random prunes {rand.ppl_pruned:.2f} → {_ppl(rand)} ({_gap(rand)}; "
                       f"seeds {rand.seeds_lo:.2f}–{rand.seeds_hi:.2f}). Distilled, {best}'s prune "
                       f"{verdict(mine, rand)} the random prunes' (ΔNLL {difference_text(mine, rand)} nats/token).")
    plain = {c: s for c in corpora(rec) if (s := summarise(rec, UNPRUNED, 0.0, c)) is not None}
    if plain:
        out.append("The unpruned model trained the same way (its own teacher: the KL starts at 0): "
                   + "; ".join(f"{s.ppl_unpruned:.2f} → {_ppl(s)} on the {c} corpus" for c, s in plain.items()) + ".")
    return out
