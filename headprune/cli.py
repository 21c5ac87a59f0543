"""The ``headprune`` command line. User errors: one line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import argparse
import sys

from .errors import HeadpruneError
from .loading import DEFAULT_MODEL

COMMANDS = {}


def command(name: str, help: str):
    """Register ``fn(args)`` as a subcommand; ``fn.configure(parser)`` adds its options."""

    def wrap(fn):
        COMMANDS[name] = (fn, help)
        return fn

    return wrap


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"zoo name, local directory or hub id (default {DEFAULT_MODEL})")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (default fp32)")


def load_from_args(args):
    from .loading import load_model

    return load_model(args.model, device=args.device, dtype=args.dtype)


@command("info", "print the config, parameter ledger, W_O ledger and an attention shape trace")
def cmd_info(args) -> None:
    from .ledger import format_info

    model = load_from_args(args)
    if args.seq > model.cfg.n_positions:
        raise HeadpruneError(f"--seq {args.seq} exceeds the model's n_positions {model.cfg.n_positions}")
    print(format_info(model, args.batch, args.seq))


def _configure_info(p):
    add_model_args(p)
    p.add_argument("--batch", type=int, default=1, help="batch size B for the shape trace")
    p.add_argument("--seq", type=int, default=8, help="sequence length T for the shape trace")


def add_data_args(p: argparse.ArgumentParser, split: str = "test") -> None:
    p.add_argument("--data", default="default",
                   help=f"default (its {split} split), a .txt/.jsonl/.parquet file, a directory of .txt, or hf:NAME[:CONFIG]:SPLIT")
    p.add_argument("--seq-len", type=int, default=None, help="window length (default: the model's n_positions)")
    p.add_argument("--stride", type=int, default=None, help="window stride (default: seq-len)")
    p.add_argument("--max-tokens", type=int, default=None, help="use only the first K tokens of the corpus")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward (default 8)")
    p.set_defaults(split=split)


def data_from_args(args, model, data: str | None = None, split: str | None = None):
    """Token ids (1-D) of ``--data`` for ``model``, plus the resolved seq_len and stride."""
    from .corpus import load_texts, tokenize_corpus
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
    ids = tokenize_corpus(load_texts(data or args.data, split or args.split), tokenizer)
    return ids[: args.max_tokens] if args.max_tokens else ids


@command("eval", "sliding-window perplexity of a model on a corpus")
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


def _configure_eval(p):
    add_model_args(p)
    add_data_args(p, "test")
    p.add_argument("--json", action="store_true", help="print one JSON object with tokens, nll, ppl")


CONFIGURE = {"info": _configure_info, "eval": _configure_eval}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headprune", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help) in COMMANDS.items():
        CONFIGURE[name](sub.add_parser(name, help=help, description=help))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        COMMANDS[args.command][0](args)
    except HeadpruneError as err:
        print(f"headprune: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("headprune: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
