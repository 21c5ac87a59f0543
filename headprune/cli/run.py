"""``headprune run``: the whole analysis: ledger, scores, pruning curves, report."""

from __future__ import annotations

import argparse
import sys

from headprune.cli.options import (
    add_bootstrap_arg,
    add_data_args,
    add_fraction_args,
    add_gate_steps_arg,
    add_methods_arg,
    add_model_args,
    add_run_flags,
    add_score_data_arg,
    add_seed_arg,
    add_workers_arg,
)
from headprune.errors import HeadpruneError
from headprune.schema import DEFAULT_MAX_TOKENS, METHODS

HELP = 'the whole analysis: ledger, scores, pruning curves, report'


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_workers_arg(p)
    add_data_args(p, "test", budget=True)
    p.set_defaults(split=None)  # run scores on --score-data's validation split and measures on --data's test split
    add_score_data_arg(p, "scoring")
    add_fraction_args(p)
    add_seed_arg(p, "seed of the random baseline and the bootstrap")
    add_bootstrap_arg(p)
    p.add_argument("--optimal", action="store_true",
                   help="also score abl_opt (optimal ablation) and add the best method's optimal-compensated curve "
                        "(the fit costs about 50 abl_mean sweeps: minutes more on a CPU)")
    p.add_argument("--learn-gates", action="store_true",
                   help="also curve hard-concrete gates learned for each fraction (learn-gates; adds minutes)")
    add_gate_steps_arg(p, "training steps per fraction with --learn-gates")
    add_methods_arg(p, "all, or a comma-separated list of the methods to score (those that "
                        f"rank heads also get curves; e.g. leave out ablation on gpt2-xl): {', '.join(METHODS)}")
    p.add_argument("--patch-task", default="auto",
                   help="built-in task of the report's patching section: brackets (closing a call's bracket, which "
                        "the shipped model does), induction, ioi (GPT-2's tokenizer), none, or auto (brackets where "
                        "the model's tokenizer builds its pairs, else induction; checked before the scoring)")
    p.add_argument("--patch-pairs", type=int, default=32, help="prompt pairs of that task")
    add_run_flags(p, "report directory", "headprune-report")


def run(args: argparse.Namespace) -> None:
    import math

    from headprune.pipeline import run_analysis
    from headprune.schema import parse_fractions
    from headprune.stages.settings import RunSettings

    if args.gate_steps < 1:
        raise HeadpruneError(f"--gate-steps {args.gate_steps} must be at least 1")
    settings = RunSettings(model=args.model, data=args.data, score_data=args.score_data, out=args.out,
                           device=args.device, dtype=args.dtype, fold_value_bias=args.fold_value_bias,
                           batch_size=args.batch_size, seq_len=args.seq_len,
                           stride=args.stride, budget=args.max_tokens is None,
                           max_tokens=DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens or None,
                           fractions=tuple(parse_fractions(args.fractions)), seeds=args.seeds, seed=args.seed,
                           bootstrap=args.bootstrap, optimal=args.optimal, learn_gates=args.learn_gates,
                           gate_steps=args.gate_steps, methods=(args.methods,), patch_task=args.patch_task,
                           patch_pairs=args.patch_pairs)
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    result = run_analysis(settings, overwrite=args.overwrite, quiet=args.quiet, log=log)
    if result is None:  # a torchrun worker other than rank 0
        return
    b = result["baseline"]
    bpb = b["nll"] * b["tokens"] / (math.log(2) * b["bytes"]) if b.get("bytes") else math.nan
    print(f"baseline: perplexity {b['ppl']:.3f}, {bpb:.4f} bits/byte (NLL {b['nll']:.4f} nats/token, "
          f"{b['tokens']:,} tokens)")
    choice = result["choice"]
    how = ("" if not choice.held_out else " (chosen alike on the even and the odd test windows)" if choice.agree
           else f" (chosen on the even test windows; the odd ones chose {choice.on_odd})")
    print(f"best method: {result['best']}{how}")
    print(result["table"].to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(f"report: {result['report']}  ({result['seconds']:.0f} s)")
