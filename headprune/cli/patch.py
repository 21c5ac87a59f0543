"""``headprune patch``: which heads carry a behaviour, by activation patching on clean/corrupt prompt pairs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from headprune.cli.common import load_from_args
from headprune.cli.options import (
    add_ablation_rows_arg,
    add_bootstrap_arg,
    add_json_arg,
    add_model_args,
    add_run_flags,
    add_seed_arg,
    add_verification_args,
)
from headprune.errors import HeadpruneError
from headprune.schema import DEFAULT_BOUND_SUBSETS

HELP = "which heads carry a behaviour: activation patching and AtP*"


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
    p.add_argument("--by-position", action="store_true",
                   help="patch each activation at each position alone: a [head x position] table (pairs of one "
                        "length; exact patching only)")
    add_verification_args(p, "patched", DEFAULT_BOUND_SUBSETS, "; 0: no bound")
    add_ablation_rows_arg(p, "patched copies x pairs", cpu=16)
    add_bootstrap_arg(p)
    add_run_flags(p, "output table, .csv or .parquet; OUT_agreement, OUT_missed and OUT.json are written beside it "
                     "(name it DIR/patch.csv and headprune report --scores DIR/scores.csv shows the study)")
    add_json_arg(p, "a JSON summary (metric gap, top heads, agreement)")


def _list(spec: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in spec.split(",") if s.strip() and s.strip() != "none")


def _print(study, out: Path, written: dict[str, Path]) -> None:
    summary = study.summary
    print(f"{summary['pairs']} pairs, {summary['metric']}: clean {summary['metric_clean']:.3f}, corrupt "
          f"{summary['metric_corrupt']:.3f} (gap {summary['gap']:.3f})")
    if summary["top_heads"]:
        print(f"top heads by {summary['ranked_by']} (normalised effect): {', '.join(summary['top_heads'])}")
    if study.agreement is not None:
        print(study.agreement.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for b in summary["bounds"]:
        check = (f"; exact patching's largest among them: {b['largest_exact_unverified']:.3f}"
                 if b["largest_exact_unverified"] is not None else "")
        print(f"{b['method']}: after its top {len(b['verified'])} heads, no other head moves the metric by more than "
              f"{b['bound']:.3f} (normalised, {b['level']:.0%}, {b['subsets']} subsets; largest: {b['worst']}){check}")
    for what, path in written.items():
        print(f"{what} -> {path}")
    print(f"-> {out}")


def run(args: argparse.Namespace) -> None:
    from headprune.cli.sweeps import sweep_progress, table_output
    from headprune.io.read.fingerprint import model_fingerprint
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.io.work.distributed import is_main
    from headprune.patching import read_pairs, task_pairs
    from headprune.patching.study import StudyOptions
    from headprune.report.patching_section import patching_paths, write_patching_files
    from headprune.stages.patching import patch_stage

    out = table_output(args)
    options = StudyOptions(metric=args.metric, direction=args.direction, activations=_list(args.activations),
                           approximations=_list(args.approximations), by_position=args.by_position,
                           bootstrap=args.bootstrap, seed=args.seed, bound_subsets=args.bound_subsets,
                           verify=args.verify, rows=args.ablation_rows).check()
    if args.n_pairs < 2:
        raise HeadpruneError(f"--n-pairs {args.n_pairs} must be at least 2")
    model = load_from_args(args)
    if args.pairs is not None:
        pairs = read_pairs(args.pairs, model_tokenizer(model), model.cfg.vocab_size)
    else:
        pairs = task_pairs(args.task, model, n_pairs=args.n_pairs, seed=args.seed)
    settings = {"command": "patch", "model": model_fingerprint(model), "dtype": str(model.dtype),
                "pairs": args.pairs and str(Path(args.pairs).resolve()), "task": args.task, "n_pairs": len(pairs),
                "pair_tokens": [pairs.clean.tolist(), pairs.corrupt.tolist()], "seed": args.seed,
                "metric": args.metric, "direction": args.direction, "activations": list(options.activations),
                "by_position": args.by_position, "fold_value_bias": args.fold_value_bias}
    if not (args.quiet or args.json):
        from headprune.cost import Pace, estimate_patching

        prompt_len = pairs.clean.shape[1]
        pace = Pace.here(model, prompt_len, len(pairs))  # the pairs run batched
        print(estimate_patching(model, len(pairs), prompt_len, len(options.activations), len(options.approximations),
                                options.bound_subsets, pace, args.by_position).line())
    progress = sweep_progress(args, out, settings)
    study, report = patch_stage(model, pairs, options, task=args.task, progress=progress,
                                quiet=getattr(args, "quiet", False), by_position=args.by_position)
    if is_main():  # the files `headprune report` reads beside its --scores where out is DIR/patch.csv
        write_patching_files(out, report)
    progress.remove()
    if not is_main():
        return
    written = {k: path for k, path in patching_paths(out).items() if k != "table" and path.is_file()}
    if args.json:
        print(json.dumps({"out": str(out), **study.summary,
                          "agreement": study.agreement.to_dict("records") if study.agreement is not None else None}))
        return
    _print(study, out, written)
