"""Each data score's bootstrap replicates over the scoring windows, saved beside a scores table
(``scores.replicates.safetensors``): {method: [B, H] float64}, row b every head's score on the b-th resample of the
windows, the same resample for every method (:func:`headprune.bootstrap.window_counts`); the file's metadata names
each column's (layer, head), and a read returns the columns in the order of the heads asked for. The report
resamples heads from them, so its rank statistics' intervals hold the data noise too. Torch-free."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from headprune.errors import HeadpruneError
from headprune.io.work.files import beside, write_bytes

REPLICATES = ".replicates.safetensors"


def replicates_path(table: str | os.PathLike) -> Path:
    """The replicates file beside ``table``: ``scores.parquet`` -> ``scores.replicates.safetensors``."""
    return beside(table, REPLICATES)


def row_heads(scores: pd.DataFrame) -> list[tuple[int, int]]:
    """(layer, head) of each row of a scores table, in row order: the replicates' columns."""
    return [(int(la), int(h)) for la, h in zip(scores["layer"], scores["head"], strict=True)]


def write_replicates(table: str | os.PathLike, replicates: Mapping[str, np.ndarray] | None,
                     heads: Sequence[tuple[int, int]]) -> None:
    """The replicates beside ``table`` (atomically), their columns the (layer, head) ``heads``; without any, a stale
    file of an earlier save is removed."""
    path = replicates_path(table)
    if not replicates:
        path.unlink(missing_ok=True)
        return
    arrays = {m: np.ascontiguousarray(v, dtype=np.float64) for m, v in replicates.items()}
    write_bytes(path, save(arrays, metadata={"heads": json.dumps([[int(la), int(h)] for la, h in heads])}))


def read_replicates(table: str | os.PathLike, heads: Sequence[tuple[int, int]]) -> dict[str, np.ndarray] | None:
    """The replicates saved beside ``table`` (None where there are none), each [B, len(heads)], column j the
    (layer, head) ``heads[j]``."""
    path = replicates_path(table)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="np") as f:
            saved = [tuple(h) for h in json.loads((f.metadata() or {}).get("heads", "[]"))]
            replicates = {m: f.get_tensor(m) for m in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    except (OSError, SafetensorError, ValueError) as err:
        raise HeadpruneError(f"cannot read {path} ({type(err).__name__}); remove it or score again") from None
    wanted = [(int(la), int(h)) for la, h in heads]
    bad = [m for m, v in replicates.items() if v.ndim != 2 or v.shape[1] != len(saved)]
    if bad or sorted(saved) != sorted(wanted) or len(set(saved)) != len(saved):
        raise HeadpruneError(f"{path} does not belong to its scores table: its replicates are not of the table's "
                             f"{len(wanted)} heads; remove it or score again")
    column = {h: j for j, h in enumerate(saved)}
    order = [column[h] for h in wanted]
    return {m: v[:, order] for m, v in replicates.items()}
