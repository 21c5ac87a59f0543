"""``headprune info``: config, parameter ledger and attention shape trace."""

from __future__ import annotations

import argparse

from headprune.cli.common import load_from_args
from headprune.cli.options import add_model_args
from headprune.errors import HeadpruneError

HELP = 'config, parameter ledger and attention shape trace'


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--batch-size", type=int, default=1, dest="batch", metavar="B", help="batch size B of the shape trace")
    p.add_argument("--seq-len", type=int, default=8, dest="seq", metavar="T", help="sequence length T of the shape trace")
    for old, dest in (("--batch", "batch"), ("--seq", "seq")):  # the first spellings, still accepted
        p.add_argument(old, type=int, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    from headprune.models.ledger import format_info

    model = load_from_args(args)
    if args.seq > model.cfg.n_positions or min(args.seq, args.batch) < 1:
        raise HeadpruneError(f"--batch-size and --seq-len must be positive and --seq-len <= n_positions {model.cfg.n_positions}")
    print(format_info(model, args.batch, args.seq))
