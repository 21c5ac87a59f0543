"""``headprune eval``: sliding-window perplexity of a model on a corpus."""

from __future__ import annotations

import argparse

from headprune.cli.common import _json_number, data_from_args, data_line, load_from_args, windowing_from_args
from headprune.cli.options import add_data_args, add_json_arg, add_model_args, add_pattern_arg, add_quiet_arg

HELP = 'sliding-window perplexity of a model on a corpus'


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_data_args(p, "test")
    add_pattern_arg(p)
    add_json_arg(p, "one JSON object: the header's fields, tokens, windows, nll, nll_se, ppl, ppl_se, bytes, "
                    "bits_per_byte")
    add_quiet_arg(p)


def _pattern(args: argparse.Namespace, model, seq_len: int):
    """The context in which the model runs with ``--pattern``'s streaming heads (none without it)."""
    from contextlib import nullcontext

    from headprune.context.pattern import read_pattern
    from headprune.models.streaming import check_streaming, streaming

    if args.pattern is None:
        return nullcontext()
    pattern = read_pattern(args.pattern)
    check_streaming(pattern.sink, pattern.recent, seq_len)
    if not args.json:
        print(f"pattern: {pattern.n_streaming} of {len(pattern.order)} KV heads streaming ({pattern.sink} sink + "
              f"{pattern.recent} recent tokens), ranked by {pattern.ranking}")
    return streaming(model, pattern.layers(model))


def run(args: argparse.Namespace) -> None:
    import json
    import math

    from headprune.data.sources import is_builtin
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.perplexity import bos_setting, evaluate, scored_bytes

    model = load_from_args(args)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    header = {"model": args.model, "data": args.data, "split": args.split if is_builtin(args.data) else None,
              "max_tokens": args.max_tokens, "seq_len": w.seq_len, "stride": w.stride, **bos_setting(w)}
    if not args.json:
        print(f"model: {args.model}\n{data_line('data', args.data, args.split, ids)}\n"
              f"windows: seq_len {w.seq_len}, stride {w.stride}{w.bos_note}")
    with _pattern(args, model, w.seq_len):
        result = evaluate(model, ids, w, progress=not (args.json or args.quiet))
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
