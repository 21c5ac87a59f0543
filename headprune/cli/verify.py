"""``headprune verify``: an ablation ranking without the exact sweep of every head: a cheap estimate for every
head, exact ablation of those it ranks first, a bound on what the others can hide
(:mod:`headprune.scoring.verified`)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from headprune.cli.common import data_from_args, data_line, load_from_args, windowing_from_args
from headprune.cli.options import (
    add_ablation_rows_arg,
    add_data_args,
    add_json_arg,
    add_method_arg,
    add_model_args,
    add_run_flags,
    add_scores_arg,
    add_seed_arg,
    add_streaming_args,
    add_verification_args,
    add_workers_arg,
)
from headprune.errors import HeadpruneError
from headprune.schema import (
    METHOD_SPECS,
    VERIFIABLE,
    VERIFY_ESTIMATES,
    VERIFY_INCLUSION,
    VERIFY_ROUNDS,
    VERIFY_SUBSETS,
    method_columns,
)
from headprune.table_checks import check_scores

HELP = "ablation ranking from a cheap estimate: its top heads exact, the rest bounded"
PARAMS = {"verified": "verify", "subsets": "bound_subsets"}  # Verification's fields, as this command's options


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_workers_arg(p)
    add_data_args(p, "validation")
    add_method_arg(p, "the ablation to verify (ctx_stream: each KV head made streaming, verified per KV head)",
                   VERIFIABLE)
    p.add_argument("--estimate", default=None,
                   help="the estimate that ranks every head: a column of --scores, or computed here (default taylor, "
                        "the first-order estimate of zero ablation, one forward and backward per batch; for "
                        "ctx_stream ctx_gate, its first-order estimate)")
    add_streaming_args(p)
    add_scores_arg(p, "scores table (.csv/.parquet) from headprune score holding --estimate")
    add_verification_args(p, "ablated", VERIFY_SUBSETS)
    p.add_argument("--inclusion", type=float, default=VERIFY_INCLUSION,
                   help="probability of each unverified head to be in a subset (small: ablating many heads at once "
                        "is not additive)")
    p.add_argument("--rounds", type=int, default=VERIFY_ROUNDS,
                   help="rounds of --verify heads ablated exactly: the estimate's top, then those the bound leaves "
                        "most open (the largest upper bounds)")
    p.add_argument("--exact-sweep", choices=("auto", "never"), default="auto",
                   help="auto: where the cost model says ablating every head exactly costs less than verifying "
                        "(few heads), ablate every head instead (the same table, every head verified, bound 0); "
                        "never: always verify")
    add_seed_arg(p, "seed of the subsets")
    add_ablation_rows_arg(p)
    add_run_flags(p, "output table, .csv or .parquet (its summary is written beside it as .json)")
    add_json_arg(p, "the JSON summary")


def _estimate_scores(args: argparse.Namespace):
    """The scores table holding ``--estimate`` (None: the estimate is computed here, and must then be cheap), checked
    before the model loads; ``--estimate`` resolved to the method's default where not given."""
    from headprune.io.work.files import read_scores

    args.estimate = args.estimate or VERIFY_ESTIMATES.get(args.method, "taylor")
    scores = read_scores(args.scores) if args.scores is not None else None
    if scores is not None and args.estimate not in scores.columns:
        raise HeadpruneError(f"{args.scores} has no column {args.estimate!r}; score it first or give --estimate")
    if scores is not None and args.estimate not in method_columns(scores):
        raise HeadpruneError(f"--estimate {args.estimate!r} is not a score column of {args.scores}; its scores are "
                             f"{', '.join(method_columns(scores)) or 'none'}")
    if scores is None and (args.estimate not in METHOD_SPECS or not METHOD_SPECS[args.estimate].cheap):
        raise HeadpruneError(f"--estimate {args.estimate!r}: computed here it must be a cheap score ("
                             f"{', '.join(m for m, spec in METHOD_SPECS.items() if spec.cheap)}); an "
                             "ablation score is what verify avoids computing for every head")
    return None if scores is None else check_scores(scores)  # numbers, finite, one row per head


def _estimate(args: argparse.Namespace, model, ids, windowing, scores, progress):
    """``--estimate`` of every unit verified (:func:`~headprune.scoring.verified.verify_units`) as a Series named
    after it: read from ``scores`` or computed on ``ids``, one value per query head, then per KV head for
    ctx_stream (:func:`~headprune.scoring.verified.unit_values`)."""
    import pandas as pd

    from headprune.scoring import ScoringOptions, score_heads
    from headprune.scoring.verified import unit_values

    if scores is not None:
        per_head = scores.set_index(["layer", "head"])[args.estimate].loc[model.head_ids].to_numpy(dtype=float)
    else:
        options = ScoringOptions(bootstrap=0, stream_sink=args.sink, stream_recent=args.window)
        scored = score_heads(model, ids, [args.estimate], windowing=windowing, options=options, progress=progress,
                             show_progress=not args.quiet)
        per_head = scored.table[args.estimate].to_numpy(dtype=float)
    return pd.Series(unit_values(model, args.method, per_head, args.estimate), name=args.estimate)


def run(args: argparse.Namespace) -> None:
    from headprune.cli.sweeps import finish_ranking, sweep_progress, sweep_settings, table_output
    from headprune.cost import Pace, duration, estimate_verify, verify_fe
    from headprune.scoring.verified import Verification, exact_ranking, verify_ranking, verify_units

    out = table_output(args)
    scores = _estimate_scores(args)
    verification = Verification(args.verify, args.bound_subsets, args.inclusion, seed=args.seed,
                                rows=args.ablation_rows, rounds=args.rounds, stream=(args.sink, args.window))
    verification.check()  # before the model loads
    model = load_from_args(args)
    w = windowing_from_args(args, model)
    k = verification.check(len(verify_units(model, args.method)))
    ids = data_from_args(args, model)
    if scores is not None:
        from headprune.pruning.selection import check_scores_match

        check_scores_match(scores, model, args.scores)
    fe = verify_fe(model, w.seq_len, k, args.bound_subsets, args.estimate if scores is None else None,
                   args.rounds, args.method)
    verifying, sweep = estimate_verify(model, w.seq_len, len(ids), Pace.here(model, w.seq_len), fe)
    exact = args.exact_sweep == "auto" and sweep.total <= verifying.total  # few heads: the sweep is the cheaper
    if not args.json:
        print(data_line("data", args.data, args.split, ids, w))
        if exact:
            print(f"the exact sweep of every head costs less here than verifying (about {duration(sweep.total)} "
                  f"against {duration(verifying.total)}): ablating every head exactly (--exact-sweep never verifies)")
        print((sweep if exact else verifying).line())
    settings = sweep_settings(args, model, ids, w, "verify", method=args.method, estimate=args.estimate,
                              scores=None if scores is None else scores[args.estimate].tolist(), verify=k,
                              subsets=args.bound_subsets, inclusion=args.inclusion, seed=args.seed,
                              rounds=args.rounds, stream=[args.sink, args.window] if args.method == "ctx_stream"
                              else None)
    progress = sweep_progress(args, out, settings)
    estimate = _estimate(args, model, ids, w, scores, progress)
    rank = exact_ranking if exact else verify_ranking
    result = rank(model, ids, estimate, args.method, verification=replace(verification, verified=k), windowing=w,
                  progress=progress, show_progress=not args.quiet)
    if not finish_ranking(progress, result, out, args.json):
        return
    _print_result(args, result, k, exact, out)


def _print_result(args: argparse.Namespace, result, k: int, exact: bool, out) -> None:
    """The claimed top K with their exact values, then (when verified) the bound and the certified recall."""
    units, done = ("KV heads", "made streaming") if METHOD_SPECS[args.method].kv_sweep else ("heads", "ablated")
    top = result.table[result.table["top"]].sort_values("exact", ascending=False, key=abs)
    values = ", ".join(f"{h} {v:+.4f}" for h, v in zip(top["head_id"], top["exact"]))
    if exact:
        print(f"{done} all {len(result.table)} {units} exactly; the top {k} by exact {args.method} (nats/token): "
              f"{values}; no unit left unverified (bound 0, recall 1) -> {out}")
        return
    rounds = "" if args.rounds == 1 else f" and {k * (args.rounds - 1)} more with the largest bounds"
    print(f"verified the {k} {units} {args.estimate} ranks first{rounds}; the top {k} by exact {args.method} "
          f"(nats/token): {values}")
    print(f"bound: no unverified unit changes the NLL by more than {result.bound:.4f} nats/token "
          f"({result.level:.0%} confidence if effects add up, {result.subsets} subsets; worst {result.worst})")
    print(f"recall of the true top {k} by |{args.method}|: at least {result.recall_lower:.2f} "
          f"(unverified {units} that could still outrank the top's smallest, {result.threshold:.4f}: "
          f"{result.unresolved}) -> {out}")
