"""``headprune score``: score heads: weight norms, activations, gradients, ablation."""

from __future__ import annotations

import argparse
from typing import Any

from headprune.cli.common import data_from_args, data_line, load_from_args, print_estimate, windowing_from_args
from headprune.cli.options import (
    add_ablation_rows_arg,
    add_bootstrap_arg,
    add_data_args,
    add_json_arg,
    add_methods_arg,
    add_model_args,
    add_run_flags,
    add_seed_arg,
    add_streaming_args,
    add_workers_arg,
)
from headprune.schema import METHODS, OPT_IN

HELP = 'score heads: weight norms, activations, gradients, ablation'


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_workers_arg(p)
    add_data_args(p, "validation")
    add_methods_arg(p, f"all (every method but the opt-in {', '.join(OPT_IN)}: all,abl_opt adds one), or a "
                        f"comma-separated list of: {', '.join(METHODS)}")
    add_run_flags(p, "output table, .csv or .parquet")
    add_ablation_rows_arg(p)
    add_bootstrap_arg(p)
    add_seed_arg(p, "seed of the bootstrap resampling")
    add_json_arg(p, "a JSON summary (baseline, tokens, seconds per method)")
    add_streaming_args(p)
    p.add_argument("--unit", choices=["head", "group"], default="head",
                   help="group (grouped-query models): one row per KV group, each score summed over its query "
                        "heads, plus abl_zero_group (the whole group ablated jointly) and how well the sums "
                        "predict it (Spearman with a bootstrap interval)")


def run(args: argparse.Namespace) -> None:
    import json

    from headprune.cli.sweeps import finish_sweep, sweep_progress, sweep_settings, table_output
    from headprune.schema import parse_methods
    from headprune.scoring import ScoringOptions, score_heads

    out = table_output(args)
    methods = parse_methods(args.methods)
    model = load_from_args(args)
    w = windowing_from_args(args, model)
    if args.unit == "group":
        from headprune.scoring.groups import require_groups

        require_groups(model)
    ids = data_from_args(args, model)
    if not args.json:
        print(data_line("data", args.data, args.split, ids, w))
        print_estimate(model, methods, len(ids), w.seq_len)
    progress = sweep_progress(args, out, sweep_settings(args, model, ids, w, "score", methods=methods))
    options = ScoringOptions(ablation_rows=args.ablation_rows, bootstrap=args.bootstrap, seed=args.seed,
                             stream_sink=args.sink, stream_recent=args.window)
    scored = score_heads(model, ids, methods, windowing=w, options=options, progress=progress,
                         show_progress=not args.quiet)
    table, extra = scored.table, dict[str, Any]()
    if args.unit == "group":
        from headprune.scoring.groups import score_groups

        table, extra = score_groups(model, ids, scored.table, w, args.ablation_rows or 8, args.bootstrap, args.seed)
    if not finish_sweep(progress, table, out):
        return
    if args.unit == "head":  # the head means and the meta beside the table, for curve and prune to reuse
        from headprune.scoring.result import save_beside

        save_beside(scored, out)
    if extra:
        from headprune.io.work.files import write_json

        write_json(out.with_name(out.stem + ".groups.json"), extra)
        if not args.json:
            ci = extra["summed_vs_joint_ci"]
            interval = (f"95% interval {ci[0]:.3f} to {ci[1]:.3f}, {args.bootstrap} bootstrap replicates over windows"
                        if ci is not None else "no interval: --bootstrap 0")
            print(f"summed single-head abl_zero vs abl_zero_group over {extra['groups']} KV groups: Spearman rho = "
                  f"{extra['summed_vs_joint_spearman']:.3f} ({interval})")
    summary = {"out": str(out), "heads": len(scored.table), "fold_value_bias": args.fold_value_bias,
               "seconds": scored.seconds} | extra
    summary |= {"baseline": scored.baseline} if scored.baseline else {}
    print(json.dumps(summary) if args.json else f"scored {len(scored.table)} heads with {', '.join(methods)} -> {out}")
