"""The main job (``headprune run``): ledger, baseline, all scores, pruning curves, report.

Heads are scored on one corpus split (``score_data``, default: the default corpus' validation split) and
the curves are measured on another (``data``, default: its test split), so no head is chosen on the text
that judges it. Every unit of work is recorded in ``OUT/.progress.jsonl``: a killed run resumes; the file is
removed once the report is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headprune.cost import run_lines
from headprune.errors import HeadpruneError
from headprune.io.work.distributed import is_main, progress_files
from headprune.io.work.files import check_writable, ensure_dir, write_text
from headprune.io.work.progress import Progress
from headprune.models.ledger import format_info
from headprune.perplexity import bos_setting
from headprune.pruning.gates import gate_head_sets
from headprune.report import ReportSections, build_report, summary_table
from headprune.report.tables import bpb_factor
from headprune.reproduce import reproduce_commands
from headprune.runtime import return_freed_memory
from headprune.schema import (
    DEFAULT_MAX_TOKENS,
    IMPORTANCE_METHODS,
)
from headprune.scoring import HeadScores, ScoringOptions, score_heads
from headprune.stages.curves import CurveResult, curve_stage
from headprune.stages.inputs import RunInputs, load_inputs
from headprune.stages.settings import RunSettings, rankings_of, run_plan, settings_fields, split_text
from headprune.stages.window_length import planned as long_plan


def _patching(model, s: RunSettings, pairs, progress: Progress, quiet: bool = False):
    """The patching study of ``pairs``, the built-in task ``s.patch_task``'s (None for "none"), as the report shows
    it."""
    if pairs is None:
        return None
    from headprune.patching.study import StudyOptions
    from headprune.stages.patching import patch_stage

    options = StudyOptions(bootstrap=s.bootstrap, seed=s.seed, rows=s.ablation_rows)
    return patch_stage(model, pairs, options, task=s.patch_task, progress=progress, quiet=quiet)[1]


# as settings list their seconds
STAGE_ORDER = ("scoring", "layers", "long", "curves", "compensated_curves", "patching", "gates")


def stage_names(s: RunSettings, long: bool = False) -> list[str]:
    """The stages of a run with ``s``, in order: each gets one numbered line (:func:`stage_line`); ``long``: the model's
    context holds the long-documents stage (:mod:`headprune.stages.window_length`)."""
    return ["ledger", "scoring", "layers", *(["long documents"] if long else []),
            *(["gates"] if s.learn_gates else []), "pruning curves",
            *(["patching"] if s.patch_task != "none" else []), "report"]


def stage_line(stages: list[str], name: str, detail: str) -> str:
    """``[k/n] name: detail`` after an empty line, so that it stands apart from the progress bars around it."""
    return f"\n[{stages.index(name) + 1}/{len(stages)}] {name}: {detail}"


def run_settings(s: RunSettings, methods: list[str], inputs: RunInputs, fingerprint: dict, best: str,
                 seconds: dict[str, float], scored: HeadScores) -> dict:
    """The settings the report lists: the run's options, its data, the commands that reproduce its headline, and
    each stage's seconds."""
    point = 0.3 if 0.3 in s.fractions else s.fractions[len(s.fractions) // 2]
    score_data = split_text(s.score_data, "validation", len(inputs.score_ids))
    return {**settings_fields(s), "methods": methods,
            "commands": {"ranking": best, "fraction": point, "lines": reproduce_commands(s, best, point)},
            "model_fingerprint": fingerprint["model_fingerprint"], "seq_len": inputs.windowing.seq_len,
            "stride": inputs.windowing.stride, **bos_setting(inputs.windowing), "score_data": score_data,
            "eval_data": split_text(s.data, "test", len(inputs.eval_ids)), "device": str(inputs.model.device),
            "compensation_fills": score_data,
            "seconds_load": round(inputs.seconds_load, 1), "seconds_tokenize": round(inputs.seconds_tokenize, 1),
            **{f"seconds_{k}": round(seconds[k], 1) for k in STAGE_ORDER if k in seconds},
            "seconds_per_method": {k: round(v, 2) for k, v in scored.seconds.items()}}


@dataclass
class Run:
    """One run in progress: its settings and inputs, its progress file, its stages, where it logs, and each stage's
    seconds so far."""

    s: RunSettings
    inputs: RunInputs
    progress: Progress
    quiet: bool
    log: Callable[[str], None]
    seconds: dict[str, float] = field(default_factory=dict)
    long: tuple[list[int], str] | None = None  # the long-documents stage's lengths and cost line, where it runs

    def stage(self, name: str, detail: str) -> None:
        self.log(stage_line(stage_names(self.s, self.long is not None), name, detail))


@dataclass
class RunResults:
    """What the measuring stages found, for the report."""

    scored: HeadScores
    layers: Any  # each layer's heads removed together, on both splits (headprune.stages.layers)
    curves: CurveResult
    patching: Any  # the PatchingReport, None without a patching task
    long: dict[str, Any] | None = None  # the long-documents tables by file name, where the model's context holds them


def report_stage(run: Run, results: RunResults, settings: dict, out: Path) -> Path:
    """The head anatomy, the serving tables (:func:`~headprune.stages.serving.serving_stage`: the prunes exported,
    the run's model freed, then transformers and llama.cpp load and time each export), then the report into
    ``out``."""
    from headprune.anatomy.for_report import anatomy_report
    from headprune.models.families import layout_text, model_type
    from headprune.report.context_section import read_context_section
    from headprune.schema import SCORES_DIGEST
    from headprune.scoring.result import save_beside
    from headprune.stages.serving import serving_stage
    from headprune.table_checks import scores_digest

    inputs, scores, curves = run.inputs, results.scored.table, results.curves
    model, windowing = inputs.model, inputs.windowing
    return_freed_memory()  # what the heap kept of the stages before, returned before the anatomy's passes
    t0 = time.perf_counter()
    anatomy = anatomy_report(model, inputs.score_ids, windowing, scores, inputs.tokenizer.decode, run.s.seed)
    settings["seconds_anatomy"] = round(time.perf_counter() - t0, 1)
    settings |= {"family": model_type(model), "attention": layout_text(model), "unit": "query head",
                 "context_tokens": model.cfg.n_positions}
    serving = serving_stage(model, curves.table, scores, inputs.eval_ids, windowing, free=return_freed_memory)
    settings |= serving.settings
    table = curves.table.assign(**{SCORES_DIGEST: scores_digest(scores)})  # which scores ranked them
    t0 = time.perf_counter()
    extra = ReportSections(anatomy=anatomy, patching=results.patching, serving=serving.transformers,
                           serving_llama_cpp=serving.llama_cpp, context=read_context_section(out, settings),
                           layers=results.layers, long=results.long)
    save_beside(results.scored, out / "scores.parquet")  # the means and the meta; the report writes the table
    report = build_report(scores, table, out, settings=settings, baseline=curves.baseline, extra=extra,
                          replicates=results.scored.replicates)
    stages = {k.removeprefix("seconds_"): v for k, v in settings.items()
              if k.startswith("seconds_") and k != "seconds_per_method"}
    run.log("seconds per stage: " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items())
            + f", report {time.perf_counter() - t0:.1f}")
    return report


def _scoring(run: Run, methods: list[str]) -> HeadScores:
    """Every method's scores on the scoring split (its cost said first), then the gates' head sets where asked."""
    s, model, windowing, score_ids = run.s, run.inputs.model, run.inputs.windowing, run.inputs.score_ids
    run.stage("scoring", f"{len(model.head_ids)} heads by {len(methods)} methods on "
                         + split_text(s.score_data, "validation", len(score_ids)))
    t0 = time.perf_counter()
    scoring = ScoringOptions(ablation_rows=s.ablation_rows, bootstrap=s.bootstrap, seed=s.seed)
    scored = score_heads(model, score_ids, methods, windowing=windowing, options=scoring, progress=run.progress,
                         show_progress=not run.quiet)
    run.seconds["scoring"] = time.perf_counter() - t0
    return scored


def _layers(run: Run):
    """Each layer's heads removed together, on the validation split (where the layer that matters most is chosen)
    and on the test split (where its cost is reported)."""
    from headprune.stages.layers import layer_stage

    inputs = run.inputs
    run.stage("layers", f"each of {inputs.model.cfg.n_layers} layers' heads zero-ablated together, on both splits")
    t0 = time.perf_counter()
    layers = layer_stage(inputs, run.s, run.progress, run.quiet)
    run.seconds["layers"] = time.perf_counter() - t0
    return layers


def _long(run: Run, scored: HeadScores) -> dict[str, Any] | None:
    """On a model with a long context: perplexity and taylor at the run's window length and longer ones, on the same
    tokens of the long documents (:mod:`headprune.stages.window_length`)."""
    if run.long is None:
        return None
    from headprune.stages.window_length import long_stage, run_taylor_of

    run.stage("long documents", run.long[1])
    t0 = time.perf_counter()
    taylor, replicates = run_taylor_of(scored.table, scored.replicates, run.inputs.model.head_ids)
    tables = long_stage(run.inputs, run.s, taylor, replicates, run.progress, run.quiet)
    run.seconds["long"] = time.perf_counter() - t0
    return tables


def _gates(run: Run) -> dict | None:
    """With ``learn_gates``: one head set per fraction, learned on the scoring split."""
    s = run.s
    if not s.learn_gates:
        return None
    run.stage("gates", f"learning them on {s.score_data} (validation split), {s.gate_steps} steps for each fraction")
    t0 = time.perf_counter()
    head_sets = gate_head_sets(run.inputs.model, run.inputs.windowing.batches(run.inputs.score_ids),
                               list(s.fractions), s.gate_steps, seed=s.seed, progress=run.progress,
                               show_progress=not run.quiet)
    run.seconds["gates"] = time.perf_counter() - t0
    return head_sets


def _measure(run: Run, methods: list[str], ranked: list[str]) -> RunResults:
    """The measuring stages in order: scoring (and gates), the curves, the patching study."""
    s, inputs = run.s, run.inputs
    scored = _scoring(run, methods)
    layers = _layers(run)
    long = _long(run, scored)
    head_sets = _gates(run)
    rankings = rankings_of(s, ranked)
    run.stage("pruning curves", f"{len(rankings) - 1} rankings + random ({s.seeds} seeds) on {s.data} "
                                f"(test split), {len(inputs.eval_ids):,} tokens")
    t0 = time.perf_counter()
    curves = curve_stage(s, inputs, scored, rankings, head_sets, run.progress, run.quiet)
    run.seconds["compensated_curves"] = curves.seconds_compensated
    run.seconds["curves"] = time.perf_counter() - t0
    if s.patch_task != "none":
        run.stage("patching", f"the {s.patch_task} task, {s.patch_pairs} clean/corrupt prompt pairs: "
                              "exact patching of every head, AtP and AtP*")
    t0 = time.perf_counter()
    # every process patches: its exact sweeps are units like the scores'
    patching = _patching(inputs.model, s, inputs.patch_pairs, run.progress, run.quiet)
    if patching is not None:
        run.seconds["patching"] = time.perf_counter() - t0
    return RunResults(scored, layers, curves, patching, long)


def run_analysis(s: RunSettings, overwrite: bool = False, quiet: bool = False, log=print) -> dict | None:
    """Run the whole analysis into ``s.out``; return the summary (paths, baseline, best method, table).

    Under torchrun every process shares the work; only rank 0 writes the report (others return None).
    """
    check_writable(s.out)
    methods = list(s.methods)
    ranked = [m for m in methods if m in IMPORTANCE_METHODS]
    if not ranked:
        raise HeadpruneError(f"methods {', '.join(methods)} rank no heads (a description only); add one of "
                             f"{', '.join(IMPORTANCE_METHODS)}", "methods")
    t_start = time.perf_counter()
    inputs = load_inputs(s)
    fingerprint = inputs.fingerprint(s, methods)
    out = ensure_dir(s.out)
    mine, others = progress_files(out / ".progress.jsonl")
    run = Run(s, inputs, Progress(mine, fingerprint, overwrite=overwrite, others=others), quiet,
              log if is_main() else (lambda *a: None))
    run.long = long_plan(inputs, s)
    write_text(out / "ledger.txt", format_info(inputs.model, 1, inputs.windowing.seq_len) + "\n")
    if inputs.budget is not None:
        run.log(inputs.budget.line(DEFAULT_MAX_TOKENS))
    if inputs.patch_note is not None:
        run.log(inputs.patch_note)
    if not quiet:
        for line in run_lines(inputs.model, run_plan(s), len(inputs.score_ids), inputs.windowing, methods):
            run.log(line)
        if run.long is not None:
            run.log(f"and the long documents: {run.long[1]}")
    run.stage("ledger", f"parameters and shapes -> {out / 'ledger.txt'}")
    results = _measure(run, methods, ranked)
    choice = results.curves.choice
    settings = run_settings(s, methods, inputs, fingerprint, choice.pick, run.seconds, results.scored)
    if not is_main():
        return None
    run.stage("report", f"the head anatomy, then the report -> {out}")
    report = report_stage(run, results, settings, out)
    run.progress.remove(every_rank=True)  # the report is written: no process' units are needed any more
    baseline = results.curves.baseline
    return {"report": report, "out": out, "best": choice.pick, "choice": choice, "baseline": baseline,
            "table": summary_table(results.curves.table, bpb_factor(baseline)),
            "seconds": time.perf_counter() - t_start}
