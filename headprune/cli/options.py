"""The command line's shared options: each declared once, in the helper of every command that takes it."""

from __future__ import annotations

import argparse

from headprune.errors import HeadpruneError
from headprune.schema import DEFAULT_FRACTIONS, DEFAULT_MAX_TOKENS, DEFAULT_MODEL, DEFAULT_SEEDS

# ``headprune --help``: what the tool is for, in a user's words, then (after the commands) three examples.
DESCRIPTION = """\
Which attention heads of a transformer matter, and what does removing the others cost?

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

    def add_argument(self, action: argparse.Action) -> None:
        """As argparse's, but the command names count towards the help column (argparse leaves them out, so a name
        longer than the others, like learn-gates, would push its help onto the next line)."""
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            longest = max((len(a.dest) for a in action._get_subactions()), default=0)
            self._action_max_length = max(self._action_max_length, longest + self._current_indent + 4)


#: ``prune --dtype``: it also says what the export is written in, and without it the export keeps the source's.
EXPORT_DTYPE_HELP = ("number format of the weights, fp32, bf16 or fp16: given, the model is loaded, pruned and "
                     "exported in it; without it, computed in fp32 and exported in the source checkpoint's dtype "
                     "(fp16 for the shipped model) (default: none)")


def add_model_args(p: argparse.ArgumentParser, export: bool = False) -> None:
    """``--model``, ``--device``, ``--dtype`` (``export``: :data:`EXPORT_DTYPE_HELP`, default none) and
    ``--fold-value-bias``."""
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"the model to study: a zoo name ({DEFAULT_MODEL} ships with headprune), a packaged real "
                        "model (headprune models), a GGUF file, a local directory or a Hugging Face hub id such "
                        "as gpt2")
    add_device_args(p, export)
    add_fold_arg(p)


def add_device_args(p: argparse.ArgumentParser, export: bool = False) -> None:
    p.add_argument("--device", default="auto",
                   help="where to compute: auto (cuda if available, else cpu), cpu, cuda or cuda:N")
    p.add_argument("--dtype", default=None if export else "fp32",
                   help=EXPORT_DTYPE_HELP if export else "number format of the weights: fp32, bf16 or fp16")


def add_workers_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", default="auto",
                   help="processes sharing the work on the CPU (torch.distributed, one thread each; the output is the "
                        "same): auto = the machine's cores, at most 2 (1 on a GPU or under torchrun), or a number "
                        "(default: $HEADPRUNE_WORKERS, else auto)")


def add_fold_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fold-value-bias", action="store_true",
                   help="fold each head's value bias into b_O first (logits unchanged; zero ablation and pruning then "
                        "remove only what a head computes, not its constant b_V W_O)")


def add_seq_len_arg(p: argparse.ArgumentParser, default: int | None = None,
                    help: str = "window length in tokens (default: the model's n_positions, at most 1024)") -> None:
    p.add_argument("--seq-len", type=int, default=default, help=help)


def add_batch_size_arg(p: argparse.ArgumentParser, default: int = 8, help: str = "windows per forward pass") -> None:
    p.add_argument("--batch-size", type=int, default=default, help=help)


def add_window_args(p: argparse.ArgumentParser) -> None:
    add_seq_len_arg(p)
    p.add_argument("--stride", type=int, default=None, help="window stride in tokens (default: seq-len)")
    add_batch_size_arg(p)


CORPUS_FORMS = ("default (the standard library's documentation: prose), code (its Python source), a "
                ".txt/.jsonl/.parquet file, a directory of .txt, or hf:NAME[:CONFIG]:SPLIT")


def add_data_args(p: argparse.ArgumentParser, split: str = "test", data_help: str | None = None,
                  windows: bool = True, budget: bool = False) -> None:
    """``--data`` (default: the default corpus; ``data_help`` for an optional one: its default is none),
    ``--max-tokens`` (every command reads the same default budget, so their numbers are the report's; with
    ``budget`` its default is None: ``run`` picks it from the model's size) and (``windows``) the window options."""
    p.add_argument("--data", default=None if data_help else "default",
                   help=data_help or f"corpus ({split} split of the default corpus): {CORPUS_FORMS}")
    if windows:
        add_window_args(p)
    default = (f"the most, up to {DEFAULT_MAX_TOKENS:,}, that keeps the run near 25 minutes on 2 CPU cores: "
               f"{DEFAULT_MAX_TOKENS:,} on the shipped model, 1,024 in windows of 128 on SmolLM2-135M"
               if budget else f"{DEFAULT_MAX_TOKENS}, as in run")
    p.add_argument("--max-tokens", type=int, default=None if budget else DEFAULT_MAX_TOKENS,
                   help=f"use only the first K tokens of each corpus (default: {default}; 0: all)")
    p.set_defaults(split=split)


def add_score_data_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--score-data", default="default",
                   help=f"corpus for {what}, its validation split: {CORPUS_FORMS} (default: default)")


def add_seed_arg(p: argparse.ArgumentParser, help: str = "seed of the random baseline and the bootstrap") -> None:
    p.add_argument("--seed", type=int, default=0, help=help)


def add_streaming_args(p: argparse.ArgumentParser, window: int | None = 256, window_note: str = "") -> None:
    """``--sink`` and ``--window``: what a streaming head keeps (the context scores ctx_stream, ctx_gate,
    ctx_retrieval; headprune.models.streaming); ``window``: --window's default (None: the command derives it)."""
    p.add_argument("--sink", type=int, default=4,
                   help="tokens at the start of each window that a streaming head keeps (the ctx_* scores)")
    p.add_argument("--window", type=int, default=window,
                   help="recent tokens a streaming head keeps before each position (the ctx_* scores); --sink + "
                        f"--window must be shorter than --seq-len{window_note}")


def add_gate_lr_arg(p: argparse.ArgumentParser, flag: str = "--gate-lr") -> None:
    p.add_argument(flag, type=float, default=0.1, dest="gate_lr",  # 0.1 = headprune.pruning.gates.LR
                   help="Adam learning rate of the gates' log alpha")


def add_bootstrap_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", type=int, default=200, metavar="N",
                   help="bootstrap replicates (resampled windows) for the 95%% intervals: "
                        "0 (no intervals) or at least 40")


def add_verification_args(p: argparse.ArgumentParser, together: str, default_subsets: int, zero: str = "") -> None:
    """``--verify`` (heads the estimate ranks first, checked exactly) and ``--bound-subsets`` (random subsets of
    the rest, ``together`` (patched/ablated) at once, for the bound on what they can hide; ``zero``: what 0
    means, where allowed)."""
    p.add_argument("--verify", type=int, default=None,
                   help="heads the estimate ranks first that are checked exactly before bounding what the rest can "
                        "hide (default 10%% of the heads)")
    p.add_argument("--bound-subsets", type=int, default=default_subsets,
                   help=f"random subsets of the unverified heads {together} together for that bound (AtP*'s "
                        f"subsampling diagnostic{zero})")


def add_fraction_args(p: argparse.ArgumentParser, seeds: int = DEFAULT_SEEDS, fractions=DEFAULT_FRACTIONS) -> None:
    p.add_argument("--fractions", default=",".join(map(str, fractions)),
                   help="comma-separated fractions of all heads to prune, each in [0, 1]")
    p.add_argument("--seeds", type=int, default=seeds, help="random-baseline seeds (its curve is their mean and std)")


def add_out_arg(p: argparse.ArgumentParser, help: str, default: str | None = None) -> None:
    p.add_argument("--out", required=default is None, default=default, help=help)


def add_pattern_arg(p: argparse.ArgumentParser) -> None:
    """``--pattern``: a streaming pattern that ``headprune context`` wrote."""
    p.add_argument("--pattern", help="a streaming pattern (headprune context's pattern/ folder or its "
                                     "kv_pattern.json): its KV heads keep only their sinks and recent window")


def add_quiet_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_json_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true", help=f"print {what}")


def add_scores_arg(p: argparse.ArgumentParser, help: str = "scores table (.csv/.parquet) from headprune score",
                   required: bool = False) -> None:
    p.add_argument("--scores", required=required, help=help)


def add_method_arg(p: argparse.ArgumentParser, help: str, choices: tuple[str, ...] | None = None) -> None:
    """``--method``: one method (``choices`` with the first the default; else none by default)."""
    p.add_argument("--method", choices=choices, default=choices[0] if choices else None, help=help)


#: the formats a pruned model is written in (``prune``, ``finetune``)
EXPORT_FORMATS = ("native", "hf", "gguf")


def add_format_arg(p: argparse.ArgumentParser, help: str, default: str | None = "native") -> None:
    p.add_argument("--format", choices=EXPORT_FORMATS, default=default, help=help)


def add_methods_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--methods", default="all", help=help)


def add_ablation_rows_arg(p: argparse.ArgumentParser, copies: str = "ablated copies x windows", cpu: int = 8) -> None:
    p.add_argument("--ablation-rows", type=int, default=None,
                   help=f"{copies} per forward (default {cpu} on the CPU, 64 on a GPU)")


def add_gate_steps_arg(p: argparse.ArgumentParser, help: str, default: int | None = 200) -> None:
    p.add_argument("--gate-steps", type=int, required=default is None, default=default, help=help)


def add_compensate_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--compensate", choices=["none", "mean", "optimal"], default="none", help=help)


def add_train_data_arg(p: argparse.ArgumentParser,
                       help: str = f"training corpus (train split of the default corpus): {CORPUS_FORMS}") -> None:
    p.add_argument("--train-data", default="default", help=help)


def add_run_flags(p: argparse.ArgumentParser, out_help: str, out_default: str | None = None,
                  overwrite_help: str = "discard the progress of a different earlier run") -> None:
    add_out_arg(p, out_help, out_default)
    p.add_argument("--overwrite", action="store_true", help=overwrite_help)
    add_quiet_arg(p)


def add_selection_args(p: argparse.ArgumentParser, seed_help: str = "seed of the random baseline and the bootstrap"
                       ) -> None:
    p.add_argument("--per-layer", action="store_true", help="prune the same fraction/count in every layer")
    p.add_argument("--normalize", choices=["layer"], default=None,
                   help="divide each layer's scores by their L2 norm before global ranking (Michel et al.)")
    p.add_argument("--standardize", action="store_true", help="rank by per-layer z-scores (FLAP)")
    add_seed_arg(p, seed_help)
    add_score_data_arg(p, "mean compensation and re-scoring")


def add_anatomy_args(p: argparse.ArgumentParser) -> None:
    """The induction probe (random tokens repeated twice) and how much corpus text ``anatomy`` reads."""
    p.add_argument("--probe-length", type=int, default=32,
                   help="length of the random token sequence that the induction probe repeats twice")
    p.add_argument("--probe-count", type=int, default=8, help="number of repeated random sequences in the probe")
    add_seed_arg(p, "seed of the probe's random tokens")
    p.add_argument("--rows", type=int, default=8,
                   help="corpus windows (of --seq-len tokens) for the corpus roles and the logit attribution")


#: The smallest value of every integer option, by its argparse dest: each command checks all it has, the same way.
MINIMUMS = {"batch_size": 1, "seeds": 1, "ablation_rows": 1, "count": 0, "steps": 1,
            "seed": 0, "seq_len": 1, "bootstrap": 0, "probe_length": 2, "probe_count": 1, "rows": 1,
            "train_steps": 1, "checkpoint_every": 1, "max_train_tokens": 2, "recover": 0}
#: The largest: beyond these, sizes only allocate absurd memory (a shape trace of B x h x T x T floats).
MAXIMUMS = {"seq_len": 1 << 16, "batch_size": 1 << 16, "ablation_rows": 1 << 16, "seeds": 10_000,
            "bootstrap": 100_000, "probe_count": 1 << 16, "rows": 1 << 16}


#: The fewest bootstrap replicates a command accepts (besides 0): each 2.5% tail of a 95% percentile interval then
#: holds at least one replicate (40 · 0.025 = 1); with fewer, an endpoint is the most extreme replicate itself, and
#: with 1 replicate the "interval" is that replicate, which need not contain the estimate.
MIN_REPLICATES = 40


def check_counts(args) -> None:
    """The numeric options of every command, checked before any work (one rule per option, in every command)."""
    for dest, low in MINIMUMS.items():
        value = getattr(args, dest, None)
        if value is not None and value < low:
            raise HeadpruneError(f"{dest} {value} must be at least {low}", dest)
        if value is not None and dest in MAXIMUMS and value > MAXIMUMS[dest]:
            raise HeadpruneError(f"{dest} {value} is too large; use at most {MAXIMUMS[dest]}", dest)
    if (b := getattr(args, "bootstrap", None)) is not None and 0 < b < MIN_REPLICATES:
        raise HeadpruneError(f"bootstrap {b} is too few replicates for a 95% percentile interval: use 0 (no "
                             f"intervals) or at least {MIN_REPLICATES}", "bootstrap")
    if (fraction := getattr(args, "fraction", None)) is not None and not 0 <= fraction <= 1:
        raise HeadpruneError(f"--fraction {fraction} must lie in [0, 1]")
    max_tokens = getattr(args, "max_tokens", None)
    if max_tokens is not None and max_tokens < 2 and max_tokens != 0:
        raise HeadpruneError(f"max_tokens {max_tokens} must be at least 2 (or 0: all)", "max_tokens")


def add_finetune_args(p: argparse.ArgumentParser) -> None:
    """The recipe of ``headprune finetune`` (see headprune.pruning.finetune.Recipe)."""
    add_train_data_arg(p)
    p.add_argument("--max-train-tokens", type=int, default=None,
                   help="use only the first K training tokens (default: all)")
    p.add_argument("--teacher", default=None,
                   help="the unpruned model to distil from: zoo name, directory or hub id "
                        "(without it: plain fine-tuning)")
    p.add_argument("--distill-weight", type=float, default=None,
                   help="alpha in (1-alpha) CE + alpha T^2 KL(teacher || student), in [0, 1] "
                        "(default: 0.5 with --teacher)")
    p.add_argument("--temperature", type=float, default=2.0, help="softmax temperature T of the distillation KL")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate of AdamW")
    p.add_argument("--warmup", type=int, default=None, help="linear warmup steps, then cosine decay to 0.1 lr "
                                                            "(default: 10%% of --steps)")
    add_seq_len_arg(p, help="training window length in tokens (default: the model's n_positions, at most 1024; "
                            "evaluation uses the default windows)")
    add_batch_size_arg(p, help="training windows per step (and evaluation windows per forward)")
    add_seed_arg(p, "seed of the training batches (which windows each step sees)")
    p.add_argument("--checkpoint-every", type=int, default=50, help="write the resumable checkpoint every N steps")


def add_gguf_type_arg(p: argparse.ArgumentParser) -> None:
    """``--gguf-type``: the GGUF export's tensor type (:mod:`headprune.io.write.gguf_types` says why its default)."""
    from headprune.io.write.gguf_types import DEFAULT_GGUF_TYPE, GGUF_TYPES

    p.add_argument("--gguf-type", choices=GGUF_TYPES, default=DEFAULT_GGUF_TYPE,
                   help="--format gguf: the type of its matrices (norms and biases stay f32); q8_0 is half f16's "
                        "size for +0.002 nats/token on SmolLM2 in llama.cpp")
