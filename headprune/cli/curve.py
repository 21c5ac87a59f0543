"""``headprune curve``: perplexity as heads are pruned, per method, against random."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from headprune.cli.common import (
    check_gate_args,
    data_from_args,
    data_line,
    fill_source,
    load_from_args,
    selection_from_args,
    split_layer_ranking,
    windowing_from_args,
)
from headprune.cli.options import (
    add_bootstrap_arg,
    add_compensate_arg,
    add_data_args,
    add_fraction_args,
    add_gate_lr_arg,
    add_gate_steps_arg,
    add_methods_arg,
    add_model_args,
    add_run_flags,
    add_scores_arg,
    add_selection_args,
    add_train_data_arg,
    add_workers_arg,
)
from headprune.errors import HeadpruneError
from headprune.schema import IMPORTANCE_METHODS

HELP = 'perplexity as heads are pruned, per method, against random'


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_workers_arg(p)
    add_data_args(p, "test")
    add_scores_arg(p, required=True)
    add_methods_arg(p, "scores columns to rank by: all (every importance column of --scores) "
                        f"or a comma-separated list of: {', '.join(IMPORTANCE_METHODS)}, "
                        "random; gate learns hard-concrete gates for each fraction (on "
                        "--score-data, --gate-steps steps each); NAME@layer (as the report "
                        "names it): NAME's scores normalised per layer")
    add_fraction_args(p)
    add_compensate_arg(p, "mean / optimal: also measure curves with the pruned heads' mean outputs / the constants "
                        "optimal for ablating each pruned set together (Li & Janson 2024) folded into b_O, both from "
                        "--score-data")
    add_selection_args(p)
    add_bootstrap_arg(p)
    p.add_argument("--recover", type=int, default=0, metavar="STEPS",
                   help="also fine-tune every pruned point STEPS steps (headprune finetune's recipe) and add the "
                        "recovered points (column recover_steps; random left out)")
    add_train_data_arg(p, "corpus --recover trains on, its train split")
    add_gate_steps_arg(p, "training steps per fraction of --methods gate")
    add_gate_lr_arg(p)
    add_run_flags(p, "output table, .csv or .parquet")


def run(args: argparse.Namespace) -> None:
    from headprune.cli.sweeps import finish_sweep, sweep_progress, sweep_settings, table_output
    from headprune.data.tokens import token_digest
    from headprune.pruning.gates import GATE
    from headprune.pruning.selection import check_scores_match
    from headprune.schema import RANDOM, SCORES_DIGEST, parse_fractions
    from headprune.scoring.result import load_scores
    from headprune.table_checks import scores_digest

    check_gate_args(args, "--gate-steps", "--gate-lr")
    out = table_output(args)
    fractions = parse_fractions(args.fractions)
    model = load_from_args(args)
    saved = load_scores(args.scores)
    scores = saved.table
    check_scores_match(scores, model, args.scores)
    methods = curve_methods(args, scores)
    learned = GATE in methods
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    compensate = args.compensate != "none"
    needs_score_ids = compensate or learned
    score_ids = data_from_args(args, model, args.score_data, "validation") if needs_score_ids else None
    print(data_line("data", args.data, args.split, ids, w))
    if score_ids is not None:
        print(data_line("score data", args.score_data, "validation", score_ids))
    variants = [(m, "none") for m in methods] + [(RANDOM, "none")]
    variants += [(m, args.compensate) for m in methods] if compensate else []
    train_ids = curve_train_ids(args, model, ids) if args.recover else None
    settings = sweep_settings(args, model, ids, w, "curve", scores=scores.to_json(), variants=variants,
                              recover=args.recover,
                              train_tokens=token_digest(train_ids) if train_ids is not None else None,
                              fractions=fractions, seeds=args.seeds, seed=args.seed, per_layer=args.per_layer,
                              normalize=args.normalize, standardize=args.standardize,
                              score_data=args.score_data if needs_score_ids else None,
                              score_tokens=token_digest(score_ids) if score_ids is not None else None,
                              gate_steps=args.gate_steps if learned else None,
                              gate_lr=args.gate_lr if learned else None)
    if not args.quiet:
        _print_estimate(args, model, variants, fractions, ids, score_ids, w)
    progress = sweep_progress(args, out, settings)
    streams = Streams(ids, score_ids, train_ids, w)
    curves, fill_data = _measure(args, model, saved, variants, fractions, streams, progress)
    curves = curves.assign(**{SCORES_DIGEST: scores_digest(scores)})  # which scores ranked them (report checks)
    if not finish_sweep(progress, curves, out):
        return
    print(curves.drop(columns=["fill_data", SCORES_DIGEST]).to_string(index=False, float_format="%.4f"))
    if fill_data:
        print(f"{args.compensate} compensation: fills fitted on {fill_data}")
    print(f"-> {out}")


def _print_estimate(args: argparse.Namespace, model, variants, fractions, ids, score_ids, w) -> None:
    """What the curves will cost here: a forward per pruned model (each ranking at each fraction above 0, random
    once per seed) and the mean fills' forward; gate training and --recover said to be left out."""
    from headprune.cost import Pace, estimate_curves
    from headprune.schema import RANDOM

    steps = sum(1 for f in fractions if f > 0)
    points = sum(args.seeds if m == RANDOM else 1 for m, _ in variants) * steps
    fill_tokens = len(score_ids) if args.compensate == "mean" and score_ids is not None else 0
    line = estimate_curves(model, points, len(ids), w.seq_len, Pace.here(model, w.seq_len), fill_tokens).line()
    left_out = [what for what, on in (("gate training", any(m == "gate" for m, _ in variants)),
                                      ("the optimal fills' fit", args.compensate == "optimal"),
                                      ("--recover's training", bool(args.recover))) if on]
    print(line + (f"; not counted: {', '.join(left_out)}" if left_out else ""))


def curve_methods(args: argparse.Namespace, scores) -> list[str]:
    """The rankings ``--methods`` names (all importance columns of the scores for ``all``), checked; random is
    always measured, so it is left out here."""
    from headprune.pruning.gates import GATE
    from headprune.schema import IMPORTANCE_METHODS, RANDOM

    available = [m for m in IMPORTANCE_METHODS if m in scores.columns]
    methods = available if args.methods == "all" else [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in (RANDOM, GATE) and split_layer_ranking(m, args, "--methods") not in available:
            raise HeadpruneError(f"method {m!r} is not an importance column of {args.scores}; use "
                                 f"{', '.join([*available, GATE, RANDOM])}")
    return [m for m in methods if m != RANDOM]


@dataclass(frozen=True)
class Streams:
    """The token streams of ``curve``, in windows ``w``: curves measured on ``ids``; fills and gates fitted on
    ``score_ids`` (None where neither is asked); ``--recover`` trains on ``train_ids`` (None without it)."""

    ids: Any
    score_ids: Any
    train_ids: Any
    w: Any


def _measure(args: argparse.Namespace, model, saved, variants, fractions, streams: Streams, progress):
    """(curves, where the fills were fitted): compensation fills and learned gate sets fitted on the score data
    (resumable; the head means saved with the scores ``saved`` where they were measured on the same tokens), every
    variant's curve, and with ``--recover`` each point's fine-tuned curve."""
    ids, score_ids, train_ids, w = streams.ids, streams.score_ids, streams.train_ids, streams.w
    from headprune.pruning.curves import pruning_curves
    from headprune.pruning.gates import GATE, gate_head_sets
    from headprune.pruning.options import CurveOptions, RecoveryData
    from headprune.pruning.recovered_curves import recovered_curves
    from headprune.scoring.result import saved_means
    from headprune.stages.compensation import compensation_stage

    compensate, learned = args.compensate != "none", any(m == GATE for m, _ in variants)
    fill_data = fill_source(args, score_ids if compensate else None)
    means = saved_means(saved, score_ids, w) if compensate else None
    if means is not None and not args.quiet:
        print(f"head means: read from beside {args.scores}, measured on the same tokens and windows")
    compensation = compensation_stage(model, score_ids, w, kinds=(args.compensate,) if compensate else (),
                                      means=means, fill_data=fill_data, progress=progress, quiet=args.quiet)
    scores = saved.table
    head_sets = None
    if learned:  # one set of gates learned per fraction, each training resumable from its checkpoints
        assert score_ids is not None
        head_sets = gate_head_sets(model, w.batches(score_ids), fractions, args.gate_steps, args.gate_lr, args.seed,
                                   progress, show_progress=not args.quiet)
    options = CurveOptions(fractions=tuple(fractions), seeds=args.seeds, bootstrap=args.bootstrap,
                           selection=selection_from_args(args), windowing=w, head_sets=head_sets)
    curves = pruning_curves(model, ids, scores, variants, options=options, compensation=compensation,
                            progress=progress, show_progress=not args.quiet)
    if args.recover:  # the same options and fills: intervals, compensation and learned sets carry over
        import pandas as pd

        assert train_ids is not None
        data = RecoveryData(ids, train_ids, args.recover)
        recovered = recovered_curves(model, data, scores, variants=variants, options=options,
                                     compensation=compensation, progress=progress, show_progress=not args.quiet)
        curves = pd.concat([curves.assign(recover_steps=0), recovered], ignore_index=True)
    return curves, fill_data


def curve_train_ids(args: argparse.Namespace, model, eval_ids):
    """The training tokens of ``curve --recover`` (``--train-data``, train split), refused where they are the
    evaluation data; checked before any work."""
    from headprune.data.overlap import refuse_same_data
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.tokenizer import model_tokenizer

    tok = model_tokenizer(model)
    train_ids = corpus_ids(args.train_data, "train", tok)
    refuse_same_data(args.train_data, args.data, train_ids, eval_ids, tok)
    return train_ids
