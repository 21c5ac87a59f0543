"""The command line's shared options: each declared once, in the helper of every command that takes it."""

from __future__ import annotations

import argparse

from .errors import HeadpruneError
from .schema import DEFAULT_FRACTIONS, DEFAULT_MODEL

# ``headprune --help``: what the tool is for, in a user's words, then (after the commands) three examples.
DESCRIPTION = """\
Which attention heads of a GPT-2 model matter, and what does removing the others cost?

headprune scores every head (weight norms, activations, gradients, ablation), measures perplexity as more
and more heads are removed, compared with removing heads at random, writes a report (report.html and
summary.md) and exports the smaller model. It runs on the model shipped with it, offline, in minutes on a CPU."""

EPILOG = """\
examples:
  headprune run --out report                          # the whole analysis of the shipped model -> report/
  headprune score --model gpt2 --data notes.txt --out scores.csv
  headprune prune --scores report/scores.csv --method taylor --fraction 0.3 --out pruned-model

Run headprune COMMAND --help for a command's options."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option's help ends with its default (flags: off), or says
    it is required, unless the help already gives its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or not action.option_strings or action.default is argparse.SUPPRESS:
            return text
        if action.required:
            return f"{text} (required)"
        if action.nargs == 0:  # store_true
            return f"{text} (default: off)"
        value = "none" if action.default is None else str(action.default).replace("%", "%%")
        return f"{text} (default: {value})"


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"the GPT-2 to study: a zoo name ({DEFAULT_MODEL} ships with headprune), a local directory or a "
                        "Hugging Face hub id such as gpt2")
    p.add_argument("--device", default="auto",
                   help="where to compute: auto (cuda if available, else cpu), cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="fp32", help="number format of the weights: fp32, bf16 or fp16")
    p.add_argument("--fold-value-bias", action="store_true",
                   help="fold each head's value bias into b_O first (logits unchanged; zero ablation and pruning then "
                        "remove only what a head computes, not its constant b_V W_O)")


def add_window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seq-len", type=int, default=None, help="window length in tokens (default: the model's n_positions)")
    p.add_argument("--stride", type=int, default=None, help="window stride in tokens (default: seq-len)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")


CORPUS_FORMS = "default (the shipped Python-docs corpus), a .txt/.jsonl/.parquet file, a directory of .txt, or hf:NAME[:CONFIG]:SPLIT"


def add_data_args(p: argparse.ArgumentParser, split: str = "test", max_tokens: int | None = None,
                  data_help: str | None = None) -> None:
    """``--data`` (default: the default corpus; ``data_help`` for an optional one: its default is none)."""
    p.add_argument("--data", default=None if data_help else "default",
                   help=data_help or f"corpus ({split} split of the default corpus): {CORPUS_FORMS}")
    add_window_args(p)
    all_note = "; 0: all" if max_tokens else ""
    p.add_argument("--max-tokens", type=int, default=max_tokens,
                   help=f"use only the first K tokens of each corpus (default: {max_tokens or 'all'}{all_note})")
    p.set_defaults(split=split)


def add_score_data_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--score-data", default="default", help=f"corpus for {what}, its validation split: {CORPUS_FORMS} (default: default)")


def add_seed_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="seed of the random baseline")


def add_fraction_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fractions", default=",".join(map(str, DEFAULT_FRACTIONS)),
                   help="comma-separated fractions of all heads to prune, each in [0, 1]")
    p.add_argument("--seeds", type=int, default=3, help="random-baseline seeds (its curve is their mean and std)")


def add_run_flags(p: argparse.ArgumentParser, out_help: str, out_default: str | None = None,
                  overwrite_help: str = "discard the progress of a different earlier run") -> None:
    p.add_argument("--out", required=out_default is None, default=out_default, help=out_help)
    p.add_argument("--overwrite", action="store_true", help=overwrite_help)
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
