"""``headprune info``: config, parameter ledger and attention shape trace."""

from __future__ import annotations

import argparse

from headprune.cli.common import load_from_args
from headprune.cli.options import add_batch_size_arg, add_model_args, add_seq_len_arg
from headprune.errors import HeadpruneError

HELP = "config, parameter ledger and attention shape trace"
TRACE_BATCH_MAX = 4096


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_batch_size_arg(p, 1, "batch size B of the shape trace")
    add_seq_len_arg(p, 8, "sequence length T of the shape trace")


def run(args: argparse.Namespace) -> None:
    from headprune.models.ledger import format_info

    model = load_from_args(args)
    if args.seq_len > model.cfg.n_positions or min(args.seq_len, args.batch_size) < 1:
        raise HeadpruneError(f"--batch-size and --seq-len must be positive and --seq-len <= n_positions "
                             f"{model.cfg.n_positions}")
    if args.batch_size > TRACE_BATCH_MAX:  # the trace allocates B x h x T x T attention probabilities
        raise HeadpruneError(f"--batch-size {args.batch_size} is too large for the shape trace; use at most "
                             f"{TRACE_BATCH_MAX}")
    print(format_info(model, args.batch_size, args.seq_len))
