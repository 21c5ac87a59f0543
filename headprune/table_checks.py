"""Scores, curves and layers tables checked on the way in (one clear HeadpruneError per defect) and typed, and the
digest that ties curves to the scores table that ranked them. The columns themselves are :mod:`headprune.schema`'s."""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprune.errors import HeadpruneError
from headprune.schema import (
    ALL_METHODS,
    COMPENSATIONS,
    CURVE_COLUMNS,
    CURVE_INTERVAL,
    CURVE_INTS,
    CURVE_NUMBERS,
    CURVE_REQUIRED,
    FILL_COLUMN,
    HEAD_COLUMNS,
    ID_COLUMNS,
    LAYER_COLUMNS,
    LAYER_INTS,
    LAYER_SCORE,
    LAYER_SPLITS,
    RECOVER_COLUMN,
    method_columns,
    method_key,
)


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
        raise HeadpruneError(f"scores table has no method column; expected any of {', '.join(ALL_METHODS)}")
    df = scores.copy()
    for column in HEAD_COLUMNS:
        df[column] = _as_int(df, column, "scores")
    for column in ("head_id", "model_fingerprint"):
        if column in df.columns:
            df[column] = df[column].astype(str)
    for column in methods:
        df[column] = _as_float(df, column, "scores")
        if not (finite := np.isfinite(df[column])).all():
            bad = df.loc[~finite].iloc[0]
            raise HeadpruneError(f"scores column {column} holds {df[column][~finite].iloc[0]} for L{bad['layer']}H"
                                 f"{bad['head']}: a score must be a finite number; recompute the scores")
    expected = "L" + df["layer"].astype(str) + "H" + df["head"].astype(str)
    if "head_id" in df.columns and (bad := df["head_id"] != expected).any():
        raise HeadpruneError(f"scores head_id {df.loc[bad, 'head_id'].iloc[0]!r} does not match its layer and head")
    if (dup := df.duplicated(["layer", "head"])).any():
        raise HeadpruneError(f"scores table lists head {expected[dup].iloc[0]} more than once")
    if "model_fingerprint" in df.columns and (n := df["model_fingerprint"].nunique()) > 1:
        raise HeadpruneError(f"scores table mixes {n} models (model_fingerprint); use one model at a time")
    return df.sort_values(["layer", "head"], kind="stable").reset_index(drop=True)


def check_layers(layers: pd.DataFrame, scores: pd.DataFrame | None = None) -> pd.DataFrame:
    """A validated, typed copy of a layers table (:data:`~headprune.schema.LAYER_COLUMNS`), sorted by split (as
    :data:`~headprune.schema.LAYER_SPLITS`) and layer: both splits over the same layers, whole non-negative counts,
    each ΔNLL finite, the intervals and shares numbers or empty; with ``scores``, each layer's head count that of the
    scores table. HeadpruneError otherwise."""
    _require_columns(layers, LAYER_COLUMNS, "layers")
    df = layers[list(LAYER_COLUMNS)].copy()
    for column in LAYER_COLUMNS[1:]:
        df[column] = _as_int(df, column, "layers") if column in LAYER_INTS else _as_float(df, column, "layers")
    if not np.isfinite(df[LAYER_SCORE].to_numpy()).all():
        raise HeadpruneError(f"layers column {LAYER_SCORE} must hold finite numbers")
    chosen, reported = LAYER_SPLITS
    splits = {s: set(df.loc[df["split"] == s, "layer"]) for s in LAYER_SPLITS}
    if not splits[chosen] or splits[chosen] != splits[reported] or len(df) != 2 * len(splits[chosen]):
        raise HeadpruneError(f"layers table must hold each layer once on the {chosen} and once on the {reported} "
                             "split")
    if scores is not None:
        heads = scores.groupby("layer").size()
        theirs = df.drop_duplicates("layer").set_index("layer")["n_heads"]
        if not theirs.sort_index().equals(heads.reindex(theirs.index).fillna(-1).astype(int).sort_index()):
            raise HeadpruneError("layers table does not match the scores: its layers or head counts differ; measure "
                                 "it again for this run (headprune layers)")
    order = df["split"].map({s: i for i, s in enumerate(LAYER_SPLITS)})
    return df.assign(_order=order).sort_values(["_order", "layer"], kind="stable").drop(columns="_order") \
        .reset_index(drop=True)


def check_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """A validated, typed copy of ``curves`` sorted by (method, compensation, fraction)."""
    _require_columns(curves, CURVE_REQUIRED, "curves")  # model_fingerprint: absent in tables of before 0.13
    df = curves.copy()
    for column in CURVE_INTERVAL:  # the halves stay absent where a table lacks them (headprune.report.choice)
        if column not in df.columns:
            df[column] = np.nan
    if "model_fingerprint" in df.columns:
        df["model_fingerprint"] = df["model_fingerprint"].astype(str)
        if (n := df["model_fingerprint"].nunique()) > 1:
            raise HeadpruneError(f"curves table mixes {n} models (model_fingerprint); use one model at a time")
    df["method"] = df["method"].astype(str)
    df["compensation"] = df["compensation"].astype(str)
    if FILL_COLUMN in df.columns:
        df[FILL_COLUMN] = df[FILL_COLUMN].fillna("").astype(str)
    if bad := sorted(set(df["compensation"]) - set(COMPENSATIONS)):
        raise HeadpruneError(f"curves compensation {bad[0]!r} is not one of {', '.join(COMPENSATIONS)}")
    for column in (c for c in CURVE_NUMBERS if c in df.columns):
        df[column] = _as_int(df, column, "curves") if column in CURVE_INTS else _as_float(df, column, "curves")
    if not df["fraction"].between(0, 1).all():
        raise HeadpruneError("curves column fraction must lie in [0, 1]")
    recover = [RECOVER_COLUMN] if RECOVER_COLUMN in df.columns else []
    if recover:
        df[RECOVER_COLUMN] = _as_int(df, RECOVER_COLUMN, "curves")
    if (dup := df.duplicated(["method", "compensation", "fraction", *recover])).any():
        row = df[dup].iloc[0]
        where = f"{row.method}/{row.compensation} at fraction {row.fraction}"
        raise HeadpruneError(f"curves table has two rows for {where}")
    keys = df["method"].map(method_key)
    df = df.assign(_key=keys, _comp=df["compensation"].map(COMPENSATIONS.index))
    df = df.sort_values([*recover, "_key", "_comp", "fraction"], kind="stable").drop(columns=["_key", "_comp"])
    order = [c for c in CURVE_COLUMNS if c in df.columns] + [c for c in df.columns if c not in CURVE_COLUMNS]
    return df[order].reset_index(drop=True)


def scores_digest(scores) -> str:
    """A short hash of a scores table's content: every head's (layer, head) and its value in every method column,
    printed to 9 significant digits (so a csv or parquet copy of the same table has the same digest). Curves
    record the digest of the table that ranked them; ``report`` refuses scores of another run."""
    import hashlib

    df = check_scores(scores, HEAD_COLUMNS, need_method=False)
    methods = method_columns(df)
    h = hashlib.sha256(",".join(methods).encode())
    for row in df[["layer", "head", *methods]].itertuples(index=False):
        h.update((",".join(f"{v:.9g}" if isinstance(v, float) else str(v) for v in row) + "\n").encode())
    return h.hexdigest()[:16]
