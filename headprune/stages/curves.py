"""The curves stage: every ranking's pruning curve on the test split, the best ranking chosen held out, its break
located between the grid's points, that ranking again with its heads' fills (mean, and optimal where asked); its
result saved and loaded as one folder.

A saved :class:`CurveResult` is ``curves.parquet`` and ``curves.csv`` (one row per ranking, compensation and
fraction: :data:`~headprune.schema.CURVE_COLUMNS`) and ``baseline.json`` (the unpruned model on the same tokens:
tokens, nll, ppl, bytes), the files a run's report folder holds; the choice is a function of the table
(:func:`~headprune.report.choice.choose`), so it is recomputed on loading, never stored beside it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.io.work.files import read_table, write_json, write_table
from headprune.io.work.progress import Progress
from headprune.perplexity import scored_bytes
from headprune.pruning.curves import pruning_curves
from headprune.pruning.gates import GATE
from headprune.pruning.options import CurveOptions, Selection
from headprune.pruning.selection import ranking_heads
from headprune.report.breaks import next_fraction
from headprune.report.choice import Choice, choose
from headprune.report.tables import baseline_from_curves, check_baseline
from headprune.scoring import HeadScores
from headprune.stages.compensation import compensation_stage
from headprune.stages.inputs import RunInputs
from headprune.stages.settings import RunSettings, split_text
from headprune.table_checks import check_curves

TABLE, BASELINE = "curves", "baseline.json"


@dataclass(frozen=True)
class CurveResult:
    """``table``: the curves; ``baseline``: the unpruned model on their tokens; ``choice``: the ranking the run
    prunes by, chosen on the even test windows and checked by the odd ones; ``seconds_compensated``: the
    compensated curves' share of the stage's time (0 where not measured here)."""

    table: pd.DataFrame
    baseline: dict
    choice: Choice
    seconds_compensated: float = 0.0

    def save(self, folder: str | os.PathLike) -> Path:
        """``curves.parquet``, ``curves.csv`` and ``baseline.json`` into ``folder`` (each atomically)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for suffix in (".parquet", ".csv"):
            write_table(self.table, folder / f"{TABLE}{suffix}")
        write_json(folder / BASELINE, self.baseline)
        return folder


def load_curves(folder: str | os.PathLike) -> CurveResult:
    """The :class:`CurveResult` saved in ``folder`` (a run's report folder too): its table, its baseline
    (``baseline.json``, else read off the table's fraction-0 row) and the choice made on the table."""
    folder = Path(folder)
    table = check_curves(read_table(folder / f"{TABLE}.parquet"))
    path = folder / BASELINE
    try:
        baseline = json.loads(path.read_text()) if path.is_file() else baseline_from_curves(table)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadpruneError(f"cannot read {path} ({type(err).__name__}); fix or remove it") from None
    return CurveResult(table, check_baseline(baseline), choose(table))


def refine_break(curves: pd.DataFrame, method: str, measure: Callable[[float], pd.DataFrame],
                 heads_at: Callable[[float], int]) -> pd.DataFrame:
    """``curves`` with ``method`` measured again (``measure(f)``: its uncompensated row at ``f``) at the midpoints
    :func:`~headprune.report.breaks.next_fraction` asks for, until its break is located to
    :data:`~headprune.report.breaks.REFINE_STEP` (about 2 points from a 10% grid). The choice stays made on the grid
    every ranking shares (:func:`~headprune.report.tables.methods_by_curves`)."""
    while (f := next_fraction(curves, method, heads_at)) is not None:
        curves = pd.concat([curves, measure(f).query("fraction > 0")], ignore_index=True)
    return curves


def curve_stage(s: RunSettings, inputs: RunInputs, scored: HeadScores, rankings: list[str],
                head_sets: dict | None, progress: Progress, quiet: bool) -> CurveResult:
    """Every ranking uncompensated, then the best one (:func:`~headprune.report.choice.choose`'s pick) with mean
    (and, with ``s.optimal``, optimal) compensation, fills fitted on the scoring split."""
    model, windowing, score_ids = inputs.model, inputs.windowing, inputs.score_ids
    # the means come with the activation scores; without those (a --methods subset) they are measured here
    compensation = compensation_stage(model, score_ids, windowing, kinds=("mean", "optimal"), means=scored.means,
                                      fill_data=split_text(s.score_data, "validation", len(score_ids)),
                                      progress=progress, quiet=quiet)
    options = CurveOptions(fractions=tuple(s.fractions), seeds=s.seeds, bootstrap=s.bootstrap,
                           selection=Selection(seed=s.seed), windowing=windowing, head_sets=head_sets)

    def curves_of(variants: list[tuple[str, str]], fractions: tuple[float, ...] = options.fractions) -> pd.DataFrame:
        return pruning_curves(model, inputs.eval_ids, scored.table, variants,
                              options=replace(options, fractions=fractions), compensation=compensation,
                              progress=progress, show_progress=not quiet)

    curves = curves_of([(m, "none") for m in rankings])
    baseline = curves.attrs["baseline"] | {"bytes": scored_bytes(inputs.tokenizer, inputs.eval_ids, windowing)}
    choice = choose(curves)
    if choice.pick != GATE:  # a learned set exists at the grid's fractions only
        curves = refine_break(curves, choice.pick, lambda f: curves_of([(choice.pick, "none")], (f,)),
                              lambda f: len(ranking_heads(scored.table, choice.pick, f, options.selection)))
    t0 = time.perf_counter()
    compensated = curves_of([(choice.pick, "mean")] + ([(choice.pick, "optimal")] if s.optimal else []))
    return CurveResult(pd.concat([curves, compensated], ignore_index=True), baseline, choice,
                       time.perf_counter() - t0)
