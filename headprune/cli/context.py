"""``headprune context``: which KV heads need the whole context, and how much of the KV cache can stream."""

from __future__ import annotations

import argparse

from headprune.cli.common import load_from_args
from headprune.cli.options import (
    add_bootstrap_arg,
    add_methods_arg,
    add_model_args,
    add_run_flags,
    add_seed_arg,
    add_seq_len_arg,
    add_streaming_args,
)
from headprune.context import DEFAULT_SHARES
from headprune.errors import HeadpruneError

HELP = "which KV heads need the whole context, and what can stream"


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_seq_len_arg(p, help="tokens per long window (default: the model's context, at most 1,024)")
    add_streaming_args(p, None, " (default: 256, at most --seq-len / 8: 128 at 1,024 tokens)")
    add_methods_arg(p, "context scores to rank KV heads by: ctx_stream (exact), ctx_gate, ctx_retrieval (all: the "
                       "three)")
    p.add_argument("--score-windows", type=int, default=2, help="long windows (validation split) the scores read")
    p.add_argument("--curve-windows", type=int, default=4,
                   help="long windows (test split) each streaming pattern is measured on, at least 2")
    p.add_argument("--tail", type=int, default=None,
                   help="last tokens of each curve window whose NLL is measured (default: --seq-len / 4)")
    p.add_argument("--shares", default=",".join(f"{x:g}" for x in DEFAULT_SHARES),
                   help="comma-separated shares of KV heads made streaming, each in (0, 1]")
    p.add_argument("--random-seeds", type=int, default=3, help="random orders measured beside the scores' orders")
    p.add_argument("--long-task", default="recall",
                   help="long task measured beside the NLL: recall (a pass key, completed), multikey (4 pass keys, "
                        "one asked), passkey (asked as a question), or none (the long-window NLL alone)")
    p.add_argument("--prompts", type=int, default=3,
                   help="the task's prompts at each length (--seq-len / 2 and --seq-len), at least 2")
    p.add_argument("--tolerance", type=float, default=0.01,
                   help="the pattern written: the largest share within this relative loss of the full model")
    add_seed_arg(p, "seed of the random orders, the task's prompts and the bootstrap")
    add_bootstrap_arg(p)
    p.add_argument("--render-only", action="store_true",
                   help="re-write --out's summary.md from its saved tables (no model loaded, nothing measured)")
    add_run_flags(p, "output folder: the tables, summary.md and pattern/ (kv_pattern.json; kvpress' config.json "
                     "and full_attention_heads.tsv)")


def settings_from_args(args: argparse.Namespace):
    from headprune.stages.context import ContextSettings

    try:
        shares = tuple(float(x) for x in args.shares.split(",") if x.strip())
    except ValueError:
        raise HeadpruneError(f"--shares {args.shares!r} must be comma-separated numbers in (0, 1]") from None
    from headprune.schema import CONTEXT_METHODS

    methods = CONTEXT_METHODS if args.methods == "all" else tuple(m.strip() for m in args.methods.split(",")
                                                                  if m.strip())
    return ContextSettings(seq_len=args.seq_len, score_windows=args.score_windows, curve_windows=args.curve_windows,
                           tail=args.tail, sink=args.sink, recent=args.window, methods=methods, shares=shares,
                           random_seeds=args.random_seeds, task=args.long_task, prompts=args.prompts,
                           tolerance=args.tolerance,
                           bootstrap=args.bootstrap, seed=args.seed)


def estimate_line(model, s, methods: list[str]) -> str:
    """What the stage will cost here: the scores, and each distinct streaming pattern of the curve."""
    from headprune.context.curve import share_counts
    from headprune.cost import Pace, estimate_context
    from headprune.models.kv_cache import kv_heads

    counts = [n for n in share_counts(len(kv_heads(model)), s.shares) if n]
    rankings = len(methods) + s.random_seeds
    points = 1 + rankings * len([n for n in counts if n < len(kv_heads(model))]) + (max(counts) == len(kv_heads(model)))
    prompt_tokens = s.prompts * (s.seq_len // 2 + s.seq_len) if s.task != "none" else 0
    pace = Pace.here(model, s.seq_len)
    return estimate_context(model, methods, s.score_windows * s.seq_len, s.seq_len, points,
                            s.curve_windows * s.seq_len + prompt_tokens, pace).line()


def run(args: argparse.Namespace) -> None:
    from pathlib import Path

    from headprune.io.read.fingerprint import model_fingerprint
    from headprune.io.work.files import check_writable
    from headprune.io.work.progress import Progress
    from headprune.stages.context import context_stage

    out = Path(args.out)
    if args.render_only:
        from headprune.stages.context import derive, load_context

        derive(load_context(out)).save_tables(out)
        print(f"-> {out}")
        return
    check_writable(out)
    model = load_from_args(args)
    s = settings_from_args(args).resolve(model)
    if not args.quiet:
        print(f"model: {args.model}: {len(model.head_ids)} query heads; long windows of {s.seq_len} tokens, streaming "
              f"heads keep {s.sink} + {s.recent} tokens")
        print(estimate_line(model, s, list(s.methods)))
    settings = {"command": "context", "model": model_fingerprint(model), "dtype": str(model.dtype),
                "settings": repr(s)}
    progress = Progress(out.with_name(out.name + ".progress.jsonl"), settings, overwrite=args.overwrite)
    result = context_stage(model, s, progress, quiet=args.quiet)
    result.save(out, model)
    progress.remove()
    if not args.quiet:
        print("\n".join(line for line in result.summary()[1:] if line))
    print(f"-> {out}")
