"""The ``headprune`` command line. User errors: one line on stderr, exit status 2, no traceback.

Every option is declared once, in an ``add_*`` helper of :mod:`.cli_options`; library
errors name Python parameters and :data:`FLAGS` shows them as options. Commands import torch only when
they run (``headprune report`` never does).
"""

from __future__ import annotations

import argparse
import math
import sys
from functools import partial

from . import __version__
from .cli_options import (
    CORPUS_FORMS,
    DESCRIPTION,
    EPILOG,
    HelpFormatter,
    add_anatomy_args,
    add_bootstrap_arg,
    add_data_args,
    add_finetune_args,
    add_fraction_args,
    add_gate_lr_arg,
    add_model_args,
    add_run_flags,
    add_score_data_arg,
    add_seed_arg,
    add_selection_args,
    check_counts,
)
from .errors import HeadpruneError, os_error_line
from .schema import DEFAULT_MAX_TOKENS, IMPORTANCE_METHODS, METHODS, RANKABLE_METHODS, RUN_FRACTIONS

COMMANDS: dict[str, tuple] = {}  # name -> (run(args), configure(parser), help)
FLAGS = {"seq_len": "--seq-len", "stride": "--stride", "batch_size": "--batch-size", "steps": "--iterative",
         "fractions": "--fractions", "max_tokens": "--max-tokens", "seeds": "--seeds", "ablation_rows": "--ablation-rows",
         "count": "--count", "seed": "--seed", "batch": "--batch-size", "seq": "--seq-len", "methods": "--methods", "bootstrap": "--bootstrap",
         "probe_length": "--probe-length", "probe_count": "--probe-count", "rows": "--rows", "train_steps": "--steps",
         "lr": "--lr", "warmup": "--warmup", "distill_weight": "--distill-weight", "temperature": "--temperature",
         "checkpoint_every": "--checkpoint-every", "max_train_tokens": "--max-train-tokens", "recover": "--recover",
         "sparsity": "--sparsity"}


def command(name: str, help: str, configure):
    """Register ``run(args)`` as subcommand ``name``; ``configure(parser)`` adds its options."""

    def wrap(run):
        COMMANDS[name] = (run, configure, help)
        return run

    return wrap


def load_from_args(args):
    from .loading import load_model

    return load_model(args.model, device=args.device, dtype=args.dtype, fold_value_bias=args.fold_value_bias)


def windowing_from_args(args, model):
    """The ``--seq-len/--stride/--batch-size`` of ``args``, resolved against ``model``."""
    from .perplexity import Windowing

    return Windowing.resolve(model.cfg.n_positions, args.seq_len, args.stride, args.batch_size)


def data_from_args(args, model, data: str | None = None, split: str | None = None):
    """Token ids (1-D) of ``data`` (default ``--data``, its ``--split``) for ``model``, cut to ``--max-tokens``."""
    from .corpus import corpus_ids
    from .loading import model_tokenizer

    return corpus_ids(data or args.data, split or args.split, model_tokenizer(model), args.max_tokens or None)


def fill_source(args, score_ids) -> str:
    """Where compensation fills came from, said in the outputs: ``--score-data``'s validation split and its
    token count (without ``--score-data``: the default corpus' scoring split), or "" without compensation."""
    if score_ids is None:
        return ""
    given = "" if args.score_data != "default" else "; no --score-data given: the scoring split"
    return f"{args.score_data} (validation split), {len(score_ids):,} tokens{given}"


# ---------------------------------------------------------------- info, eval


def _configure_info(p):
    add_model_args(p)
    p.add_argument("--batch-size", type=int, default=1, dest="batch", metavar="B", help="batch size B of the shape trace")
    p.add_argument("--seq-len", type=int, default=8, dest="seq", metavar="T", help="sequence length T of the shape trace")
    for old, dest in (("--batch", "batch"), ("--seq", "seq")):  # the first spellings, still accepted
        p.add_argument(old, type=int, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


@command("info", "config, parameter ledger and attention shape trace", _configure_info)
def cmd_info(args) -> None:
    from .ledger import format_info

    model = load_from_args(args)
    if args.seq > model.cfg.n_positions or min(args.seq, args.batch) < 1:
        raise HeadpruneError(f"--batch-size and --seq-len must be positive and --seq-len <= n_positions {model.cfg.n_positions}")
    print(format_info(model, args.batch, args.seq))


def _configure_eval(p):
    add_model_args(p)
    add_data_args(p, "test")
    p.add_argument("--json", action="store_true", help="print one JSON object: the header's fields, tokens, windows, "
                                                       "nll, nll_se, ppl, ppl_se, bytes, bits_per_byte")


@command("eval", "sliding-window perplexity of a model on a corpus", _configure_eval)
def cmd_eval(args) -> None:
    import json
    import math

    from .loading import model_tokenizer
    from .perplexity import evaluate, scored_bytes

    model = load_from_args(args)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    header = {"model": args.model, "data": args.data, "split": args.split if args.data == "default" else None,
              "max_tokens": args.max_tokens, "seq_len": w.seq_len, "stride": w.stride}
    if not args.json:
        split = f" ({header['split']} split)" if header["split"] else ""
        print(f"model: {args.model}\ndata: {args.data}{split}, {len(ids):,} tokens\n"
              f"windows: seq_len {w.seq_len}, stride {w.stride}")
    result = evaluate(model, ids, w.seq_len, w.stride, w.batch_size, progress=not args.json)
    n_bytes = scored_bytes(model_tokenizer(model), ids, w)
    bpb = result.nll * result.tokens / (math.log(2) * n_bytes) if n_bytes else math.nan
    if args.json:
        print(json.dumps(header | {"tokens": result.tokens, "windows": result.windows, "nll": result.nll,
                                   "nll_se": _json_number(result.nll_se), "ppl": result.ppl,
                                   "ppl_se": _json_number(result.ppl_se), "bytes": n_bytes,
                                   "bits_per_byte": _json_number(bpb)}))
        return
    se = "" if math.isnan(result.nll_se) else f" ± {result.ppl_se:.4f} (standard error over {result.windows} windows)"
    nll_se = "" if math.isnan(result.nll_se) else f" ± {result.nll_se:.6f}"
    print(f"tokens scored: {result.tokens:,} ({n_bytes:,} bytes)\nperplexity: {result.ppl:.4f}{se}\n"
          f"mean NLL: {result.nll:.6f}{nll_se} nats/token\nbits per byte: {bpb:.4f}")


def _json_number(x: float) -> float | None:
    """NaN as null: strict JSON has no NaN."""
    import math

    return None if math.isnan(x) else x


# ---------------------------------------------------------------- sweeps: score, curve


def _configure_score(p):
    add_model_args(p)
    add_data_args(p, "validation")
    p.add_argument("--methods", default="all", help=f"all (every method but the slow abl_opt: all,abl_opt adds it), or a "
                                                    f"comma-separated list of: {', '.join(METHODS)}")
    add_run_flags(p, "output table, .csv or .parquet")
    p.add_argument("--ablation-rows", type=int, default=None,
                   help="ablated copies x windows per forward (default 8 on the CPU, 64 on a GPU)")
    add_bootstrap_arg(p)
    add_seed_arg(p, "seed of the bootstrap resampling")
    p.add_argument("--json", action="store_true", help="print a JSON summary (baseline, tokens, seconds per method)")


@command("score", "score heads: weight norms, activations, gradients, ablation", _configure_score)
def cmd_score(args) -> None:
    import json

    from .schema import parse_methods
    from .scoring import score_heads
    from .sweeps import finish_sweep, sweep_progress, sweep_settings, table_output

    out = table_output(args)
    methods = parse_methods(args.methods)
    model = load_from_args(args)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    progress = sweep_progress(args, out, sweep_settings(args, model, ids, w, "score", methods=methods))
    scored = score_heads(model, ids, methods, w, args.ablation_rows, progress, show_progress=not args.quiet,
                         bootstrap=args.bootstrap, seed=args.seed)
    if not finish_sweep(progress, scored.table, out):
        return
    summary = {"out": str(out), "heads": len(scored.table), "fold_value_bias": args.fold_value_bias,
               "seconds": scored.seconds}
    summary |= {"baseline": scored.baseline} if scored.baseline else {}
    print(json.dumps(summary) if args.json else f"scored {len(scored.table)} heads with {', '.join(methods)} -> {out}")


def _configure_curve(p):
    add_model_args(p)
    add_data_args(p, "test")
    p.add_argument("--scores", required=True, help="scores table (.csv/.parquet) from headprune score")
    p.add_argument("--methods", default="all", help="scores columns to rank by: all (every importance column of --scores) "
                                                    f"or a comma-separated list of: {', '.join(IMPORTANCE_METHODS)}, "
                                                    "random; gate learns hard-concrete gates for each fraction (on "
                                                    "--score-data, --gate-steps steps each)")
    add_fraction_args(p)
    p.add_argument("--compensate", choices=["none", "mean", "optimal"], default="none",
                   help="mean / optimal: also measure curves with the pruned heads' mean outputs / the constants "
                        "optimal for ablating each pruned set together (Li & Janson 2024) folded into b_O, both from "
                        "--score-data")
    add_selection_args(p)
    add_bootstrap_arg(p)
    p.add_argument("--recover", type=int, default=0, metavar="STEPS",
                   help="also fine-tune every pruned point STEPS steps (headprune finetune's recipe) and add the "
                        "recovered points (column recover_steps; random left out)")
    p.add_argument("--train-data", default="default", help="corpus --recover trains on, its train split")
    p.add_argument("--gate-steps", type=int, default=200, help="training steps per fraction of --methods gate")
    add_gate_lr_arg(p)
    add_run_flags(p, "output table, .csv or .parquet")


@command("curve", "perplexity as heads are pruned, per method, against random", _configure_curve)
def cmd_curve(args) -> None:
    from .corpus import token_digest
    from .curves import pruning_curves
    from .gates import GATE, gate_head_sets
    from .outputs import read_scores
    from .recovery import curve_train_ids, recovered_curves
    from .schema import IMPORTANCE_METHODS, RANDOM, parse_fractions
    from .scoring import head_means, joint_constants
    from .selection import check_scores_match
    from .sweeps import finish_sweep, sweep_progress, sweep_settings, table_output

    check_gate_args(args, "--gate-steps", "--gate-lr")
    out = table_output(args)
    fractions = parse_fractions(args.fractions)
    model = load_from_args(args)
    scores = read_scores(args.scores)
    check_scores_match(scores, model, args.scores)
    available = [m for m in IMPORTANCE_METHODS if m in scores.columns]
    methods = available if args.methods == "all" else [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in (RANDOM, GATE) and m not in available:
            raise HeadpruneError(f"method {m!r} is not an importance column of {args.scores}; use "
                                 f"{', '.join([*available, GATE, RANDOM])}")
    methods = [m for m in methods if m != RANDOM]
    learned = GATE in methods
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    compensate = args.compensate != "none"
    needs_score_ids = compensate or learned
    score_ids = data_from_args(args, model, args.score_data, "validation") if needs_score_ids else None
    variants = [(m, "none") for m in methods] + [(RANDOM, "none")]
    variants += [(m, args.compensate) for m in methods] if compensate else []
    train_ids = curve_train_ids(args, model, ids) if args.recover else None
    settings = sweep_settings(args, model, ids, w, "curve", scores=scores.to_json(), variants=variants,
                              recover=args.recover, train_tokens=token_digest(train_ids) if train_ids is not None else None,
                              fractions=fractions, seeds=args.seeds, seed=args.seed, per_layer=args.per_layer,
                              normalize=args.normalize, standardize=args.standardize,
                              score_data=args.score_data if needs_score_ids else None,
                              score_tokens=token_digest(score_ids) if score_ids is not None else None,
                              gate_steps=args.gate_steps if learned else None, gate_lr=args.gate_lr if learned else None)
    progress = sweep_progress(args, out, settings)
    means = optimal = None
    if score_ids is not None and compensate:
        means = head_means(model, score_ids, w, progress, not args.quiet)  # resumable; optimal fits start here
    if score_ids is not None and means is not None and args.compensate == "optimal":  # fitted per pruned set
        optimal = partial(joint_constants, model, score_ids, windowing=w, means=means, show_progress=False)
    fill_data = fill_source(args, score_ids)
    head_sets = None
    if learned:  # one set of gates learned per fraction, each training resumable from its checkpoints
        assert score_ids is not None
        head_sets = gate_head_sets(model, w.batches(score_ids), fractions, args.gate_steps, args.gate_lr, args.seed,
                                   progress, show_progress=not args.quiet)
    curves = pruning_curves(model, ids, scores, variants, fractions, w, args.seeds, means, args.per_layer,
                            args.normalize, args.standardize, args.seed, progress, show_progress=not args.quiet,
                            optimal=optimal, fill_data=fill_data, bootstrap=args.bootstrap, head_sets=head_sets)
    if args.recover:
        import pandas as pd

        recovered = recovered_curves(model, train_ids, args.recover, not args.quiet, ids=ids, scores=scores,
                                     variants=variants, fractions=fractions, windowing=w, seeds=args.seeds, means=means,
                                     optimal=optimal, per_layer=args.per_layer, normalize=args.normalize, standardize=args.standardize,
                                     seed=args.seed, progress=progress)
        curves = pd.concat([curves.assign(recover_steps=0), recovered], ignore_index=True)
    if not finish_sweep(progress, curves, out):
        return
    print(curves.drop(columns="fill_data").to_string(index=False, float_format="%.4f"))
    if fill_data:
        print(f"{args.compensate} compensation: fills fitted on {fill_data}")
    print(f"-> {out}")


# ---------------------------------------------------------------- learn-gates


def check_gate_args(args, steps_flag: str, lr_flag: str) -> None:
    """``--sparsity`` (where the command has it) in [0, 1] and the gate steps >= 1, before any work."""
    sparsity = getattr(args, "sparsity", None)
    if sparsity is not None and not 0.0 <= sparsity <= 1.0:  # NaN fails too
        raise HeadpruneError(f"--sparsity {sparsity} must lie in [0, 1]")
    if args.gate_steps < 1:
        raise HeadpruneError(f"{steps_flag} {args.gate_steps} must be at least 1")
    if not (math.isfinite(args.gate_lr) and args.gate_lr > 0):
        raise HeadpruneError(f"{lr_flag} {args.gate_lr} must be a positive number")


def _configure_learn_gates(p):
    add_model_args(p)
    add_data_args(p, "validation")
    p.add_argument("--sparsity", type=float, required=True,
                   help="target share of heads to close, in [0, 1]: exactly round(F x heads) close")
    p.add_argument("--steps", type=int, required=True, dest="gate_steps", help="training steps (one batch each)")
    add_gate_lr_arg(p, "--lr")
    add_seed_arg(p, "seed of the gates' noise")
    add_run_flags(p, "output scores table with a gate column, .csv or .parquet")
    p.add_argument("--json", action="store_true", help="print a JSON summary (closed heads, lambdas, seconds)")


@command("learn-gates", "learn which heads to keep jointly (hard-concrete gates)",
         _configure_learn_gates)
def cmd_learn_gates(args) -> None:
    import json
    import time

    from .gates import learn_gates
    from .heads import format_heads
    from .sweeps import finish_sweep, sweep_progress, sweep_settings, table_output

    check_gate_args(args, "--steps", "--lr")
    out = table_output(args)
    model = load_from_args(args)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    settings = sweep_settings(args, model, ids, w, "learn-gates", sparsity=args.sparsity, steps=args.gate_steps,
                              lr=args.gate_lr, seed=args.seed)
    progress = sweep_progress(args, out, settings)
    t0 = time.perf_counter()
    result = learn_gates(model, w.batches(ids), args.gate_steps, sparsity=args.sparsity, lr=args.gate_lr,
                         seed=args.seed, progress=progress, show_progress=not args.quiet)
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


# ---------------------------------------------------------------- prune


def _configure_prune(p):
    add_model_args(p)
    add_data_args(p, "test", data_help="also measure perplexity before and after pruning on this corpus, its test split: "
                                       f"{CORPUS_FORMS} (default: none, not measured)")
    p.add_argument("--heads", help="explicit heads to remove, e.g. L0H1,L3H2")
    p.add_argument("--scores", help="scores table (.csv/.parquet) from headprune score")
    p.add_argument("--method", help=f"scores column to rank by: {', '.join(RANKABLE_METHODS)} or random")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--fraction", type=float, help="fraction of all heads to remove, in [0, 1]")
    amount.add_argument("--count", type=int, help="number of heads to remove")
    p.add_argument("--iterative", type=int, default=1, dest="steps", metavar="STEPS",
                   help="prune in STEPS steps, re-scoring the remaining heads between them")
    add_selection_args(p, "seed of the random selection (--method random)")
    p.add_argument("--compensate", choices=["none", "mean", "optimal"], default="none",
                   help="mean: fold the pruned heads' mean outputs into b_O; optimal: the constants optimal for "
                        "ablating these heads together (Li & Janson 2024), fitted jointly on --score-data")
    p.add_argument("--format", choices=["native", "hf"], default="native",
                   help="native: really smaller tensors; hf: original shapes, zeroed, loads in stock transformers")
    add_run_flags(p, "output directory for the pruned checkpoint",
                  overwrite_help="replace --out even when it is a non-empty folder that is not a headprune export")


@command("prune", "remove heads (listed or by score), export the smaller model", _configure_prune)
def cmd_prune(args) -> None:
    from .checkpoint import export_hf, export_native
    from .heads import format_heads, parse_head_spec
    from .iterative import needs_score_data, prune_iteratively
    from .ledger import pruning_stats
    from .outputs import check_writable, read_scores
    from .perplexity import evaluate
    from .pruning import prune_model
    from .scoring import head_means, joint_constants
    from .selection import check_scores_match

    if (args.heads is None) == (args.scores is None):
        raise HeadpruneError("give either --heads L0H1,... or --scores FILE --method M (--fraction F | --count K)")
    if args.scores is not None and (args.method is None or (args.fraction is None) == (args.count is None)):
        raise HeadpruneError("--scores needs --method and exactly one of --fraction and --count")
    check_writable(args.out)
    model = load_from_args(args)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model) if args.data is not None else None  # checked before anything is written
    compensate = args.compensate
    score_ids = None
    if compensate != "none" or (args.scores is not None and needs_score_data(args.method, args.steps, compensate)):
        score_ids = data_from_args(args, model, args.score_data, "validation")
    if args.heads is not None:
        heads = parse_head_spec(args.heads, model)
        fills = None
        if compensate == "mean" and score_ids is not None:
            fills = head_means(model, score_ids, w, show_progress=not args.quiet)
        elif compensate == "optimal" and score_ids is not None:
            fills = joint_constants(model, score_ids, heads, w, show_progress=not args.quiet)
        pruned = prune_model(model, heads, fills)
    else:
        scores = read_scores(args.scores)
        check_scores_match(scores, model, args.scores)
        pruned, heads = prune_iteratively(model, scores, args.method, args.fraction, args.count, args.steps,
                                          args.per_layer, args.normalize, args.standardize, args.seed, score_ids, w,
                                          compensate, show_progress=not args.quiet)
    stats = pruning_stats(model, pruned, w.seq_len)
    fill_data = fill_source(args, score_ids if compensate != "none" else None)
    meta = {"heads": format_heads(heads), "compensate": args.compensate, "fill_data": fill_data, "stats": stats}
    export = export_native if args.format == "native" else export_hf
    export(pruned, args.out, overwrite=args.overwrite, metadata=meta)
    print(f"heads removed ({len(heads)}): {format_heads(heads) or '(none)'}")
    if fill_data:
        print(f"{args.compensate} compensation: fills fitted on {fill_data}")
    print(f"parameters: {stats['params_before']:,} -> {stats['params_after']:,} (removed {stats['params_removed']:,})")
    print(f"attention FLOPs/token at T={w.seq_len}: {stats['attention_flops_per_token_before']:,} -> "
          f"{stats['attention_flops_per_token_after']:,} (removed {stats['attention_flops_per_token_removed']:,})")
    if ids is not None:
        before = evaluate(model, ids, w.seq_len, w.stride, w.batch_size, progress=not args.quiet)
        after = evaluate(pruned, ids, w.seq_len, w.stride, w.batch_size, progress=not args.quiet)
        print(f"perplexity on {args.data} ({before.tokens:,} tokens): {before.ppl:.3f} -> {after.ppl:.3f} "
              f"(delta NLL {after.nll - before.nll:+.4f} nats/token)")
    print(f"saved {args.format} checkpoint -> {args.out}")


# ---------------------------------------------------------------- finetune


def _configure_finetune(p):
    p.add_argument("pruned", metavar="PRUNED_DIR", help="a pruned export (headprune prune --out), native or hf format")
    p.add_argument("--steps", type=int, required=True, dest="train_steps", metavar="N", help="AdamW steps")
    p.add_argument("--out", required=True, help="output directory for the recovered checkpoint")
    p.add_argument("--format", choices=["native", "hf"], default=None,
                   help="native or hf (default: the format of PRUNED_DIR)")
    add_finetune_args(p)
    p.add_argument("--data", default="default", help=f"evaluation corpus (test split of the default corpus): {CORPUS_FORMS}")
    p.add_argument("--max-tokens", type=int, default=None, help="evaluate on the first K tokens only (default: all)")
    p.add_argument("--device", default="auto", help="where to compute: auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="fp32", help="number format of the weights: fp32, bf16 or fp16")
    p.add_argument("--overwrite", action="store_true", help="discard the checkpoint of a different earlier fine-tune "
                                                            "and replace --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print one JSON object (recipe, perplexity before and after)")


@command("finetune", "recover a pruned model by fine-tuning or distillation", _configure_finetune)
def cmd_finetune(args) -> None:
    import json

    from .recovery import format_summary, run_finetune

    summary = run_finetune(args)
    print(json.dumps(summary) if args.json else format_summary(summary))


# ---------------------------------------------------------------- report, run


def _configure_report(p):
    p.add_argument("--scores", required=True, help="scores table (.csv/.parquet); settings.json and baseline.json beside "
                                                   "it are used when present")
    p.add_argument("--curves", required=True, help="curves table (.csv/.parquet)")
    p.add_argument("--out", required=True, help="report directory")
    p.add_argument("--scale", choices=["value", "rank"], default="value",
                   help="heatmaps and scatters: each method's own values and units, or importance ranks on one shared "
                        "scale (1 = highest score)")


@command("report", "rebuild the report from saved scores and curves tables", _configure_report)
def cmd_report(args) -> None:
    from .report import rebuild_report

    print(f"report -> {rebuild_report(args.scores, args.curves, args.out, args.scale)}")


def _configure_run(p):
    add_model_args(p)
    add_data_args(p, "test", max_tokens=DEFAULT_MAX_TOKENS)
    p.set_defaults(split=None)  # run scores on --score-data's validation split and measures on --data's test split
    add_score_data_arg(p, "scoring")
    add_fraction_args(p, seeds=10, fractions=RUN_FRACTIONS)
    add_seed_arg(p, "seed of the random baseline and the bootstrap")
    add_bootstrap_arg(p)
    p.add_argument("--optimal", action="store_true",
                   help="also score abl_opt (optimal ablation) and add the best method's optimal-compensated curve "
                        "(the fit costs about 50 abl_mean sweeps: minutes more on a CPU)")
    p.add_argument("--learn-gates", action="store_true",
                   help="also curve hard-concrete gates learned for each fraction (learn-gates; adds minutes)")
    p.add_argument("--gate-steps", type=int, default=200, help="training steps per fraction with --learn-gates")
    p.add_argument("--methods", default="all", help="all, or a comma-separated list of the methods to score (those that "
                   f"rank heads also get curves; e.g. leave out ablation on gpt2-xl): {', '.join(METHODS)}")
    add_run_flags(p, "report directory", "headprune-report")


@command("run", "the whole analysis: ledger, scores, pruning curves, report", _configure_run)
def cmd_run(args) -> None:
    import math

    from .pipeline import RunSettings, run_analysis
    from .schema import parse_fractions, parse_methods

    if args.gate_steps < 1:
        raise HeadpruneError(f"--gate-steps {args.gate_steps} must be at least 1")
    settings = RunSettings(model=args.model, data=args.data, score_data=args.score_data, out=args.out,
                           device=args.device, dtype=args.dtype, fold_value_bias=args.fold_value_bias,
                           batch_size=args.batch_size, seq_len=args.seq_len,
                           stride=args.stride, max_tokens=args.max_tokens or None,
                           fractions=tuple(parse_fractions(args.fractions)), seeds=args.seeds, seed=args.seed,
                           bootstrap=args.bootstrap, optimal=args.optimal, learn_gates=args.learn_gates,
                           gate_steps=args.gate_steps, methods=tuple(parse_methods(args.methods)))
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    result = run_analysis(settings, overwrite=args.overwrite, quiet=args.quiet, log=log)
    if result is None:  # a torchrun worker other than rank 0
        return
    b = result["baseline"]
    bpb = b["nll"] * b["tokens"] / (math.log(2) * b["bytes"]) if b.get("bytes") else math.nan
    print(f"baseline: perplexity {b['ppl']:.3f}, {bpb:.4f} bits/byte (NLL {b['nll']:.4f} nats/token, "
          f"{b['tokens']:,} tokens)")
    print(f"best method: {result['best']}")
    print(result["table"].to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(f"report: {result['report']}  ({result['seconds']:.0f} s)")


# ---------------------------------------------------------------- anatomy


def _configure_anatomy(p):
    add_model_args(p)
    add_data_args(p, "validation")
    add_anatomy_args(p)
    p.add_argument("--out", required=True, help="output directory (heads.csv, composition.csv, ...)")


@command("anatomy", "what each head does: roles, composition, logit attribution",
         _configure_anatomy)
def cmd_anatomy(args) -> None:
    from .anatomy.output import run_anatomy
    from .outputs import check_writable

    check_writable(args.out)
    model = load_from_args(args)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    if 2 * args.probe_length > model.cfg.n_positions:
        raise HeadpruneError(f"--probe-length {args.probe_length} is too long: twice it must fit n_positions "
                             f"{model.cfg.n_positions}")
    out, anatomy = run_anatomy(model, ids, w, args.probe_length, args.probe_count, args.seed, args.rows, args.out,
                               {"model": args.model, "data": args.data, "split": args.split})
    top = anatomy.heads.sort_values("induction", ascending=False).head(5)
    print(top[["head_id", "previous_token", "duplicate_token", "induction", "dla", "copying"]].to_string(
        index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"{len(anatomy.heads)} heads, {len(anatomy.composition):,} composition pairs -> {out}")


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headprune", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for name, (_, configure, help) in COMMANDS.items():
        configure(sub.add_parser(name, help=help, description=help, formatter_class=HelpFormatter))
    return parser


def user_message(err: HeadpruneError) -> str:
    """The error's text, with the library parameter it starts with shown as the CLI option."""
    text = str(err)
    if err.param in FLAGS and text.startswith(err.param):
        text = FLAGS[err.param] + text[len(err.param):]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if sys.stdout is None:  # started with file descriptor 1 closed: results would vanish without a word
            raise HeadpruneError("standard output is closed; redirect it to a file or /dev/null")
        check_counts(args)
        if hasattr(args, "device"):
            from .distributed import init_from_env
            from .runtime import reuse_freed_memory

            reuse_freed_memory()

            init_from_env(args.device)
        COMMANDS[args.command][0](args)
        if sys.stdout is not None:
            sys.stdout.flush()  # a full or closed stdout fails here, inside the error handling
    except HeadpruneError as err:
        print(f"headprune: error: {user_message(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # disk full, name too long, stdout closed or full, ...: what failed, on one line
        if (line := os_error_line(err)) is None:
            raise
        print(f"headprune: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("headprune: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        if "torch.distributed" in sys.modules:  # never import torch just to tidy up
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
