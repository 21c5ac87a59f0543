"""``headprune rank``: an exact ablation ranking whose precision is stated, with tokens spent where the answer is
open: every head on a first batch of windows, the undecided heads on more, until the top K is certified or the
corpus runs out (:mod:`headprune.scoring.adaptive`)."""

from __future__ import annotations

import argparse

from headprune.cli.common import data_from_args, data_line, load_from_args, windowing_from_args
from headprune.cli.options import (
    add_ablation_rows_arg,
    add_data_args,
    add_json_arg,
    add_method_arg,
    add_model_args,
    add_run_flags,
    add_seed_arg,
    add_workers_arg,
)
from headprune.schema import ADAPTIVE_TARGETS, RANKABLE

HELP = "exact ablation ranking that measures undecided heads on more windows"
PARAMS = {"rows": "ablation_rows"}  # library parameters, as this command's options


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_workers_arg(p)
    add_data_args(p, "validation")
    add_method_arg(p, "the ablation measured", RANKABLE)
    p.add_argument("--top", type=int, default=None, help="K, the size of the answer (default 10%% of the heads)")
    p.add_argument("--target", choices=tuple(ADAPTIVE_TARGETS), default="top",
                   help="; ".join(f"{k}: {v}" for k, v in ADAPTIVE_TARGETS.items()))
    p.add_argument("--level", type=float, default=0.95,
                   help="confidence at which every interval holds together (Bonferroni over heads and rounds)")
    p.add_argument("--margin", type=float, default=0.0,
                   help="nats/token: heads this close to the boundary of the top K count as tied, so that a dense "
                        "boundary can be decided (0: exact membership)")
    p.add_argument("--first-windows", type=int, default=8, help="windows every head is measured on first")
    p.add_argument("--growth", type=float, default=2.0,
                   help="each round multiplies the windows of the heads still contested by this")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--max-head-windows", type=int, default=None,
                     help="cost cap: the rounds stop before one that would take the head × window ablations past it")
    cap.add_argument("--max-minutes", type=float, default=None,
                     help="cost cap in minutes, turned into head-windows by this machine's measured pace (said "
                          "before the work; the summary records it, so --max-head-windows repeats the ranking)")
    add_seed_arg(p, "seed of the windows' order")
    add_ablation_rows_arg(p)
    add_run_flags(p, "output table, .csv or .parquet (its summary is written beside it as .json)")
    add_json_arg(p, "the JSON summary")


def run(args: argparse.Namespace) -> None:
    from dataclasses import replace

    from headprune.cli.sweeps import finish_ranking, sweep_progress, sweep_settings, table_output
    from headprune.cost import Pace, duration, estimate_scoring
    from headprune.errors import HeadpruneError
    from headprune.scoring.adaptive import AdaptiveOptions, adaptive_ranking

    out = table_output(args)
    model = load_from_args(args)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    pool = sum(len(b.tokens) for b in w.batches(ids))  # windows
    n_heads = len(model.head_ids)
    options = AdaptiveOptions(args.top, args.target, args.level, args.margin, args.first_windows, args.growth,
                              args.seed, args.ablation_rows, args.max_head_windows)
    schedule = options.check(n_heads, pool)[1]  # every option checked before the work
    if not args.json or args.max_minutes is not None:
        pace = Pace.here(model, w.seq_len)
        per_head_window = estimate_scoring(model, [args.method], len(ids), w.seq_len, pace).total / (n_heads * pool)
    if args.max_minutes is not None:
        bought = int(args.max_minutes * 60 / per_head_window)
        if bought < n_heads * schedule[0]:
            raise HeadpruneError(f"max_minutes {args.max_minutes:g} buys about {bought:,} "
                                 f"head-window ablations here, less than the first round ({n_heads} heads × "
                                 f"{schedule[0]} windows): give more minutes or fewer --first-windows", "max_minutes")
        options = replace(options, max_head_windows=bought)
    cap = options.max_head_windows
    if not args.json:
        first = estimate_scoring(model, [args.method], schedule[0] * w.seq_len, w.seq_len, pace)
        print(data_line("data", args.data, args.split, ids, w))
        print(f"first round, every head on {schedule[0]} of {pool} windows: {first.line()}")
        print(f"at most, with every head contested to the last window: about "
              f"{duration(per_head_window * n_heads * pool)}"
              + ("" if cap is None else f"; capped at {cap:,} head-windows, about {duration(per_head_window * cap)}"))
    # what the units measure; top, target, level and margin only choose which units run (each keyed by its heads and
    # windows), so a ranking that decides otherwise resumes from the same file
    settings = sweep_settings(args, model, ids, w, "rank", method=args.method, first=args.first_windows,
                              growth=args.growth, seed=args.seed)
    progress = sweep_progress(args, out, settings)
    result = adaptive_ranking(model, ids, args.method, options=options, windowing=w, progress=progress,
                              show_progress=not args.quiet)
    if not finish_ranking(progress, result, out, args.json):
        return
    _print_result(result, out)


def _print_result(result, out) -> None:
    """The certified heads with their intervals, the contested ones and the places they compete for, the cost."""
    table = result.table.set_index("head_id")
    named = ", ".join(f"{h} {table.at[h, 'delta']:+.4f} [{table.at[h, 'ci_lo']:+.4f}, {table.at[h, 'ci_hi']:+.4f}]"
                      for h in result.certified)
    last = result.rounds.iloc[-1]
    margin = f", ties within {result.margin:g}" if result.margin else ""
    answer = f"top {result.k}" if result.target == "top" else f"{result.k} heads a prune removes first"
    print(f"certified in the {answer} by {result.method} at {result.level:.0%}{margin} (nats/token, "
          f"simultaneous intervals): {named or 'none'}")
    if result.contested:
        print(f"contested for the {result.open_places} open places: {', '.join(result.contested)}")
    stopped = {"decided": "every head decided", "pool": "the windows ran out", "cap": "stopped by the cost cap"}
    n = len(result.rounds)
    print(f"{n} round{'s' if n > 1 else ''} ({stopped[result.stopped]}), up to {int(last['windows'])} windows; "
          f"{result.head_windows:,} head-window "
          f"ablations against {len(result.table) * result.pool_windows:,} for a plain sweep of the same windows "
          f"-> {out}")
