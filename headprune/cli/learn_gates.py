"""``headprune learn-gates``: learn which heads to keep jointly (hard-concrete gates)."""

from __future__ import annotations

import argparse

from headprune.cli.common import check_gate_args, data_from_args, load_from_args, windowing_from_args
from headprune.cli.options import (
    add_data_args,
    add_gate_lr_arg,
    add_gate_steps_arg,
    add_json_arg,
    add_model_args,
    add_run_flags,
    add_seed_arg,
)

HELP = 'learn which heads to keep jointly (hard-concrete gates)'


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_data_args(p, "validation")
    p.add_argument("--sparsity", type=float, required=True,
                   help="target share of heads to close, in [0, 1]: exactly round(F x heads) close")
    add_gate_steps_arg(p, "training steps of the gates (one batch each)", default=None)
    add_gate_lr_arg(p, "--lr")
    add_seed_arg(p, "seed of the gates' noise")
    add_run_flags(p, "output scores table with a gate column, .csv or .parquet")
    add_json_arg(p, "a JSON summary (closed heads, lambdas, seconds)")


def run(args: argparse.Namespace) -> None:
    import json
    import time

    from headprune.cli.sweeps import finish_sweep, sweep_progress, sweep_settings, table_output
    from headprune.models.heads import format_heads
    from headprune.pruning.gates import GateOptions, learn_gates

    check_gate_args(args, "--gate-steps", "--lr")
    out = table_output(args)
    model = load_from_args(args)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    settings = sweep_settings(args, model, ids, w, "learn-gates", sparsity=args.sparsity, steps=args.gate_steps,
                              lr=args.gate_lr, seed=args.seed)
    progress = sweep_progress(args, out, settings)
    t0 = time.perf_counter()
    options = GateOptions(args.gate_steps, sparsity=args.sparsity, lr=args.gate_lr, seed=args.seed)
    result = learn_gates(model, w.batches(ids), options=options, progress=progress, show_progress=not args.quiet)
    if not finish_sweep(progress, result.table, out):
        return
    last = result.history[-1]
    summary = {"out": str(out), "heads": len(result.table), "closed": format_heads(result.closed),
               "expected_open": last["open"], "nll": last["nll"], "lambdas": result.lambdas,
               "steps": args.gate_steps, "seconds": round(time.perf_counter() - t0, 2)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"closed {len(result.closed)} of {len(result.table)} heads: {format_heads(result.closed) or '(none)'}")
        print(f"training NLL {last['nll']:.4f}, expected open gates {last['open']:.1f} (last steps' mean) -> {out}")
