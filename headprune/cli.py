"""The ``headprune`` command line. User errors: one line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import argparse
import sys

from .errors import HeadpruneError
from .loading import DEFAULT_MODEL

COMMANDS: dict[str, tuple] = {}  # name -> (run(args), configure(parser), help)


def command(name: str, help: str, configure):
    """Register ``run(args)`` as subcommand ``name``; ``configure(parser)`` adds its options."""

    def wrap(run):
        COMMANDS[name] = (run, configure, help)
        return run

    return wrap


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"zoo name, local directory or hub id (default {DEFAULT_MODEL})")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (default fp32)")


def load_from_args(args):
    from .loading import load_model

    return load_model(args.model, device=args.device, dtype=args.dtype)


def _configure_info(p):
    add_model_args(p)
    p.add_argument("--batch", type=int, default=1, help="batch size B for the shape trace")
    p.add_argument("--seq", type=int, default=8, help="sequence length T for the shape trace")


@command("info", "print the config, parameter ledger, W_O ledger and an attention shape trace", _configure_info)
def cmd_info(args) -> None:
    from .ledger import format_info

    model = load_from_args(args)
    if args.seq > model.cfg.n_positions or min(args.seq, args.batch) < 1:
        raise HeadpruneError(f"--batch and --seq must be positive and --seq <= n_positions {model.cfg.n_positions}")
    print(format_info(model, args.batch, args.seq))


def add_data_args(p: argparse.ArgumentParser, split: str = "test") -> None:
    p.add_argument("--data", default="default",
                   help=f"default (its {split} split), a .txt/.jsonl/.parquet file, a directory of .txt, or hf:NAME[:CONFIG]:SPLIT")
    p.add_argument("--seq-len", type=int, default=None, help="window length (default: the model's n_positions)")
    p.add_argument("--stride", type=int, default=None, help="window stride (default: seq-len)")
    p.add_argument("--max-tokens", type=int, default=None, help="use only the first K tokens of the corpus")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward (default 8)")
    p.set_defaults(split=split)


def data_from_args(args, model, data: str | None = None, split: str | None = None):
    """Token ids (1-D) of ``data`` (default ``--data``) for ``model``; resolves ``args.seq_len``/``args.stride``."""
    from .corpus import corpus_ids
    from .loading import load_tokenizer
    from .perplexity import check_window

    args.seq_len = model.cfg.n_positions if args.seq_len is None else args.seq_len
    args.stride = args.seq_len if args.stride is None else args.stride
    check_window(args.seq_len, args.stride, model.cfg.n_positions)
    if args.batch_size < 1:
        raise HeadpruneError(f"--batch-size {args.batch_size} must be at least 1")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise HeadpruneError(f"--max-tokens {args.max_tokens} must be at least 2")
    tokenizer = load_tokenizer(model.folder, vocab_size=model.cfg.vocab_size)
    return corpus_ids(data or args.data, split or args.split, tokenizer, args.max_tokens)


def _configure_eval(p):
    add_model_args(p)
    add_data_args(p, "test")
    p.add_argument("--json", action="store_true", help="print one JSON object with tokens, nll, ppl")


@command("eval", "sliding-window perplexity of a model on a corpus", _configure_eval)
def cmd_eval(args) -> None:
    import json

    from .perplexity import evaluate

    model = load_from_args(args)
    ids = data_from_args(args, model)
    result = evaluate(model, ids, args.seq_len, args.stride, args.batch_size, progress=not args.json)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(f"tokens scored: {result.tokens:,}\nmean NLL: {result.nll:.6f} nats/token\nperplexity: {result.ppl:.4f}")


def add_sweep_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output table, .csv or .parquet")
    p.add_argument("--overwrite", action="store_true", help="discard the progress of a different earlier run")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _configure_score(p):
    add_model_args(p)
    add_data_args(p, "validation")
    p.add_argument("--methods", default="all", help="all, or a comma-separated list of scoring methods")
    add_sweep_output_args(p)
    p.add_argument("--ablation-rows", type=int, default=None,
                   help="ablated copies x windows per forward (default 8 on the CPU, 64 on a GPU)")
    p.add_argument("--json", action="store_true", help="print a JSON summary (baseline, tokens, seconds per method)")


@command("score", "score every head by weight norms, activations, gradients and ablation", _configure_score)
def cmd_score(args) -> None:
    import json

    from .scoring import parse_methods, score_heads

    out = table_output(args)
    methods = parse_methods(args.methods)
    model = load_from_args(args)
    ids = data_from_args(args, model)
    progress = sweep_progress(args, out, sweep_settings(args, model, ids, "score", methods=methods))
    scores = score_heads(model, ids, methods, args.seq_len, args.stride, args.batch_size, args.ablation_rows,
                         progress, show_progress=not args.quiet)
    if not finish_sweep(progress, scores, out):
        return
    summary = {"out": str(out), "heads": len(scores), **scores.attrs}
    print(json.dumps(summary) if args.json else f"scored {len(scores)} heads with {', '.join(methods)} -> {out}")


def table_output(args):
    """``--out`` of a sweep: a .csv/.parquet path that can be written (checked before any work)."""
    from pathlib import Path

    from .outputs import check_table_suffix, check_writable

    out = Path(args.out)
    check_table_suffix(out)
    check_writable(out)
    return out


def sweep_progress(args, out, settings: dict):
    """The sweep's progress file beside ``out`` (one per process under torchrun)."""
    from .distributed import shard_name
    from .outputs import Progress

    return Progress(out.with_name(shard_name(out.name + ".progress.jsonl")), settings, overwrite=args.overwrite)


def finish_sweep(progress, table, out) -> bool:
    """Drop the progress file; rank 0 writes ``table`` to ``out`` atomically. True where this process wrote."""
    from .distributed import is_main
    from .outputs import write_table

    progress.remove()
    if is_main():
        write_table(table, out)
    return is_main()


def sweep_settings(args, model, ids, command: str, **extra) -> dict:
    """What makes a sweep's results what they are: resuming requires all of it to be equal."""
    import hashlib

    from .loading import model_fingerprint

    return {"command": command, "model": model_fingerprint(model), "dtype": str(model.dtype), "device": model.device.type,
            "data": args.data, "split": args.split, "tokens": hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16],
            "seq_len": args.seq_len, "stride": args.stride, "batch_size": args.batch_size,
            "ablation_rows": getattr(args, "ablation_rows", None), **extra}


def add_selection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--per-layer", action="store_true", help="prune the same fraction/count in every layer")
    p.add_argument("--normalize", choices=["layer"], default=None,
                   help="divide each layer's scores by their L2 norm before global ranking (Michel et al.)")
    p.add_argument("--standardize", action="store_true", help="rank by per-layer z-scores (FLAP)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baseline (default 0)")
    p.add_argument("--score-data", default="default",
                   help="corpus for mean compensation and re-scoring (default: the default corpus' validation split)")


def _configure_prune(p):
    add_model_args(p)
    add_data_args(p, "test")
    p.set_defaults(data=None)
    p.add_argument("--heads", help="explicit heads to remove, e.g. L0H1,L3H2")
    p.add_argument("--scores", help="scores table (.csv/.parquet) from headprune score")
    p.add_argument("--method", help="scores column to rank by, or random")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--fraction", type=float, help="fraction of all heads to remove, in [0, 1]")
    amount.add_argument("--count", type=int, help="number of heads to remove")
    p.add_argument("--iterative", type=int, default=1, metavar="STEPS", help="re-score the remaining heads between STEPS steps")
    add_selection_args(p)
    p.add_argument("--compensate", choices=["none", "mean"], default="none",
                   help="mean: fold the pruned heads' mean output into b_O")
    p.add_argument("--out", required=True, help="output directory for the pruned checkpoint")
    p.add_argument("--format", choices=["native", "hf"], default="native",
                   help="native: really smaller tensors; hf: original shapes, zeroed, loads in stock transformers")
    p.add_argument("--overwrite", action="store_true", help="replace an existing export in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


@command("prune", "remove heads (explicit or by score), optionally mean-compensated, and export the model", _configure_prune)
def cmd_prune(args) -> None:
    import pandas as pd

    from .heads import format_heads, parse_head_spec
    from .iterative import prune_iteratively
    from .outputs import check_writable
    from .perplexity import evaluate
    from .pruning import export_hf, export_native, prune_model, pruning_stats
    from .report import read_scores
    from .scoring import head_means, score_heads
    from .scoring.weights import WEIGHT_METHODS
    from .selection import check_scores_match

    if (args.heads is None) == (args.scores is None):
        raise HeadpruneError("give either --heads L0H1,... or --scores FILE --method M (--fraction F | --count K)")
    if args.scores is not None and (args.method is None or (args.fraction is None) == (args.count is None)):
        raise HeadpruneError("--scores needs --method and exactly one of --fraction and --count")
    if args.fraction is not None and not 0 <= args.fraction <= 1:
        raise HeadpruneError(f"--fraction {args.fraction} must lie in [0, 1]")
    check_writable(args.out)
    model = load_from_args(args)
    rescoring = args.iterative > 1 and args.method not in WEIGHT_METHODS + ("random",)
    needs_score_data = args.compensate == "mean" or rescoring
    score_ids = data_from_args(args, model, args.score_data, "validation") if needs_score_data else None

    def means(m):
        return head_means(m, score_ids, args.seq_len, args.stride, args.batch_size, show_progress=not args.quiet)

    if args.heads is not None:
        heads = parse_head_spec(args.heads, model)
        pruned = prune_model(model, heads, means(model) if args.compensate == "mean" else None)
    else:
        scores = read_scores(args.scores)
        check_scores_match(scores, model, args.scores)

        def rescore(m):  # the file's scores first, then the pruned model's own
            if m is model or args.method == "random":
                return scores if m is model else pd.DataFrame(m.head_ids, columns=["layer", "head"])
            return score_heads(m, score_ids, [args.method], args.seq_len, args.stride, args.batch_size,
                               show_progress=not args.quiet)

        pruned, heads = prune_iteratively(model, rescore, args.method, args.fraction, args.count, args.iterative,
                                          args.per_layer, args.normalize, args.standardize, args.seed,
                                          means if args.compensate == "mean" else None)
    seq_len = args.seq_len or model.cfg.n_positions
    stats = pruning_stats(model, pruned, seq_len)
    meta = {"heads": format_heads(heads), "compensate": args.compensate, "stats": stats}
    if args.format == "native":
        export_native(pruned, args.out, overwrite=args.overwrite, metadata=meta)
    else:
        export_hf(pruned, [], None, args.out, overwrite=args.overwrite, metadata=meta)
    print(f"heads removed ({len(heads)}): {format_heads(heads) or '(none)'}")
    print(f"parameters: {stats['params_before']:,} -> {stats['params_after']:,} (removed {stats['params_removed']:,})")
    print(f"attention FLOPs/token at T={seq_len}: {stats['attention_flops_per_token_before']:,} -> "
          f"{stats['attention_flops_per_token_after']:,} (removed {stats['attention_flops_per_token_removed']:,})")
    if args.data is not None:
        ids = data_from_args(args, model)
        before = evaluate(model, ids, args.seq_len, args.stride, args.batch_size, progress=not args.quiet)
        after = evaluate(pruned, ids, args.seq_len, args.stride, args.batch_size, progress=not args.quiet)
        print(f"perplexity on {args.data} ({before.tokens:,} tokens): {before.ppl:.3f} -> {after.ppl:.3f} "
              f"(delta NLL {after.nll - before.nll:+.4f} nats/token)")
    print(f"saved {args.format} checkpoint -> {args.out}")


def _configure_curve(p):
    add_model_args(p)
    add_data_args(p, "test")
    p.add_argument("--scores", required=True, help="scores table (.csv/.parquet) from headprune score")
    p.add_argument("--methods", default="all", help="scores columns to rank by (all: every importance column)")
    p.add_argument("--fractions", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", help="fractions of heads to prune")
    p.add_argument("--seeds", type=int, default=3, help="random-baseline seeds (default 3)")
    p.add_argument("--compensate", choices=["none", "mean"], default="none", help="also measure mean-compensated curves")
    add_selection_args(p)
    add_sweep_output_args(p)


@command("curve", "perplexity against the fraction of heads pruned, per method, with a random baseline", _configure_curve)
def cmd_curve(args) -> None:
    from .curves import parse_fractions, pruning_curves
    from .report import read_scores
    from .scoring import DESCRIPTIVE, METHODS, head_means
    from .selection import check_scores_match

    out = table_output(args)
    fractions = parse_fractions(args.fractions)
    if args.seeds < 1:
        raise HeadpruneError(f"--seeds {args.seeds} must be at least 1")
    model = load_from_args(args)
    scores = read_scores(args.scores)
    check_scores_match(scores, model, args.scores)
    available = [m for m in METHODS if m in scores.columns and m not in DESCRIPTIVE]
    methods = available if args.methods == "all" else [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m != "random" and m not in available:
            raise HeadpruneError(f"method {m!r} is not an importance column of {args.scores}; use {', '.join(available)}")
    methods = [m for m in methods if m != "random"]
    ids = data_from_args(args, model)
    means = None
    if args.compensate == "mean":
        score_ids = data_from_args(args, model, args.score_data, "validation")
        means = head_means(model, score_ids, args.seq_len, args.stride, args.batch_size, show_progress=not args.quiet)
    variants = [(m, "none") for m in methods] + [("random", "none")]
    variants += [(m, "mean") for m in methods] if means is not None else []
    settings = sweep_settings(args, model, ids, "curve", scores=scores.to_json(), variants=variants,
                              fractions=fractions, seeds=args.seeds, seed=args.seed, per_layer=args.per_layer,
                              normalize=args.normalize, standardize=args.standardize,
                              score_data=args.score_data if means is not None else None)
    progress = sweep_progress(args, out, settings)
    curves = pruning_curves(model, ids, scores, variants, fractions, args.seq_len, args.stride, args.batch_size,
                            args.seeds, means, args.per_layer, args.normalize, args.standardize, args.seed, progress,
                            show_progress=not args.quiet)
    if not finish_sweep(progress, curves, out):
        return
    print(curves.to_string(index=False, float_format="%.4f"))
    print(f"-> {out}")


def _configure_report(p):
    p.add_argument("--scores", required=True, help="scores table (.csv/.parquet)")
    p.add_argument("--curves", required=True, help="curves table (.csv/.parquet)")
    p.add_argument("--out", required=True, help="report directory")


@command("report", "rebuild the report (tables, plots, summary.md, report.html) from saved tables", _configure_report)
def cmd_report(args) -> None:
    from .report import run_report_command

    print(f"report -> {run_report_command(args.scores, args.curves, args.out)}")


def _configure_run(p):
    add_model_args(p)
    p.add_argument("--data", default="default", help="corpus for the curves (default: the default corpus' test split)")
    p.add_argument("--score-data", default="default",
                   help="corpus for scoring (default: the default corpus' validation split)")
    p.add_argument("--out", default="headprune-report", help="report directory (default headprune-report)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward (default 8)")
    p.add_argument("--seq-len", type=int, default=None, help="window length (default: the model's n_positions)")
    p.add_argument("--stride", type=int, default=None, help="window stride (default: seq-len)")
    p.add_argument("--max-tokens", type=int, default=8192, help="tokens of each corpus used (default 8192; 0: all)")
    p.add_argument("--fractions", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", help="fractions of heads to prune")
    p.add_argument("--seeds", type=int, default=3, help="random-baseline seeds (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="discard the progress of a different earlier run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


@command("run", "the whole analysis: ledger, baseline, all scores, pruning curves, report", _configure_run)
def cmd_run(args) -> None:
    from .curves import parse_fractions
    from .pipeline import RunSettings, run_analysis

    if args.batch_size < 1 or args.seeds < 1 or (args.max_tokens is not None and 0 < args.max_tokens < 2):
        raise HeadpruneError("--batch-size and --seeds must be at least 1, --max-tokens 0 (all) or at least 2")
    settings = RunSettings(model=args.model, data=args.data, score_data=args.score_data, out=args.out,
                           device=args.device, dtype=args.dtype, batch_size=args.batch_size, seq_len=args.seq_len,
                           stride=args.stride, max_tokens=args.max_tokens or None,
                           fractions=tuple(parse_fractions(args.fractions)), seeds=args.seeds, seed=args.seed)
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    result = run_analysis(settings, overwrite=args.overwrite, quiet=args.quiet, log=log)
    if result is None:  # a torchrun worker other than rank 0
        return
    b = result["baseline"]
    print(f"baseline: perplexity {b['ppl']:.3f} (NLL {b['nll']:.4f} nats/token, {b['tokens']:,} tokens)")
    print(f"best method: {result['best']}")
    print(result["table"].to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(f"report: {result['report']}  ({result['seconds']:.0f} s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headprune", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, configure, help) in COMMANDS.items():
        configure(sub.add_parser(name, help=help, description=help))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if hasattr(args, "device"):
            from .distributed import init_from_env

            init_from_env(args.device)
        COMMANDS[args.command][0](args)
    except HeadpruneError as err:
        print(f"headprune: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("headprune: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
