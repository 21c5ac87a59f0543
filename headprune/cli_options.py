"""The command line's shared options: each declared once, in the helper of every command that takes it."""

from __future__ import annotations

import argparse

from .errors import HeadpruneError
from .schema import DEFAULT_FRACTIONS, DEFAULT_MODEL


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"zoo name, local directory or hub id (default {DEFAULT_MODEL})")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (default fp32)")
    p.add_argument("--fold-value-bias", action="store_true",
                   help="fold each head's value bias into b_O first (logits unchanged; zero ablation and pruning then "
                        "remove only what a head computes, not its constant b_V W_O)")


def add_window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seq-len", type=int, default=None, help="window length (default: the model's n_positions)")
    p.add_argument("--stride", type=int, default=None, help="window stride (default: seq-len)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward (default 8)")


def add_data_args(p: argparse.ArgumentParser, split: str = "test", max_tokens: int | None = None) -> None:
    p.add_argument("--data", default="default",
                   help=f"default (its {split} split), a .txt/.jsonl/.parquet file, a directory of .txt, or hf:NAME[:CONFIG]:SPLIT")
    add_window_args(p)
    all_note = "; 0: all" if max_tokens else ""
    p.add_argument("--max-tokens", type=int, default=max_tokens,
                   help=f"use only the first K tokens of each corpus (default {max_tokens or 'all'}{all_note})")
    p.set_defaults(split=split)


def add_score_data_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--score-data", default="default", help=f"corpus for {what} (default: the default corpus' validation split)")


def add_seed_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="seed of the random baseline (default 0)")


def add_fraction_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fractions", default=",".join(map(str, DEFAULT_FRACTIONS)), help="fractions of heads to prune")
    p.add_argument("--seeds", type=int, default=3, help="random-baseline seeds (default 3)")


def add_run_flags(p: argparse.ArgumentParser, out_help: str, out_default: str | None = None) -> None:
    p.add_argument("--out", required=out_default is None, default=out_default, help=out_help)
    p.add_argument("--overwrite", action="store_true", help="discard the progress of a different earlier run")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_selection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--per-layer", action="store_true", help="prune the same fraction/count in every layer")
    p.add_argument("--normalize", choices=["layer"], default=None,
                   help="divide each layer's scores by their L2 norm before global ranking (Michel et al.)")
    p.add_argument("--standardize", action="store_true", help="rank by per-layer z-scores (FLAP)")
    add_seed_arg(p)
    add_score_data_arg(p, "mean compensation and re-scoring")


#: The smallest value of every integer option, by its argparse dest: each command checks all it has, the same way.
MINIMUMS = {"batch_size": 1, "seeds": 1, "ablation_rows": 1, "count": 0, "steps": 1,
            "seed": 0, "batch": 1, "seq": 1}
#: The largest: beyond these, sizes only allocate absurd memory (a shape trace of B x h x T x T floats).
MAXIMUMS = {"batch": 4096, "seq": 1 << 16, "batch_size": 1 << 16, "ablation_rows": 1 << 16, "seeds": 10_000}


def check_counts(args) -> None:
    """The numeric options of every command, checked before any work (one rule per option, in every command)."""
    for dest, low in MINIMUMS.items():
        value = getattr(args, dest, None)
        if value is not None and value < low:
            raise HeadpruneError(f"{dest} {value} must be at least {low}", dest)
        if value is not None and dest in MAXIMUMS and value > MAXIMUMS[dest]:
            raise HeadpruneError(f"{dest} {value} is too large; use at most {MAXIMUMS[dest]}", dest)
    if (fraction := getattr(args, "fraction", None)) is not None and not 0 <= fraction <= 1:
        raise HeadpruneError(f"--fraction {fraction} must lie in [0, 1]")
    max_tokens = getattr(args, "max_tokens", None)
    if max_tokens is not None and max_tokens < 2 and not (max_tokens == 0 and args.command == "run"):
        raise HeadpruneError(f"max_tokens {max_tokens} must be at least 2" + (" (or 0: all)" if args.command == "run"
                                                                               else ""), "max_tokens")
