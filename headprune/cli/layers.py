"""``headprune layers``: each layer's heads removed together on a finished run's own tokens and windows (its
settings.json), written as the run folder's ``layers.csv``, and the report re-rendered with it: ``run``'s layers
stage, for a run folder written before that stage existed."""

from __future__ import annotations

import argparse

from headprune.cli.options import add_run_flags

HELP = "remove each layer's heads together, for a finished run's folder"


def configure(p: argparse.ArgumentParser) -> None:
    add_run_flags(p, "a finished headprune run's folder (settings.json, scores and curves): layers.csv is written "
                     "there and the report re-rendered")


def run(args: argparse.Namespace) -> None:
    from headprune.cli.common import finish_stage, open_finished_run
    from headprune.cost import Pace, estimate_layers
    from headprune.io.work.progress import Progress
    from headprune.report.layers import LAYERS_FILE
    from headprune.stages.layers import layer_stage

    out, record, s, inputs = open_finished_run(args.out)
    tokens = len(inputs.score_ids) + len(inputs.eval_ids)
    if not args.quiet:
        pace = Pace.here(inputs.model, inputs.windowing.seq_len)
        print(f"{inputs.model.cfg.n_layers} layers on both splits of {s.model}: "
              + estimate_layers(inputs.model, tokens, inputs.windowing.seq_len, pace).line())
    progress = Progress(out / ".layers-progress.jsonl", {"stage": "layers", "settings": record},
                        overwrite=args.overwrite)
    report = finish_stage(out, {LAYERS_FILE: layer_stage(inputs, s, progress, args.quiet)}, progress)
    print(f"layers -> {out / LAYERS_FILE}; report -> {report}")
