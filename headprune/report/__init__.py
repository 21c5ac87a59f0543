"""The report of a headprune run: which heads matter, how well the cheap scores predict it, what pruning costs.

``build_report(scores, curves, out_dir, settings=..., baseline=...)`` writes into ``out_dir``, every file atomically:

- ``scores.parquet``, ``scores.csv``: one row per head (layer, head, head_id, model_fingerprint, one column per method);
- ``curves.parquet``, ``curves.csv``: perplexity after pruning, one row per (method, compensation, fraction);
- ``predictiveness.csv``: how well each score predicts ``abl_zero`` (NLL increase when the head is zero-ablated):
  R^2 of a one-variable linear fit, Spearman rho, Kendall tau-b, ROC-AUC for finding the top 10% heads;
- ``heatmaps.png``: every method's scores on the layer x head grid, small multiples (grey: head missing), each
  with a colorbar in its unit, or (``scale="rank"``) all in importance ranks on one shared scale; report.html shows
  them as inline SVG whose cells give head, value and rank on hover;
- ``curves.png``: perplexity and NLL increase against the share of heads pruned (% and heads removed); random as
  mean line with a +-1 std band; one Okabe-Ito hue per method family; the best ``@layer`` ranking too;
  ``curves_phone.png``: its perplexity panel for a 400 px screen (best ranking, best ``@layer``, random), which
  report.html shows on narrow screens;
- ``pruning_order.png``: per ranking method, the step at which each head is removed (layer x head grid);
- ``scatters.png``: each score against ``abl_zero`` (small multiples; points coloured by layer, a discrete legend;
  Spearman rho with its 95% interval in the titles; values with each score's 95% bootstrap interval as grey bars
  or, with ``scale="rank"``, ranks);
- ``rank_correlation.png``: Spearman and Kendall matrices of all method columns;
- with a patching study: ``patching.png`` and its tables (:mod:`.patching_section`);
- for a family with a compact hf export (not GPT-2 or GPT-NeoX): serving.csv, its exports served in stock
  transformers (:mod:`.serving_section`); for a model read from a GGUF file with llama.cpp installed:
  serving_llama_cpp.csv, its uniform and uneven prunes run by llama.cpp (:mod:`.serving_gguf_section`);
- ``settings.json``, ``baseline.json``: the run's settings and unpruned baseline, so the report can be rebuilt;
- ``summary.md``: the first screen (which heads matter, which cheap score to trust, what pruning costs in
  perplexity: :mod:`.headline`), the findings (3-6 sentences from the numbers: \
the layer that matters most, the scores that beat
  the random band at 30% and 50%, where the best ranking breaks, the scores that rank heads inversely, what mean and
  optimal compensation buy), the
  perplexity (and bits per byte where the baseline has ``bytes``) at 10/30/50% pruned, top-10 heads by
  ``abl_zero``, heads removed per layer, predictiveness, then settings and timings;
- ``report.html``: one self-contained page with all of the above (pictures as data: URIs, inline CSS and a few
  lines of inline JavaScript that sort tables; table of contents; settings folded at the end).

``rebuild_report`` redoes it from saved tables (the ``headprune report`` command). The package: ``tables``
(the numbers), ``findings`` (the headline sentences), ``plots`` (figures as PNG bytes), ``render`` (one list of
sections, and its markdown), ``page`` (its HTML).
Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from headprune.errors import HeadpruneError
from headprune.io.work.files import (
    atomic_dir,
    read_scores,
    read_table,
    write_bytes,
    write_json,
    write_table,
    write_text,
)
from headprune.io.work.replicates import read_replicates, row_heads
from headprune.report.anatomy import (
    AnatomyReport,
    anatomy_parts,
    before_pictures,
    read_anatomy_files,
    write_anatomy_files,
)
from headprune.report.choice import best_method
from headprune.report.context_section import read_context_section
from headprune.report.layers import LAYERS_FILE, read_layers
from headprune.report.layers_section import layers_section
from headprune.report.page import render_html
from headprune.report.patching_section import (
    PATCH_TABLE,
    PatchingReport,
    patching_parts,
    read_patching_files,
    write_patching_files,
)
from headprune.report.plots import SCALES, make_pictures
from headprune.report.predictiveness import predictiveness
from headprune.report.recovery_section import recovery_parts, split_recovered
from headprune.report.render import Section, make_content, markdown_table, render_markdown, sections
from headprune.report.serving_gguf_section import gguf_serving_parts, read_gguf_serving_file, write_gguf_serving_file
from headprune.report.serving_section import read_serving_file, serving_parts, write_serving_file
from headprune.report.tables import (
    baseline_from_curves,
    check_baseline,
    check_together,
    jsonable,
    summary_table,
)
from headprune.report.window_length_section import long_section, read_long
from headprune.table_checks import check_curves, check_layers, check_scores

__all__ = ["ReportSections", "baseline_from_curves", "best_method", "build_report", "markdown_table",
           "predictiveness", "rebuild_report", "summary_table"]


@dataclass(frozen=True)
class ReportSections:
    """The report's optional sections, each with its files: ``anatomy`` the head anatomy (:mod:`.anatomy`),
    ``patching`` a patching study (:mod:`.patching_section`), ``serving`` the exports served in stock transformers
    (:mod:`.serving_section`); None leaves a section out."""

    anatomy: AnatomyReport | None = None
    patching: PatchingReport | None = None
    serving: pd.DataFrame | None = None
    serving_llama_cpp: pd.DataFrame | None = None  # the prunes run by llama.cpp (:mod:`.serving_gguf_section`)
    context: Section | None = None  # read from the run's context/ folder (:mod:`.context_section`)
    layers: pd.DataFrame | None = None  # each layer's heads removed together (:mod:`.layers`, layers.csv)
    long: dict[str, pd.DataFrame] | None = None  # windows of several lengths on long documents (by file name)


NO_SECTIONS = ReportSections()


def build_report(scores: pd.DataFrame, curves: pd.DataFrame, out_dir: str | os.PathLike, settings: dict | None,
                 baseline: dict, extra: ReportSections = NO_SECTIONS, scale: str = "value",
                 replicates: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write the tables, pictures, summary.md and report.html into ``out_dir``; return report.html's path.
    With ``extra``, also the optional sections that it holds and their files; with ``replicates`` (the scores on
    resampled windows, :mod:`headprune.io.work.replicates`), rank statistics' intervals that hold the data noise.

    Inputs are validated before anything is written (HeadpruneError naming the problem).
    """
    scores, full = check_scores(scores), check_curves(curves)
    curves, recovered = split_recovered(full)  # curve --recover: the recovered points get their own section
    settings, baseline = jsonable(settings), check_baseline(baseline)
    check_together(scores, curves, baseline)
    if extra.layers is not None:
        extra = replace(extra, layers=check_layers(extra.layers, scores))
    content = make_content(scores, curves, settings, baseline, extra.layers, replicates)
    if scale not in SCALES:
        raise HeadpruneError(f"scale {scale!r} must be one of {', '.join(SCALES)}", "scale")
    pictures = make_pictures(scores, curves, baseline, content.predictiveness, scale)
    recovery = recovery_parts(curves, recovered, baseline) if recovered is not None else None
    with atomic_dir(out_dir) as out:  # a new report folder appears complete, or not at all
        _write_report(out, content, full, pictures, extra, recovery)
    return Path(out_dir).absolute() / "report.html"


def _write_report(out: Path, content, curves, pictures, extra: ReportSections, recovery=None) -> None:
    """Everything into the folder ``out``: ``content`` gives the scores, settings and baseline; ``curves`` are all
    of them, the recovered points included."""
    scores, settings, baseline = content.scores, content.settings, content.baseline
    anatomy, patching, serving, context = extra.anatomy, extra.patching, extra.serving, extra.context
    for name, df in (("scores", scores), ("curves", curves)):
        write_table(df, out / f"{name}.parquet")
        write_table(df, out / f"{name}.csv")
    write_table(content.predictiveness, out / "predictiveness.csv")
    write_json(out / "settings.json", settings)
    write_json(out / "baseline.json", baseline)
    for pic in pictures:
        _write_picture(out, pic)
    secs = sections(content, pictures)
    if extra.layers is not None:  # after the findings' tables, before the anatomy
        write_table(extra.layers, out / LAYERS_FILE)
        secs = before_pictures(secs, layers_section(extra.layers, scores))
    if extra.long is not None:  # after the layers
        for name, table in extra.long.items():
            write_table(table, out / name)
        secs = before_pictures(secs, long_section(extra.long))
    if anatomy is not None:
        write_anatomy_files(out, anatomy)
        section, anatomy_pictures = anatomy_parts(anatomy, scores)
        for pic in anatomy_pictures:
            _write_picture(out, pic)
        secs = before_pictures(secs, section)
    if patching is not None:  # after the anatomy, before the picture gallery
        write_patching_files(out / PATCH_TABLE, patching)
        section, patching_pictures = patching_parts(patching, scores, anatomy)
        for pic in patching_pictures:
            _write_picture(out, pic)
        secs = before_pictures(secs, section)
    if serving is not None:  # after the patching section, before the picture gallery
        write_serving_file(out, serving)
        secs = before_pictures(secs, serving_parts(serving, settings))
    if extra.serving_llama_cpp is not None:
        write_gguf_serving_file(out, extra.serving_llama_cpp)
        secs = before_pictures(secs, gguf_serving_parts(extra.serving_llama_cpp, settings))
    if context is not None:  # its files stay in context/, where headprune context wrote them
        secs = before_pictures(secs, context)
    if recovery is not None:  # after "Perplexity after pruning"
        section, pic, table = recovery
        write_bytes(out / pic.name, pic.png)
        write_table(table, out / "recovery.csv")
        secs.insert(2, section)
    write_text(out / "summary.md", render_markdown(secs))
    write_text(out / "report.html", render_html(secs))


def _write_picture(out: Path, pic) -> None:
    """The PNG and, where it has one, its phone version (``NAME_phone.png``)."""
    write_bytes(out / pic.name, pic.png)
    if pic.phone_png is not None:
        write_bytes(out / pic.phone_name, pic.phone_png)


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadpruneError(f"cannot read {path} ({type(err).__name__}); fix or remove it") from None
    if not isinstance(value, dict):
        raise HeadpruneError(f"{path} must hold a JSON object")
    return value


def rebuild_report(scores_path: str | os.PathLike, curves_path: str | os.PathLike, out_dir: str | os.PathLike,
                   scale: str = "value") -> Path:
    """build_report from saved tables, with settings.json / baseline.json beside the scores file if present.

    Without them: empty settings, and the baseline read off the curves' fraction-0 row.
    """
    scores, curves = read_scores(scores_path), read_table(curves_path)
    folder = Path(scores_path).parent
    settings = _read_json(folder / "settings.json") or {}
    other = _read_json(Path(curves_path).parent / "settings.json")
    if other is not None and settings and other != settings:
        raise HeadpruneError(f"{scores_path} and {curves_path} come from runs with different settings (their "
                             "settings.json differ); rebuild a report from the tables of one run")
    baseline = _read_json(folder / "baseline.json") or baseline_from_curves(curves)
    extra = ReportSections(anatomy=read_anatomy_files(folder), patching=read_patching_files(folder),
                           serving=read_serving_file(folder), serving_llama_cpp=read_gguf_serving_file(folder),
                           context=read_context_section(folder, settings), layers=read_layers(folder),
                           long=read_long(folder))
    return build_report(scores, curves, out_dir, settings=settings, baseline=baseline, extra=extra, scale=scale,
                        replicates=read_replicates(scores_path, row_heads(scores)))
