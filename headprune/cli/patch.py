"""``headprune patch``: which heads carry a behaviour, by activation patching on clean/corrupt prompt pairs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from headprune.cli.common import load_from_args
from headprune.cli.options import add_bootstrap_arg, add_model_args, add_run_flags, add_seed_arg
from headprune.errors import HeadpruneError

HELP = "which heads carry a behaviour: activation patching and AtP*"
APPROXIMATIONS = ("atp", "atp_star", "atp_qkfix")  # atp_qkfix: q and k only


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--pairs", help='JSONL prompt pairs: {"clean_ids", "corrupt_ids", "answer_id", "wrong_id"} or '
                                        '{"clean", "corrupt", "answer", "wrong"} per line')
    source.add_argument("--task", help="a built-in task: induction, ioi (GPT-2's tokenizer) or brackets (the shipped "
                                       "model's: closing a call's bracket)")
    p.add_argument("--n-pairs", type=int, default=32, help="pairs of a built-in task")
    add_seed_arg(p, "seed of a built-in task's pairs and of the bootstrap")
    p.add_argument("--metric", default="logit_diff", help="logit_diff (answer - wrong), logprob (of the answer) or kl "
                                                          "(to the clean distribution)")
    p.add_argument("--direction", default="denoise", help="denoise: the corrupt run with one head's clean activation; "
                                                          "noise: the clean run with its corrupt activation")
    p.add_argument("--activations", default="z", help="comma-separated activations to patch exactly: z, q, k, v, "
                                                      "pattern")
    p.add_argument("--approximations", default="atp,atp_star",
                   help="attribution patching to compare with exact patching: atp, atp_star (GradDrop; with the "
                        "QK-fix for q and k), atp_qkfix (the QK-fix alone: q and k only), or none; z always, q and k "
                        "when in --activations")
    p.add_argument("--by-position", action="store_true", help="patch z at each position alone: a [head x position] "
                                                              "table (pairs of one length)")
    p.add_argument("--ablation-rows", type=int, default=None,
                   help="patched copies x pairs per forward (default 16 on the CPU, 64 on a GPU)")
    add_bootstrap_arg(p)
    add_run_flags(p, "output table, .csv or .parquet (the agreement table is written beside it)")
    p.add_argument("--json", action="store_true", help="print a JSON summary (metric gap, top heads, agreement)")


def _list(spec: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [s.strip() for s in spec.split(",") if s.strip() and s.strip() != "none"]
    if bad := [s for s in items if s not in allowed]:
        raise HeadpruneError(f"{flag} {bad[0]!r} is not one of {', '.join(allowed)}")
    return items


def run(args: argparse.Namespace) -> None:
    import pandas as pd

    from headprune.cli.sweeps import finish_sweep, sweep_progress, table_output
    from headprune.io.files import write_table
    from headprune.io.fingerprint import model_fingerprint
    from headprune.io.tokenizer import model_tokenizer
    from headprune.patching import (
        ACTIVATIONS,
        DIRECTIONS,
        METRICS,
        agreement,
        atp_qk,
        atp_qkfix,
        atp_star_qk,
        atp_star_z,
        atp_z,
        patch,
        patch_table,
        position_table,
        read_pairs,
        run_pairs,
        task_pairs,
    )

    out = table_output(args)
    activations = _list(args.activations, ACTIVATIONS, "--activations")
    approximations = _list(args.approximations, APPROXIMATIONS, "--approximations")
    if args.metric not in METRICS:
        raise HeadpruneError(f"--metric {args.metric!r} is not one of {', '.join(METRICS)}")
    if args.direction not in DIRECTIONS:
        raise HeadpruneError(f"--direction {args.direction!r} is not one of {', '.join(DIRECTIONS)}")
    if args.n_pairs < 2:
        raise HeadpruneError(f"--n-pairs {args.n_pairs} must be at least 2")
    if "atp_qkfix" in approximations and not {"q", "k"} & set(activations):
        raise HeadpruneError("--approximations atp_qkfix needs q or k in --activations")
    if not activations and not approximations:
        raise HeadpruneError("nothing to compute: give --activations or --approximations")
    model = load_from_args(args)
    if args.pairs is not None:
        pairs = read_pairs(args.pairs, model_tokenizer(model), model.cfg.vocab_size)
    else:
        pairs = task_pairs(args.task, model, n_pairs=args.n_pairs, seed=args.seed)
    settings = {"command": "patch", "model": model_fingerprint(model), "dtype": str(model.dtype),
                "pairs": args.pairs and str(Path(args.pairs).resolve()), "task": args.task, "n_pairs": len(pairs),
                "pair_tokens": [pairs.clean.tolist(), pairs.corrupt.tolist()], "seed": args.seed,
                "metric": args.metric, "direction": args.direction, "activations": activations,
                "by_position": args.by_position, "fold_value_bias": args.fold_value_bias}
    progress = sweep_progress(args, out, settings)
    runs = run_pairs(model, pairs, args.metric, args.direction)
    exact = {a: patch(model, pairs, a, args.metric, args.direction, args.by_position and a == "z",
                      args.ablation_rows, progress=progress, runs=runs) for a in activations}
    approx: dict[str, list] = {"z": []}  # by the activation each approximates
    if "atp" in approximations:
        approx["z"].append(atp_z(model, pairs, args.metric, args.direction, runs=runs))
    if "atp_star" in approximations:
        approx["z"].append(atp_star_z(model, pairs, args.metric, args.direction, runs=runs))
    qk_methods = {"atp": atp_qk, "atp_star": atp_star_qk, "atp_qkfix": atp_qkfix}
    for a in (a for a in ("q", "k") if a in exact):
        approx[a] = [qk_methods[name](model, pairs, a, args.metric, args.direction, runs=runs)
                     for name in approximations]
    if args.by_position and "z" in exact:
        table = position_table(model, exact["z"])
    else:
        table = patch_table(model, [*exact.values(), *(r for rs in approx.values() for r in rs)], args.bootstrap,
                            args.seed)
    agree_parts = [agreement(exact[a], rs, bootstrap=args.bootstrap, seed=args.seed) for a, rs in approx.items()
                   if a in exact and rs and not args.by_position]
    agree = pd.concat(agree_parts, ignore_index=True) if agree_parts else None
    gap = float((runs.m_clean - runs.m_corrupt).mean())
    if not finish_sweep(progress, table, out):
        return
    agreement_out = out.with_name(out.stem + ".agreement" + out.suffix)
    if agree is not None:
        write_table(agree, agreement_out)
    main = next(iter(exact.values()), None) or approx["z"][0]
    if args.by_position:
        top_heads: list[str] = []
    else:
        top_heads = table.sort_values(main.method, ascending=False, key=abs)["head_id"].head(5).tolist()
    summary = {"out": str(out), "pairs": len(pairs), "metric": args.metric, "direction": args.direction,
               "metric_clean": float(runs.m_clean.mean()), "metric_corrupt": float(runs.m_corrupt.mean()),
               "gap": gap, "top_heads": top_heads,
               "agreement": agree.to_dict("records") if agree is not None else None}
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{len(pairs)} pairs, {args.metric}: clean {summary['metric_clean']:.3f}, corrupt "
          f"{summary['metric_corrupt']:.3f} (gap {gap:.3f})")
    if top_heads:
        print(f"top heads by {main.method} (normalised effect): {', '.join(top_heads)}")
    if agree is not None:
        print(agree.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(f"agreement -> {agreement_out}")
    print(f"-> {out}")
