"""Table cells as text, one precision per column: every float of a column with the same number of decimals.

A float column's decimals: ``SIGNIFICANT - 1 - floor(log10(m))`` for ``m`` the median magnitude of its finite
nonzero values, clipped to [0, :data:`MAX_DECIMALS`], so a typical cell shows :data:`SIGNIFICANT` significant
digits (perplexities 178.7 and 2,201.3; ΔNLL 0.0270; abl_zero 0.01618). A column of whole numbers shows none.
A value that rounds to zero at its column's precision prints as ``0`` (random's std at 0% pruned, 2.8e-14, is
zero up to float round-off); NaN prints as ``n/a``; magnitudes of 10,000 and more get thousands separators.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

SIGNIFICANT = 4
MAX_DECIMALS = 6


def column_decimals(values) -> int:
    """Decimals that show a typical value of the column with :data:`SIGNIFICANT` significant digits."""
    x = np.asarray(values, dtype=float)
    x = np.abs(x[np.isfinite(x) & (x != 0)])
    if not len(x) or np.all(x == np.round(x)):
        return 0
    return int(np.clip(SIGNIFICANT - 1 - math.floor(math.log10(float(np.median(x)))), 0, MAX_DECIMALS))


def fixed(value: float, decimals: int) -> str:
    """``value`` with ``decimals`` decimals; ``0`` where it rounds to zero; ``n/a`` for NaN."""
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return str(value)
    if round(value, decimals) == 0:
        return "0"
    return f"{value:,.{decimals}f}" if abs(value) >= 1e4 else f"{value:.{decimals}f}"


def _is_float_column(col: pd.Series) -> bool:
    return pd.api.types.is_float_dtype(col) and not pd.api.types.is_bool_dtype(col)


def cell_text(value) -> str:
    """A cell outside a float column: integers with separators, booleans and text as they are."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return f"{value:,}"
    if isinstance(value, (float, np.floating)):
        return fixed(float(value), column_decimals([value]))
    return str(value)


def format_table(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` as strings: float columns at one precision each (:func:`column_decimals`), other cells as
    :func:`cell_text`."""
    out = {}
    for name in df.columns:
        col = df[name]
        if _is_float_column(col):
            d = column_decimals(col.to_numpy(float))
            out[name] = [fixed(float(v), d) for v in col]
        else:
            out[name] = [cell_text(v) for v in col]
    return pd.DataFrame(out, columns=df.columns, index=df.index)


def names(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: the names a sentence lists."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
