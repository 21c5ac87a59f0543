"""``headprune prune``: remove heads (listed or by score), export the smaller model."""

from __future__ import annotations

import argparse

from headprune.cli.common import (
    data_from_args,
    fill_source,
    layer_ranking_from_args,
    load_from_args,
    selection_from_args,
    windowing_from_args,
)
from headprune.cli.options import (
    CORPUS_FORMS,
    add_compensate_arg,
    add_data_args,
    add_format_arg,
    add_gguf_type_arg,
    add_method_arg,
    add_model_args,
    add_run_flags,
    add_scores_arg,
    add_selection_args,
)
from headprune.errors import HeadpruneError
from headprune.schema import RANKABLE_METHODS

HELP = 'remove heads (listed or by score), export the smaller model'


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p, export=True)
    add_data_args(p, "test",
                  data_help="also measure perplexity before and after pruning on this corpus, its test split: "
                            f"{CORPUS_FORMS} (default: none, not measured)")
    p.add_argument("--heads", help="explicit heads to remove, e.g. L0H1,L3H2")
    add_scores_arg(p)
    add_method_arg(p, f"scores column to rank by: {', '.join(RANKABLE_METHODS)} or random; NAME@layer "
                                    "(as the report names it): NAME's scores normalised per layer, --normalize layer")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--fraction", type=float, help="fraction of all heads to remove, in [0, 1]")
    amount.add_argument("--count", type=int, help="number of heads to remove")
    p.add_argument("--iterative", type=int, default=1, dest="steps", metavar="STEPS",
                   help="prune in STEPS steps, re-scoring the remaining heads between them")
    add_selection_args(p, "seed of the random selection (--method random)")
    p.add_argument("--uniform", action="store_true",
                   help="grouped-query models: the best prune by --method that keeps the same query and KV head "
                        "counts in every layer and group, so --format hf loads at smaller shapes")
    add_compensate_arg(p, "mean: fold the pruned heads' mean outputs into b_O; optimal: the constants optimal for "
                        "ablating these heads together (Li & Janson 2024), fitted jointly on --score-data")
    add_format_arg(p, "native: really smaller tensors; hf: for stock transformers (smaller shapes where the prune "
                      "is uniform, else zeroed); gguf: one --out FILE.gguf that llama.cpp runs, uneven Llama prunes "
                      "included")
    add_gguf_type_arg(p)
    add_run_flags(p, "output directory for the pruned checkpoint (--format gguf: the .gguf file)",
                  overwrite_help="replace --out even when it is a non-empty folder that is not a headprune export")


def run(args: argparse.Namespace) -> None:
    from headprune.io.read.fingerprint import model_fingerprint
    from headprune.io.work.files import check_writable
    from headprune.io.write.export import export_hf, export_native
    from headprune.io.write.export_source import export_dtype
    from headprune.models.heads import format_heads
    from headprune.models.ledger import pruning_stats
    from headprune.pruning.iterative import needs_score_data

    if (args.heads is None) == (args.scores is None):
        raise HeadpruneError("give either --heads L0H1,... or --scores FILE --method M (--fraction F | --count K)")
    if args.scores is not None and (args.method is None or (args.fraction is None) == (args.count is None)):
        raise HeadpruneError("--scores needs --method and exactly one of --fraction and --count")
    if args.uniform and (args.scores is None or args.steps != 1 or args.per_layer):
        raise HeadpruneError("--uniform needs --scores and --method, and no --iterative or --per-layer")
    layer_ranking_from_args(args)
    if args.format == "gguf" and not str(args.out).lower().endswith(".gguf"):
        raise HeadpruneError(f"--format gguf writes one file: give --out a name ending in .gguf (got {args.out})")
    check_writable(args.out, file=args.format == "gguf")
    model = load_from_args(args, args.dtype or "fp32")  # --dtype not given: fp32, the export in the source's
    if args.format == "gguf":  # the family and the tokenizer's GGUF, before any work
        from headprune.io.write.gguf import check_exportable

        check_exportable(model)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model) if args.data is not None else None  # checked before anything is written
    score_ids = None
    if args.compensate != "none" or (args.scores is not None and
                                     needs_score_data(args.method, args.steps, args.compensate)):
        score_ids = data_from_args(args, model, args.score_data, "validation")
    pruned, heads = _prune(args, model, w, score_ids)
    stats = pruning_stats(model, pruned, w.seq_len)
    fill_data = fill_source(args, score_ids if args.compensate != "none" else None)
    meta = {"heads": format_heads(heads), "compensate": args.compensate, "fill_data": fill_data, "stats": stats,
            "source_fingerprint": model_fingerprint(model), "fold_value_bias": args.fold_value_bias}
    saved = export_dtype(pruned, args.dtype)
    if args.format == "gguf":
        from headprune.io.write.gguf import export_gguf

        export_gguf(pruned, args.out, gguf_type=args.gguf_type, metadata=meta)
    else:
        export = export_native if args.format == "native" else export_hf
        export(pruned, args.out, overwrite=args.overwrite, metadata=meta, dtype=saved)
    _report_removed(args, heads, stats, fill_data, w.seq_len)
    if ids is not None:
        _report_perplexity(args, model, pruned, ids, w)
    _report_saved(args, pruned, saved)


def _prune(args: argparse.Namespace, model, w, score_ids) -> tuple:
    """(pruned model, heads removed): the heads given, the uniform prune nearest the amount, or the ranking's."""
    from headprune.io.work.files import read_scores
    from headprune.models.heads import parse_head_spec
    from headprune.pruning.apply import compensated_prune
    from headprune.pruning.iterative import prune_iteratively
    from headprune.pruning.options import PruningOptions, ScoringData
    from headprune.pruning.selection import check_scores_match

    if args.heads is not None:
        heads = parse_head_spec(args.heads, model)
    else:
        scores = read_scores(args.scores)
        check_scores_match(scores, model, args.scores)
        if not args.uniform:
            data = ScoringData(score_ids, w) if score_ids is not None else None
            options = PruningOptions(steps=args.steps, selection=selection_from_args(args), compensate=args.compensate)
            return prune_iteratively(model, scores, args.method, fraction=args.fraction, count=args.count,
                                     options=options, data=data, show_progress=not args.quiet)
        from headprune.pruning.uniform import uniform_heads

        heads = uniform_heads(model, scores, args.method, args.fraction, args.count, selection_from_args(args))
        print(f"uniform prune: {len(heads)} heads removed, the nearest loadable shape to the "
              f"{round(args.fraction * len(model.head_ids)) if args.fraction is not None else args.count} asked")
    return compensated_prune(model, heads, args.compensate, score_ids, w, show_progress=not args.quiet), heads


def _report_removed(args: argparse.Namespace, heads, stats: dict, fill_data, seq_len: int) -> None:
    """What the prune removed: the heads, where their fills were fitted, and the parameters and attention FLOPs
    per token at ``seq_len`` before and after (``stats``: :func:`~headprune.models.ledger.pruning_stats`)."""
    from headprune.models.heads import format_heads

    print(f"heads removed ({len(heads)}): {format_heads(heads) or '(none)'}")
    if fill_data:
        print(f"{args.compensate} compensation: fills fitted on {fill_data}")
    print(f"parameters: {stats['params_before']:,} -> {stats['params_after']:,} (removed {stats['params_removed']:,})")
    print(f"attention FLOPs/token at T={seq_len}: {stats['attention_flops_per_token_before']:,} -> "
          f"{stats['attention_flops_per_token_after']:,} (removed {stats['attention_flops_per_token_removed']:,})")


def _report_perplexity(args: argparse.Namespace, model, pruned, ids, w) -> None:
    """What the prune cost: perplexity on ``ids`` before and after, and a fine-tune's command where it rose more
    than :data:`~headprune.pruning.apply.DRASTIC` times."""
    from headprune.pruning.apply import DRASTIC, before_after

    measured = before_after(model, pruned, ids, w, progress=not args.quiet)
    before, after = measured.before, measured.after
    print(f"perplexity on {args.data} ({before.tokens:,} tokens): {before.ppl:.3f} -> {after.ppl:.3f} "
          f"(delta NLL {measured.delta_nll:+.4f} nats/token)")
    if measured.drastic:
        print(f"perplexity rose more than {DRASTIC:g}x: a short fine-tune wins much of it back "
              f"(headprune finetune {args.out} --steps 200 --teacher {args.model} --out {args.out}-recovered)")


def _report_saved(args: argparse.Namespace, pruned, saved) -> None:
    """What was written: the export's layout (hf, gguf) or how it reloads (native), its weights' dtype ``saved``
    and where it went."""
    from headprune.io.write.export import hf_layout
    from headprune.io.write.export_source import dtype_name

    if args.format == "hf":
        print(hf_layout(pruned))
    if args.format == "gguf":
        from headprune.io.write.gguf import gguf_plan

        print(gguf_plan(pruned).describe())
        print(f"saved gguf ({args.gguf_type} matrices) -> {args.out}: llama-cli -m {args.out}, or --model it here")
        return
    if args.format == "native":
        print("native checkpoint: reloads in headprune (--model OUT, load_model), not in stock transformers; "
              "for transformers' from_pretrained export with --format hf")
    given = "--dtype" if args.dtype is not None else "the source checkpoint's dtype"
    print(f"saved {args.format} checkpoint ({dtype_name(saved)} weights, {given}) -> {args.out}")
