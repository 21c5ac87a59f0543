"""The tables headprune reads and writes, defined once (torch-free: ``headprune report`` imports only this).

Scores: one row per head, ``layer, head, head_id, model_fingerprint`` then one column per method in
:data:`METHODS` order. For every importance method a HIGHER score means MORE important; the descriptive
methods (:data:`DESCRIPTIVE`) describe a head and never choose heads to prune.

Curves: one row per (method, compensation, fraction), columns :data:`CURVE_COLUMNS`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .errors import HeadpruneError

DEFAULT_MODEL = "stdlib-gpt2-mini"  # the shipped zoo model (headprune/zoo)
#: The token budget of ``headprune run`` and of every analysis in analyses/ (per corpus split), so all committed
#: reports measure the same baseline.
DEFAULT_MAX_TOKENS = 8192

# ---------------------------------------------------------------- methods

WEIGHT_METHODS = ("wo_fro", "wo_spec", "ov_fro", "ov_spec")
ACTIVATION_METHODS = ("out_norm", "fluct", "entropy")
GRADIENT_METHODS = ("grad", "taylor")
ABLATION_METHODS = ("abl_zero", "abl_zero_folded", "abl_mean")
METHODS = WEIGHT_METHODS + ACTIVATION_METHODS + GRADIENT_METHODS + ABLATION_METHODS
DESCRIPTIVE = ("entropy",)  # not importances: never used to choose heads to prune
IMPORTANCE_METHODS = tuple(m for m in METHODS if m not in DESCRIPTIVE)
RANDOM = "random"  # the baseline ranking: needs no column
TRUTH = "abl_zero"  # what the cheap scores are judged against

FAMILIES = {"weights": WEIGHT_METHODS, "activations": ACTIVATION_METHODS, "gradients": GRADIENT_METHODS,
            "ablation": ABLATION_METHODS}
_FAMILY_PREFIXES = (("wo_", "weights"), ("ov_", "weights"), ("abl_", "ablation"))


def method_family(method: str) -> str:
    """weights (wo_*, ov_*), activations, gradients, ablation (abl_*), random, or other for an unknown name."""
    if method == RANDOM:
        return RANDOM
    for family, members in FAMILIES.items():
        if method in members:
            return family
    return next((family for prefix, family in _FAMILY_PREFIXES if method.startswith(prefix)), "other")


METHOD_LABELS = {
    "wo_fro": "Frobenius norm of the head's W_O block",
    "wo_spec": "spectral norm of the head's W_O block",
    "ov_fro": "Frobenius norm of the head's OV circuit",
    "ov_spec": "spectral norm of the head's OV circuit",
    "out_norm": "mean norm of the head's output z_i W_O^(i)",
    "fluct": "FLAP fluctuation: sum of Var(z_ij) times squared W_O row norms",
    "entropy": "mean attention entropy (nats; a description)",
    "grad": "mean |dL/dg| of the head gate (Michel et al.)",
    "taylor": "-dL/dg: first-order estimate of the NLL increase",
    "abl_zero": "NLL increase when zero-ablated (nats/token)",
    "abl_zero_folded": "NLL increase when zero-ablated after value-bias folding (nats/token)",
    "abl_mean": "NLL increase when mean-ablated (nats/token)",
}

#: The unit of each method's score (colorbar and axis labels).
METHOD_UNITS = {
    "wo_fro": "weight norm", "wo_spec": "weight norm", "ov_fro": "weight norm", "ov_spec": "weight norm",
    "out_norm": "residual-stream norm", "fluct": "residual-stream norm²", "entropy": "nats",
    "grad": "nats/token per unit gate", "taylor": "nats/token",
    "abl_zero": "ΔNLL, nats/token", "abl_zero_folded": "ΔNLL, nats/token", "abl_mean": "ΔNLL, nats/token",
}

# ---------------------------------------------------------------- columns

HEAD_COLUMNS = ("layer", "head")  # what selection needs
ID_COLUMNS = ("layer", "head", "head_id", "model_fingerprint")  # every scores file written by headprune
COMPENSATIONS = ("none", "mean")
CURVE_COLUMNS = ["method", "compensation", "fraction", "heads_pruned", "params", "nll", "ppl", "delta_nll",
                 "delta_ppl", "nll_std", "ppl_std", "n_seeds", "model_fingerprint"]
CURVE_NUMBERS = CURVE_COLUMNS[2:-1]
TEXT_COLUMNS = ("head_id", "model_fingerprint")  # kept as text when read from csv (a hex id may look numeric)
CURVE_INTS = ("heads_pruned", "params", "n_seeds")
DEFAULT_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(10))  # 0, 0.1, ..., 0.9


def parse_methods(spec: str | list[str]) -> list[str]:
    """``all`` or a comma-separated list of method names, in canonical order."""
    names = [m.strip() for m in (spec.split(",") if isinstance(spec, str) else spec) if m.strip()]
    if names == ["all"]:
        return list(METHODS)
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
    """The scoring-method columns of ``scores``, in the canonical order."""
    return [m for m in METHODS if m in scores.columns]


def method_key(method: str) -> tuple:
    """Sort order of methods: known methods in canonical order, then others by name, random last."""
    if method == RANDOM:
        return (2, "")
    return (0, f"{METHODS.index(method):02d}") if method in METHODS else (1, method)


# ---------------------------------------------------------------- validation


def _require_columns(df, required, what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise HeadpruneError(f"{what} must be a table (pandas DataFrame), got {type(df).__name__}")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise HeadpruneError(f"{what} table lacks column(s) {', '.join(missing)}; is it a headprune {what} table?")
    if df.empty:
        raise HeadpruneError(f"{what} table has no rows")


def _as_float(df: pd.DataFrame, column: str, what: str) -> pd.Series:
    try:
        return df[column].astype(float)
    except (TypeError, ValueError):
        raise HeadpruneError(f"{what} column {column} must hold numbers") from None


def _as_int(df: pd.DataFrame, column: str, what: str, minimum: int = 0) -> pd.Series:
    values = _as_float(df, column, what)
    if not (np.isfinite(values) & (values % 1 == 0) & (values >= minimum)).all():
        raise HeadpruneError(f"{what} column {column} must hold integers >= {minimum}")
    return values.astype("int64")


def check_scores(scores: pd.DataFrame, required: tuple[str, ...] = ID_COLUMNS, need_method: bool = True
                 ) -> pd.DataFrame:
    """A validated, typed copy of ``scores`` sorted by (layer, head); HeadpruneError on bad input.

    ``required``: the columns that must be there (selection needs only ``layer, head``); ``head_id`` and
    ``model_fingerprint`` are checked when present. ``need_method``: at least one method column.
    """
    _require_columns(scores, required, "scores")
    methods = method_columns(scores)
    if need_method and not methods:
        raise HeadpruneError(f"scores table has no method column; expected any of {', '.join(METHODS)}")
    df = scores.copy()
    for column in HEAD_COLUMNS:
        df[column] = _as_int(df, column, "scores")
    for column in ("head_id", "model_fingerprint"):
        if column in df.columns:
            df[column] = df[column].astype(str)
    for column in methods:
        df[column] = _as_float(df, column, "scores")
    expected = "L" + df["layer"].astype(str) + "H" + df["head"].astype(str)
    if "head_id" in df.columns and (bad := df["head_id"] != expected).any():
        raise HeadpruneError(f"scores head_id {df.loc[bad, 'head_id'].iloc[0]!r} does not match its layer and head")
    if (dup := df.duplicated(["layer", "head"])).any():
        raise HeadpruneError(f"scores table lists head {expected[dup].iloc[0]} more than once")
    if "model_fingerprint" in df.columns and (n := df["model_fingerprint"].nunique()) > 1:
        raise HeadpruneError(f"scores table mixes {n} models (model_fingerprint); use one model at a time")
    return df.sort_values(["layer", "head"], kind="stable").reset_index(drop=True)


def check_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """A validated, typed copy of ``curves`` sorted by (method, compensation, fraction)."""
    _require_columns(curves, CURVE_COLUMNS[:-1], "curves")  # model_fingerprint: absent in tables of before 0.13
    df = curves.copy()
    if "model_fingerprint" in df.columns:
        df["model_fingerprint"] = df["model_fingerprint"].astype(str)
        if (n := df["model_fingerprint"].nunique()) > 1:
            raise HeadpruneError(f"curves table mixes {n} models (model_fingerprint); use one model at a time")
    df["method"] = df["method"].astype(str)
    df["compensation"] = df["compensation"].astype(str)
    if bad := sorted(set(df["compensation"]) - set(COMPENSATIONS)):
        raise HeadpruneError(f"curves compensation {bad[0]!r} is not one of {', '.join(COMPENSATIONS)}")
    for column in CURVE_NUMBERS:
        df[column] = _as_int(df, column, "curves") if column in CURVE_INTS else _as_float(df, column, "curves")
    if not df["fraction"].between(0, 1).all():
        raise HeadpruneError("curves column fraction must lie in [0, 1]")
    if (dup := df.duplicated(["method", "compensation", "fraction"])).any():
        row = df[dup].iloc[0]
        where = f"{row.method}/{row.compensation} at fraction {row.fraction}"
        raise HeadpruneError(f"curves table has two rows for {where}")
    keys = df["method"].map(method_key)
    df = df.assign(_key=keys, _comp=df["compensation"].map(COMPENSATIONS.index))
    df = df.sort_values(["_key", "_comp", "fraction"], kind="stable").drop(columns=["_key", "_comp"])
    return df.reset_index(drop=True)
