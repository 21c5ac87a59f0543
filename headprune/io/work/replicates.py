"""Each data score's bootstrap replicates over the scoring windows, saved beside a scores table
(``scores.replicates.safetensors``): {method: [B, H] float64}, row b every head's score (in the table's row order) on
the b-th resample of the windows, the same resample for every method (:func:`headprune.bootstrap.window_counts`).
The report resamples heads from them, so its rank statistics' intervals hold the data noise too. Torch-free."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, save

from headprune.errors import HeadpruneError
from headprune.io.work.files import write_bytes

REPLICATES = ".replicates.safetensors"


def replicates_path(table: str | os.PathLike) -> Path:
    """The replicates file beside ``table``: ``scores.parquet`` -> ``scores.replicates.safetensors``."""
    path = Path(table)
    return path.with_name(path.stem + REPLICATES)


def write_replicates(table: str | os.PathLike, replicates: Mapping[str, np.ndarray] | None) -> None:
    """The replicates beside ``table`` (atomically); without any, a stale file of an earlier save is removed."""
    path = replicates_path(table)
    if not replicates:
        path.unlink(missing_ok=True)
        return
    write_bytes(path, save({m: np.ascontiguousarray(v, dtype=np.float64) for m, v in replicates.items()}))


def read_replicates(table: str | os.PathLike, n_heads: int) -> dict[str, np.ndarray] | None:
    """The replicates saved beside ``table`` (None where there are none), each [B, ``n_heads``]."""
    path = replicates_path(table)
    if not path.is_file():
        return None
    try:
        replicates = load(path.read_bytes())
    except (OSError, SafetensorError) as err:
        raise HeadpruneError(f"cannot read {path} ({type(err).__name__}); remove it or score again") from None
    bad = [m for m, v in replicates.items() if v.ndim != 2 or v.shape[1] != n_heads]
    if bad:
        raise HeadpruneError(f"{path} does not belong to its scores table: the replicates of {', '.join(bad)} are "
                             f"not [replicates, {n_heads} heads]; remove it or score again")
    return replicates
