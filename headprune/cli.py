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


CONFIGURE = {"info": _configure_info}


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
