"""``headprune long``: ``run``'s long-documents stage (:mod:`headprune.stages.window_length`) on a finished run's
folder: perplexity and the heads' taylor ranking at the run's window length and longer ones on the same tokens of the
long documents, written beside the run's tables, and the report re-rendered with its section."""

from __future__ import annotations

import argparse

from headprune.cli.options import add_run_flags
from headprune.errors import HeadpruneError

HELP = "perplexity and taylor in longer windows of long texts, for a run's folder"


def configure(p: argparse.ArgumentParser) -> None:
    add_run_flags(p, "a finished headprune run's folder (settings.json, scores with taylor, curves): the long_*.csv "
                     "tables are written there and the report re-rendered")


def run(args: argparse.Namespace) -> None:
    from headprune.cli.common import finish_stage, open_finished_run
    from headprune.io.work.progress import Progress
    from headprune.scoring.result import load_scores
    from headprune.stages.window_length import long_stage, planned, run_taylor_of

    out, record, s, inputs = open_finished_run(args.out)
    plan = planned(inputs, s)
    if plan is None:
        raise HeadpruneError(f"{s.model}: its context ({inputs.model.cfg.n_positions} positions) holds no window 4× "
                             f"the run's {inputs.windowing.seq_len} tokens of at least 1,024, or the run has no taylor "
                             "scores: no long-documents stage")
    if not args.quiet:
        print(f"long documents for {s.model}: {plan[1]}")
    scored = load_scores(out / "scores.parquet")
    run_taylor, run_reps = run_taylor_of(scored.table, scored.replicates, inputs.model.head_ids)
    progress = Progress(out / ".long-progress.jsonl", {"stage": "long", "settings": record}, overwrite=args.overwrite)
    tables = long_stage(inputs, s, run_taylor, run_reps, progress, args.quiet)
    report = finish_stage(out, tables, progress)
    print(f"long documents -> {', '.join(str(out / name) for name in tables)}; report -> {report}")
