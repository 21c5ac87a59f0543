"""``headprune finetune``: recover a pruned model by fine-tuning or distillation."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from headprune.cli.options import (
    CORPUS_FORMS,
    add_data_args,
    add_device_args,
    add_finetune_args,
    add_fold_arg,
    add_format_arg,
    add_gguf_type_arg,
    add_json_arg,
    add_run_flags,
)
from headprune.errors import HeadpruneError

if TYPE_CHECKING:
    from headprune.models.base import HeadModel
    from headprune.pruning.finetune import Recipe

HELP = 'recover a pruned model by fine-tuning or distillation'


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("pruned", metavar="PRUNED_DIR", help="a pruned export (headprune prune --out), native or hf format")
    p.add_argument("--steps", type=int, required=True, dest="train_steps", metavar="N", help="AdamW steps")
    add_format_arg(p, "native, hf or gguf (--out FILE.gguf, for llama.cpp) (default: the format of PRUNED_DIR)",
                   default=None)
    add_gguf_type_arg(p)
    add_finetune_args(p)
    add_data_args(p, "test", windows=False,
                  data_help=f"evaluation corpus (test split of the default corpus): {CORPUS_FORMS}")
    p.set_defaults(data="default")
    add_device_args(p)
    add_run_flags(p, "output directory for the recovered checkpoint",
                  overwrite_help="discard the checkpoint of a different earlier fine-tune and replace --out")
    add_fold_arg(p)
    add_json_arg(p, "one JSON object (recipe, perplexity before and after)")


def run(args: argparse.Namespace) -> None:
    import json

    summary = run_finetune(args)
    print(json.dumps(summary) if args.json else format_summary(summary))


CHECKPOINT_SUFFIX = ".finetune-checkpoint.pt"


def checkpoint_path(out: str) -> Path:
    """The fine-tune's resumable checkpoint beside the output folder ``out``."""
    out_path = Path(out).absolute()
    return out_path.with_name(out_path.name + CHECKPOINT_SUFFIX)


def run_finetune(args: argparse.Namespace) -> dict:
    """The ``finetune`` command: returns the summary it prints (before/after perplexity, losses, output)."""
    from headprune.data.overlap import refuse_same_data
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.perplexity import Windowing, evaluate
    from headprune.pruning.finetune import finetune, load_pruned
    from headprune.runtime import configure_allocator
    from headprune.schema import gap_recovered

    out, ckpt = _checked_targets(args)
    model, marker = load_pruned(args.pruned, args.device, args.dtype, args.fold_value_bias)
    if args.format == "gguf":  # the family and the tokenizer's GGUF, before the training
        from headprune.io.write.gguf import check_exportable

        check_exportable(model)
    configure_allocator(model)
    teacher = _teacher(args, model, marker) if args.teacher is not None else None
    recipe = _recipe(args, model, distil=teacher is not None)
    tok = model_tokenizer(model)
    train_ids = corpus_ids(args.train_data, "train", tok, args.max_train_tokens)
    eval_ids = corpus_ids(args.data, "test", tok, args.max_tokens or None)
    refuse_same_data(args.train_data, args.data, train_ids, eval_ids, tok)
    windows = Windowing.for_model(model, batch_size=recipe.batch_size)
    measure = lambda m: evaluate(m, eval_ids, windows, progress=not args.quiet).as_dict()
    before = measure(model)
    teacher_ppl = measure(teacher) if teacher is not None else None
    result = finetune(model, train_ids, recipe, teacher, ckpt, overwrite=args.overwrite, show_progress=not args.quiet)
    after = measure(model)
    info = {"recipe": recipe.as_dict(), "train_data": args.train_data, "train_tokens": len(train_ids),
            "teacher": args.teacher, "eval_data": args.data, "before": before, "after": after,
            "teacher_eval": teacher_ppl, "first_loss": result.losses[0], "last_loss": result.losses[-1]}
    if teacher_ppl is not None:
        info["gap_recovered"] = gap_recovered(teacher_ppl["ppl"], before["ppl"], after["ppl"])
    fmt = _write_recovered(args, model, out, marker, info)
    ckpt.unlink(missing_ok=True)  # only once the recovered model is safely written
    return {"out": str(out), "format": fmt, **info}


def _checked_targets(args: argparse.Namespace) -> tuple[Path, Path]:
    """(output path, resumable checkpoint path), both checked writable before any work: --distill-weight needs
    --teacher, a gguf output is one FILE.gguf, the output is not PRUNED_DIR itself, and a folder output may be
    replaced."""
    from headprune.io.work.files import check_writable
    from headprune.io.write.export_folder import check_export_target

    if args.distill_weight is not None and args.teacher is None:
        raise HeadpruneError("--distill-weight needs --teacher ORIGINAL (the unpruned model to distil from)")
    gguf = args.format == "gguf"
    if gguf and not str(args.out).lower().endswith(".gguf"):
        raise HeadpruneError(f"--format gguf writes one file: give --out a name ending in .gguf (got {args.out})")
    out = check_writable(args.out, file=gguf)
    if Path(args.pruned).expanduser().is_dir() and out.resolve() == Path(args.pruned).expanduser().resolve():
        raise HeadpruneError(f"--out {args.out} is PRUNED_DIR itself; write the recovered model to another folder")
    if not gguf:
        check_export_target(out, args.overwrite)
    ckpt = checkpoint_path(args.out)
    check_writable(ckpt, file=True)
    return out, ckpt


def _teacher(args: argparse.Namespace, model: HeadModel, marker: dict) -> HeadModel:
    """The unpruned model to distil from (--teacher), loaded as the export's source was (value biases folded or
    not, per ``marker``), checked to be that source, then folded where --fold-value-bias asks and the source was
    not."""
    from headprune.io.read.loading import load_model
    from headprune.pruning.provenance import check_teacher

    folded = bool(marker.get("fold_value_bias"))
    teacher = load_model(args.teacher, device=args.device, dtype=args.dtype, fold_value_bias=folded)
    check_teacher(teacher, model, marker, args.teacher)
    if args.fold_value_bias and not folded:
        from headprune.models.folding import fold_value_biases_

        fold_value_biases_(teacher)
    return teacher


def _recipe(args: argparse.Namespace, model: HeadModel, distil: bool) -> Recipe:
    """The training recipe of the command's options, resolved for ``model``: distillation weight alpha
    (--distill-weight, default 0.5) with a teacher, 0 without."""
    from headprune.pruning.finetune import Recipe

    alpha = (0.5 if args.distill_weight is None else args.distill_weight) if distil else 0.0
    return Recipe(steps=args.train_steps, lr=args.lr, warmup=args.warmup, batch_size=args.batch_size,
                  seq_len=args.seq_len, seed=args.seed, distill_weight=alpha, temperature=args.temperature,
                  checkpoint_every=args.checkpoint_every).resolve(model.cfg.n_positions,
                                                                    model.origin.bos_token_id is not None)


def _write_recovered(args: argparse.Namespace, model: HeadModel, out: Path, marker: dict, info: dict) -> str:
    """Write the recovered ``model`` to ``out`` with the fine-tune's ``info`` in its metadata: one gguf file, or an
    export folder in --format (default: PRUNED_DIR's); returns the format written."""
    from headprune.pruning.finetune import export_recovered

    fmt = args.format or marker.get("format", "native")
    if args.format == "gguf":
        from headprune.io.write.gguf import export_gguf

        meta = {k: v for k, v in marker.items() if k not in ("format", "source", "removed_heads", "dtype")}
        export_gguf(model, out, gguf_type=args.gguf_type, metadata={**meta, "finetune": info})
    else:
        export_recovered(model, out, fmt, marker, info, overwrite=args.overwrite)
    return fmt


def format_summary(s: dict) -> str:
    """The lines ``headprune finetune`` prints."""
    import math

    r = s["recipe"]
    kind = f"distilled (alpha {r['distill_weight']:g}, T {r['temperature']:g})" if r["distill_weight"] else "fine-tuned"
    lines = [(f"{kind} {r['steps']} steps on {s['train_data']} (train split, {s['train_tokens']:,} tokens): loss "
              f"{s['first_loss']:.4f} -> {s['last_loss']:.4f}"),
             (f"test perplexity on {s['eval_data']} ({s['before']['tokens']:,} tokens): {s['before']['ppl']:.3f} -> "
              f"{s['after']['ppl']:.3f} (delta NLL {s['after']['nll'] - s['before']['nll']:+.4f} nats/token)")]
    if s.get("teacher_eval"):
        gap = s["gap_recovered"]
        said = (f"{100 * gap:.1f}% of the pruning gap recovered" if not math.isnan(gap) else
                "pruning cost nothing against it (no gap to recover)")
        lines.append(f"teacher (unpruned) perplexity {s['teacher_eval']['ppl']:.3f}: {said}")
    lines.append(f"saved {s['format']} checkpoint -> {s['out']}")
    return "\n".join(lines)
