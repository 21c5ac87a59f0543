"""What every command does with its options: load the model, resolve the windows, read the data."""

from __future__ import annotations

import argparse
import math

from headprune.errors import HeadpruneError


def load_from_args(args, dtype: str | None = None):
    """``--model`` on ``--device`` in ``dtype`` (default ``--dtype``), with the allocator set for its size
    (:func:`headprune.runtime.configure_allocator`)."""
    from headprune.io.read.loading import load_model
    from headprune.runtime import configure_allocator

    model = load_model(args.model, device=args.device, dtype=dtype or args.dtype, fold_value_bias=args.fold_value_bias)
    configure_allocator(model)
    return model


def windowing_from_args(args, model):
    """The ``--seq-len/--stride/--batch-size`` of ``args``, resolved against ``model``."""
    from headprune.perplexity import Windowing

    return Windowing.for_model(model, args.seq_len, args.stride, args.batch_size)


def data_from_args(args, model, data: str | None = None, split: str | None = None):
    """Token ids (1-D) of ``data`` (default ``--data``, its ``--split``) for ``model``, cut to ``--max-tokens``."""
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.tokenizer import model_tokenizer

    return corpus_ids(data or args.data, split or args.split, model_tokenizer(model), args.max_tokens or None)


def data_line(label: str, source: str, split: str, ids, w=None) -> str:
    """The header line of a command that read ``ids``: which corpus, split and token count (and windows), so a
    number it prints can be matched to the report's (which reads the same default budget)."""
    from headprune.data.sources import is_builtin

    where = f" ({split} split)" if is_builtin(source) else ""
    windows = f"; windows: seq_len {w.seq_len}, stride {w.stride}" if w is not None else ""
    return f"{label}: {source}{where}, {len(ids):,} tokens{windows}"


def fill_source(args, score_ids) -> str:
    """Where compensation fills came from, said in the outputs: ``--score-data``'s validation split and its
    token count (without ``--score-data``: the default corpus' scoring split), or "" without compensation."""
    if score_ids is None:
        return ""
    from headprune.stages.settings import split_text

    given = "" if args.score_data != "default" else "; no --score-data given: the scoring split"
    return split_text(args.score_data, "validation", len(score_ids)) + given


def _json_number(x: float) -> float | None:
    """NaN as null: strict JSON has no NaN."""
    import math

    return None if math.isnan(x) else x


def check_gate_args(args, steps_flag: str, lr_flag: str) -> None:
    """``--sparsity`` (where the command has it) in [0, 1] and the gate steps >= 1, before any work."""
    sparsity = getattr(args, "sparsity", None)
    if sparsity is not None and not 0.0 <= sparsity <= 1.0:  # NaN fails too
        raise HeadpruneError(f"--sparsity {sparsity} must lie in [0, 1]")
    if args.gate_steps < 1:
        raise HeadpruneError(f"{steps_flag} {args.gate_steps} must be at least 1")
    if not (math.isfinite(args.gate_lr) and args.gate_lr > 0):
        raise HeadpruneError(f"{lr_flag} {args.gate_lr} must be a positive number")


def selection_from_args(args: argparse.Namespace):
    """``--per-layer``, ``--normalize``, ``--standardize`` and ``--seed`` as a :class:`Selection`."""
    from headprune.pruning.options import Selection

    return Selection(per_layer=args.per_layer, normalize=args.normalize, standardize=args.standardize, seed=args.seed)


def split_layer_ranking(method: str, args: argparse.Namespace, flag: str = "--method") -> str:
    """The scores column of ``method``, checking a ``NAME@layer`` ranking (the name the report and curves give the
    ranking by NAME's scores L2-normalised per layer: ``--method NAME --normalize layer``) against the options:
    refused with ``--normalize``/``--standardize`` (it says its normalisation itself) and for random and gate,
    which have no scores to normalise."""
    from headprune.pruning.gates import GATE
    from headprune.schema import RANDOM, split_ranking

    name, by_layer = split_ranking(method)
    if not by_layer:
        return method
    if args.normalize or args.standardize:
        given = "--normalize" if args.normalize else "--standardize"
        raise HeadpruneError(f"{flag} {method} already normalises each layer's scores; drop {given} "
                             f"(or rank by {flag} {name} {given}{' ' + args.normalize if args.normalize else ''})")
    if name in (RANDOM, GATE):
        raise HeadpruneError(f"{flag} {method}: {name} has no scores to normalise per layer; use {flag} {name}")
    return name


def layer_ranking_from_args(args: argparse.Namespace) -> None:
    """``--method NAME@layer`` read as ``--method NAME --normalize layer`` (in place; see
    :func:`split_layer_ranking`)."""
    if args.method is not None and (name := split_layer_ranking(args.method, args)) != args.method:
        args.method, args.normalize = name, "layer"


def print_estimate(model, methods: list[str], tokens: int, seq_len: int) -> None:
    """Say what scoring ``methods`` on ``tokens`` will cost here before spending it (:mod:`headprune.cost`), and
    past ten minutes which option makes it cheaper; nothing for the weight methods alone."""
    from headprune.cost import scoring_lines

    for line in scoring_lines(model, methods, tokens, seq_len):
        print(line, flush=True)


def open_finished_run(out: str):
    """A finished run's folder for a stage added to it (``layers``, ``long``): its path, settings.json record, its
    RunSettings and inputs (:func:`headprune.stages.inputs.reload_inputs`), refused where the run's tables are missing
    or the folder is not writable."""
    from pathlib import Path

    from headprune.errors import HeadpruneError
    from headprune.io.work.files import check_writable
    from headprune.stages.inputs import reload_inputs

    folder = Path(out)
    for name in ("scores.parquet", "curves.parquet"):
        if not (folder / name).is_file():
            raise HeadpruneError(f"{folder} holds no {name}: not the output folder of headprune run")
    check_writable(folder)
    return (folder, *reload_inputs(folder))


def finish_stage(folder, tables: dict, progress):
    """A stage's ``tables`` ({file name: table}) written into the run's ``folder``, its report re-rendered with them and
    the stage's ``progress`` file removed; the report's path."""
    from headprune.io.work.files import write_table
    from headprune.report import rebuild_report

    for name, table in tables.items():
        write_table(table, folder / name)
    report = rebuild_report(folder / "scores.parquet", folder / "curves.parquet", folder)
    progress.remove()
    return report
