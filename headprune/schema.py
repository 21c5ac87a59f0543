"""The tables headprune reads and writes, defined once (torch-free: ``headprune report`` imports only this).

Scores: one row per head, ``layer, head, head_id, model_fingerprint`` then one column per method in
:data:`ALL_METHODS` order (``score`` computes :data:`METHODS`; ``learn-gates`` trains :data:`LEARNED_METHODS`).
For every importance method a HIGHER score means MORE important; the descriptive methods (:data:`DESCRIPTIVE`)
describe a head and never choose heads to prune.

Curves: one row per (method, compensation, fraction), columns :data:`CURVE_COLUMNS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from headprune.errors import HeadpruneError

DEFAULT_MODEL = "stdlib-gpt2-mini"  # the shipped zoo model (headprune/zoo)
#: The token budget of ``headprune run`` and of every analysis in analyses/ (per corpus split), so all committed
#: reports measure the same baseline.
DEFAULT_MAX_TOKENS = 8192
#: Random subsets of the heads an approximation leaves unverified, patched together to bound what they hide.
DEFAULT_BOUND_SUBSETS = 64
# headprune verify (headprune.scoring.verified): the ablations it verifies, its subsets and their inclusion probability
VERIFIABLE, VERIFY_SUBSETS, VERIFY_INCLUSION = ("abl_zero", "abl_mean", "ctx_stream"), 32, 0.25
RANKABLE = ("abl_zero", "abl_mean")  # headprune rank's ablations (per query head)
VERIFY_ESTIMATES = {"ctx_stream": "ctx_gate"}  # the estimate verify computes for a method (others: taylor)
KV_SCORES = ("ctx_stream", "ctx_gate")  # one value per KV head, repeated on each of its query heads
VERIFY_ROUNDS = 2  # rounds of exact ablation: the estimate's top K, then the K the bound leaves most open
#: headprune rank (headprune.scoring.adaptive): the sets of K heads it certifies
ADAPTIVE_TARGETS = {"top": "the K heads with the largest |ΔNLL|",
                    "prune": "the K heads with the smallest ΔNLL (those a prune of K heads removes first)"}

# ---------------------------------------------------------------- methods


@dataclass(frozen=True)
class MethodSpec:
    """Everything about one score, in one place: the scorers, the cost model, the tables and the report read it
    (families, units, which methods rank, what they cost and how they are drawn derive from :data:`METHOD_TABLE`)."""

    name: str  # the scores column
    family: str  # weights, activations, gradients, ablation, resample (computed by ``score``) or learned (trained)
    unit: str  # of its score (colorbar and axis labels)
    label: str  # what it measures, in one line
    data_dependent: bool  # measured on data (a scored one gets bootstrap intervals); False: the weights alone
    opt_in: bool = False  # left out of "all" (name it to get it): costly, or a variant of another method
    descriptive: bool = False  # describes a head, never chooses heads to prune (higher is not more important)
    #: its cost, in forward passes over the scored tokens: ``shared_fe`` for the one pass its family shares (None:
    #: the method pays its own ablation sweeps), ``sweeps`` ablation sweeps of its own (each ≈ one forward per
    #: head from its layer up: :func:`headprune.cost.ablation_fe`)
    shared_fe: float | None = None
    sweeps: float = 0.0
    kv_sweep: bool = False  # its sweep reruns once per KV head (ctx_stream), not once per query head

    @property
    def cheap(self) -> bool:
        """A shared pass or the weights alone, no ablation sweep or training of its own: seconds, not minutes."""
        return self.shared_fe is not None

    @property
    def exact(self) -> bool:
        """Measures the loss change of removing the head itself (an ablation), not an estimate of it."""
        return self.family in ("ablation", "resample")

    @property
    def color(self) -> str:
        """Its family's colour in every figure (:data:`FAMILY_COLORS`)."""
        return FAMILY_COLORS[self.family]


# Okabe & Ito (2008), colour-blind safe: one hue per method family (line styles tell methods of a family apart).
# Learned gates share vermillion with names outside the method table; the random baseline is black.
FAMILY_COLORS = {"weights": "#E69F00", "activations": "#CC79A7", "gradients": "#009E73", "ablation": "#0072B2",
                 "resample": "#0072B2", "context": "#56B4E9", "learned": "#D55E00", "other": "#D55E00",
                 "random": "#000000"}

_WEIGHT_NORM, _DELTA_NLL = "weight norm", "ΔNLL, nats/token"

#: Every method, in canonical order (the order of the columns of a scores table).
METHOD_TABLE: tuple[MethodSpec, ...] = (
    MethodSpec("wo_fro", "weights", _WEIGHT_NORM, "Frobenius norm of the head's W_O block", False, shared_fe=0.0),
    MethodSpec("wo_spec", "weights", _WEIGHT_NORM, "spectral norm of the head's W_O block", False, shared_fe=0.0),
    MethodSpec("ov_fro", "weights", _WEIGHT_NORM, "Frobenius norm of the head's OV circuit", False, shared_fe=0.0),
    MethodSpec("ov_spec", "weights", _WEIGHT_NORM, "spectral norm of the head's OV circuit", False, shared_fe=0.0),
    MethodSpec("out_norm", "activations", "residual-stream norm", "mean norm of the head's output z_i W_O^(i)", True,
               shared_fe=1.0),
    MethodSpec("fluct", "activations", "residual-stream norm²",
               "FLAP fluctuation: sum of Var(z_ij) times squared W_O row norms", True, shared_fe=1.0),
    MethodSpec("entropy", "activations", "nats", "mean attention entropy (nats; a description)", True,
               descriptive=True, shared_fe=1.0),
    MethodSpec("grad", "gradients", "nats/token per unit gate", "mean |dL/dg| of the head gate (Michel et al.)", True,
               shared_fe=2.0),
    MethodSpec("taylor", "gradients", "nats/token", "-dL/dg: first-order estimate of the NLL increase", True,
               shared_fe=2.0),
    MethodSpec("abl_zero", "ablation", _DELTA_NLL, "NLL increase when zero-ablated (nats/token)", True, sweeps=1.0),
    MethodSpec("abl_zero_folded", "ablation", _DELTA_NLL,
               "NLL increase when zero-ablated after value-bias folding (nats/token)", True,
               opt_in=True, sweeps=1.0),  # abl_zero but for the value-bias share (equal without value biases)
    MethodSpec("abl_mean", "ablation", _DELTA_NLL, "NLL increase when mean-ablated (nats/token)", True, sweeps=1.0),
    MethodSpec("abl_opt", "ablation", _DELTA_NLL,
               "NLL increase when optimally ablated: z_i := the loss-minimising constant (Li & Janson; nats/token)",
               True, opt_in=True, sweeps=48.0),  # costly: fitting, ~3·16 ablation sweeps
    MethodSpec("abl_resample", "resample", _DELTA_NLL,
               "NLL increase when resample-ablated: z_i := its output on another window (nats/token)", True,
               opt_in=True, sweeps=1.0),  # costly: K ablation sweeps (default 4)
    # a head's need for the whole context (scoring/context.py): per KV head, streaming = first sink + last recent
    MethodSpec("ctx_stream", "context", _DELTA_NLL,
               "NLL increase when its KV head sees only sinks and a recent window (nats/token)", True,
               opt_in=True, sweeps=1.0, kv_sweep=True),  # a sweep per KV head: opt-in, like the other context scores
    MethodSpec("ctx_gate", "context", _DELTA_NLL,
               "-dL/dα of its KV head's full-vs-streaming gate (DuoAttention at α = 1; nats/token)", True,
               opt_in=True, shared_fe=2.0),
    MethodSpec("ctx_retrieval", "context", "share of copy events",
               "how often its top attention lands on the token the model copies from beyond the window", True,
               opt_in=True, shared_fe=1.0),
    # learned by training (headprune.pruning.gates, `learn-gates`), never by `score`: columns of their own tables
    MethodSpec("gate", "learned", "P(gate open)",
               "probability that the head's learned hard-concrete gate stays open (Voita et al.)", True),
)
METHOD_SPECS = {spec.name: spec for spec in METHOD_TABLE}
LEARNED = "learned"  # the family trained by headprune.pruning.gates rather than computed by `score`
assert {s.family for s in METHOD_TABLE} <= set(FAMILY_COLORS), "a family of METHOD_TABLE has no colour"
#: family -> its methods, in canonical order
METHOD_FAMILIES: dict[str, tuple[str, ...]] = {
    family: tuple(s.name for s in METHOD_TABLE if s.family == family) for family in dict.fromkeys(
        s.family for s in METHOD_TABLE)}

WEIGHT_METHODS = METHOD_FAMILIES["weights"]
ACTIVATION_METHODS = METHOD_FAMILIES["activations"]
GRADIENT_METHODS = METHOD_FAMILIES["gradients"]
ABLATION_METHODS = METHOD_FAMILIES["ablation"]
RESAMPLE_METHODS = METHOD_FAMILIES["resample"]  # resample ablation (scoring/resample.py)
CONTEXT_METHODS = METHOD_FAMILIES["context"]  # a head's need for the whole context (scoring/context.py)
LEARNED_METHODS = METHOD_FAMILIES[LEARNED]
METHODS = tuple(s.name for s in METHOD_TABLE if s.family != LEARNED)  # what `score` computes
ALL_METHODS = tuple(METHOD_SPECS)  # every method column a scores table may hold
DATA_METHODS = tuple(m for m in METHODS if METHOD_SPECS[m].data_dependent)  # measured on data: bootstrap intervals
OPT_IN = tuple(m for m in METHODS if METHOD_SPECS[m].opt_in)  # left out of "all"
RANKED = tuple(m for m in DATA_METHODS if METHOD_SPECS[m].exact)  # exact: each head's rank gets an interval
DESCRIPTIVE = tuple(m for m in ALL_METHODS if METHOD_SPECS[m].descriptive)  # never used to choose heads to prune
IMPORTANCE_METHODS = tuple(m for m in METHODS if m not in DESCRIPTIVE)  # the scored importances (`run` curves them)
RANKABLE_METHODS = IMPORTANCE_METHODS + LEARNED_METHODS  # what prune and curve may rank by (and random)
#: The unit of each method's score (colorbar and axis labels).
METHOD_UNITS = {s.name: s.unit for s in METHOD_TABLE}
RANDOM = "random"  # the baseline ranking: needs no column (drawn in FAMILY_COLORS["random"])
TRUTH = "abl_zero"  # what the cheap scores are judged against

_FAMILY_PREFIXES = (("wo_", "weights"), ("ov_", "weights"), ("abl_", "ablation"))


LAYER_NORMALIZED = "@layer"  # a ranking suffix: the method's scores divided by their layer's norm


def split_ranking(ranking: str) -> tuple[str, bool]:
    """``"wo_fro@layer"`` -> ``("wo_fro", True)``; ``"wo_fro"`` -> ``("wo_fro", False)``."""
    if ranking.endswith(LAYER_NORMALIZED):
        return ranking[: -len(LAYER_NORMALIZED)], True
    return ranking, False


def is_cheap(method: str) -> bool:
    """Whether ``method`` (or its ``@layer`` ranking) is in :data:`METHOD_TABLE` and :attr:`MethodSpec.cheap`."""
    spec = METHOD_SPECS.get(split_ranking(method)[0])
    return spec is not None and spec.cheap


def method_family(method: str) -> str:
    """The family of a method in :data:`METHOD_TABLE`; for other names: random, weights (wo_*, ov_*), ablation
    (abl_*), else other. A layer-normalized ranking (``<method>@layer``) belongs to its method's family."""
    method = split_ranking(method)[0]
    if method in METHOD_SPECS:
        return METHOD_SPECS[method].family
    if method == RANDOM:
        return RANDOM
    return next((family for prefix, family in _FAMILY_PREFIXES if method.startswith(prefix)), "other")


# ---------------------------------------------------------------- columns

HEAD_COLUMNS = ("layer", "head")  # what selection needs
ID_COLUMNS = ("layer", "head", "head_id", "model_fingerprint")  # every scores file written by headprune
COMPENSATIONS = ("none", "mean", "optimal")
CURVE_INTERVAL = ["delta_nll_ci_lo", "delta_nll_ci_hi"]  # 95% paired bootstrap over windows (optional)
# ΔNLL over the even and the odd evaluation windows alone (optional): a ranking is chosen on one half and measured on
# the other (headprune.report.choice)
CURVE_HALVES = ["delta_nll_even", "delta_nll_odd"]
CURVE_OPTIONAL = [*CURVE_INTERVAL, *CURVE_HALVES]  # check_curves: a missing interval NaN, missing halves absent
CURVE_COLUMNS = ["method", "compensation", "fraction", "heads_pruned", "params", "nll", "ppl", "delta_nll",
                 "delta_ppl", "nll_std", "ppl_std", "n_seeds", *CURVE_OPTIONAL, "model_fingerprint"]
CURVE_REQUIRED = [c for c in CURVE_COLUMNS if c not in CURVE_OPTIONAL and c != "model_fingerprint"]
CURVE_NUMBERS = CURVE_COLUMNS[2:-1]
#: Optional curves column (``curve --recover STEPS``): 0 for a pruned point as measured, STEPS for the same point after
#: STEPS fine-tuning steps (headprune.pruning.finetune); a table without it holds only unrecovered points.
RECOVER_COLUMN = "recover_steps"


def gap_recovered(unpruned_ppl: float, pruned_ppl: float, recovered_ppl: float) -> float:
    """The share of the perplexity gap recovered, (P_p − P_r) / (P_p − P₀); NaN where pruning cost nothing (no gap)."""
    gap = pruned_ppl - unpruned_ppl
    return (pruned_ppl - recovered_ppl) / gap if gap > 0 else math.nan
FILL_COLUMN = "fill_data"  # optional curves column: the data compensated rows' fills came from ("" for none)
# kept as text when read from csv (a hex id may look numeric)
TEXT_COLUMNS = ("head_id", "model_fingerprint", FILL_COLUMN, "scores_digest")
CURVE_INTS = ("heads_pruned", "params", "n_seeds")
#: Each layer's heads removed together (headprune.scoring.layers; run's layers.csv, one row per split and layer):
#: ΔNLL and its share of the layers' total, each with its 95% interval over resampled windows
LAYER_SCORE = "abl_layer"
LAYER_COLUMNS = ("split", "layer", "n_heads", LAYER_SCORE, f"{LAYER_SCORE}_ci_lo", f"{LAYER_SCORE}_ci_hi", "share",
                 "share_ci_lo", "share_ci_hi", "windows", "tokens")
LAYER_INTS = ("layer", "n_heads", "windows", "tokens")
LAYER_SPLITS = ("validation", "test")  # the layer is chosen on the first and reported on the second
# The fractions and random-baseline seeds of every curve (`run` and `curve`): 0, 0.1, ..., 0.8 (0.9 left out: with
# 16 rankings and 10 random seeds it adds 26 evaluations to the whole job; `--fractions 0,0.1,...,0.9` adds it back).
# `run` then locates its pick's break between grid points (report.breaks). 10 random seeds: 80 of the about 200
# distinct pruned models a default run evaluates, for a band whose spread is itself measured on 10 draws.
DEFAULT_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(9))
DEFAULT_SEEDS = 10


def parse_methods(spec: str | Sequence[str]) -> list[str]:
    """The method names of a user's spec, in canonical order: ``all`` (every method but the :data:`OPT_IN` ones)
    or comma-separated method names (``all`` may be one of them); a sequence of such specs is their union."""
    names = [m.strip() for part in ([spec] if isinstance(spec, str) else spec) for m in part.split(",") if m.strip()]
    if "all" in names:
        names = [m for m in names if m != "all"] + [m for m in METHODS if m not in OPT_IN]
    return check_methods(names)


def check_methods(names: Sequence[str]) -> list[str]:
    """``names`` (scored methods, none unknown, at least one) in canonical order; HeadpruneError otherwise."""
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise HeadpruneError(f"unknown scoring method(s) {', '.join(unknown) or '(none)'}; choose from all, "
                             f"{', '.join(METHODS)}")
    return [m for m in METHODS if m in names]


def parse_fractions(spec: str) -> list[float]:
    """``"0,0.1,0.5"`` -> sorted unique fractions, each in [0, 1]."""
    try:
        fractions = sorted({float(f) for f in spec.split(",") if f.strip()})
    except ValueError:
        raise HeadpruneError(f"fractions {spec!r} must be comma-separated numbers in [0, 1], e.g. 0,0.1,0.5",
                             "fractions") from None
    if not fractions or not all(0.0 <= f <= 1.0 for f in fractions):
        raise HeadpruneError(f"fractions {spec!r}: every fraction must lie in [0, 1]", "fractions")
    return fractions


def method_columns(scores: pd.DataFrame) -> list[str]:
    """The method columns of ``scores`` (scored and learned), in the canonical order."""
    return [m for m in ALL_METHODS if m in scores.columns]


def ci_columns(method: str) -> tuple[str, str]:
    """The 95% bootstrap interval columns of a data method's score: ``<method>_ci_lo``, ``<method>_ci_hi``."""
    return f"{method}_ci_lo", f"{method}_ci_hi"


def rank_columns(method: str) -> tuple[str, str]:
    """The 95% interval of a head's rank (1 = largest) by an exact method: ``<method>_rank_lo``, ``_rank_hi``."""
    return f"{method}_rank_lo", f"{method}_rank_hi"


def score_columns(methods=METHODS) -> list[str]:
    """The columns of a scores table of ``methods``: id columns, the methods, each data method's interval, then
    each exact method's rank interval."""
    methods = [m for m in METHODS if m in methods]
    return [*ID_COLUMNS, *methods, *(c for m in methods if m in DATA_METHODS for c in ci_columns(m)),
            *(c for m in methods if m in RANKED for c in rank_columns(m))]


def method_key(method: str) -> tuple:
    """Sort order of methods: known methods in canonical order, then others by name, random last."""
    if method == RANDOM:
        return (2, "")
    name, by_layer = split_ranking(method)
    return (0, f"{ALL_METHODS.index(name):02d}{'n' if by_layer else ''}") if name in ALL_METHODS else (1, method)


#: The curves column naming the scores table the curves were ranked by (:func:`scores_digest`).
SCORES_DIGEST = "scores_digest"
