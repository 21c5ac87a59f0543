"""The ``headprune finetune`` command: recover a pruned export by fine-tuning (:mod:`.finetune`), measured on the
test split before and after, written back in the export's own format.

The share of the perplexity gap recovered (:func:`gap_recovered`) compares three perplexities on the same
evaluation data: the unpruned model's P₀, the pruned model's P_p and the recovered model's P_r:

    share = (P_p − P_r) / (P_p − P₀)        1: back to the unpruned model, 0: no better than pruned, > 1: better.
"""

from __future__ import annotations

import math
from pathlib import Path

from .errors import HeadpruneError

CHECKPOINT_SUFFIX = ".finetune-checkpoint.pt"


def gap_recovered(unpruned_ppl: float, pruned_ppl: float, recovered_ppl: float) -> float:
    """(P_p − P_r) / (P_p − P₀); NaN where pruning cost nothing (no gap)."""
    gap = pruned_ppl - unpruned_ppl
    return (pruned_ppl - recovered_ppl) / gap if gap > 0 else math.nan


def same_data(train_spec: str, train_split: str, eval_spec: str, eval_split: str) -> bool:
    """Whether two corpus specs name the same text: the default corpus by split, a path by its real location,
    anything else (``hf:NAME:CONFIG:SPLIT``) by its spec."""
    if train_spec == "default" or eval_spec == "default":
        return train_spec == eval_spec and train_split == eval_split
    if train_spec.startswith("hf:") or eval_spec.startswith("hf:"):
        return train_spec == eval_spec
    return Path(train_spec).expanduser().resolve() == Path(eval_spec).expanduser().resolve()


def refuse_same_data(train_spec: str, eval_spec: str, train_ids, eval_ids) -> None:
    """HeadpruneError where the training data is the evaluation data (by name, or token for token)."""
    from .corpus import token_digest

    if same_data(train_spec, "train", eval_spec, "test") or token_digest(train_ids) == token_digest(eval_ids):
        raise HeadpruneError(f"the training data {train_spec!r} is the evaluation data {eval_spec!r} (test split): "
                             "fine-tuning on it would overstate recovery; give another --train-data or --data")


def checkpoint_path(out: str) -> Path:
    """The fine-tune's resumable checkpoint beside the output folder ``out``."""
    out_path = Path(out).absolute()
    return out_path.with_name(out_path.name + CHECKPOINT_SUFFIX)


def run_finetune(args) -> dict:
    """The ``finetune`` command: returns the summary it prints (before/after perplexity, losses, output)."""
    from .checkpoint import _check_target
    from .corpus import corpus_ids
    from .finetune import Recipe, export_recovered, finetune, load_pruned
    from .loading import load_model, model_tokenizer
    from .outputs import check_writable
    from .perplexity import evaluate

    if args.distill_weight is not None and args.teacher is None:
        raise HeadpruneError("--distill-weight needs --teacher ORIGINAL (the unpruned model to distil from)")
    out = check_writable(args.out)
    if Path(args.pruned).expanduser().is_dir() and out.resolve() == Path(args.pruned).expanduser().resolve():
        raise HeadpruneError(f"--out {args.out} is PRUNED_DIR itself; write the recovered model to another folder")
    _check_target(out, args.overwrite)
    ckpt = checkpoint_path(args.out)
    check_writable(ckpt, file=True)
    model, marker = load_pruned(args.pruned, args.device, args.dtype)
    teacher = load_model(args.teacher, args.device, args.dtype) if args.teacher is not None else None
    alpha = (0.5 if args.distill_weight is None else args.distill_weight) if teacher is not None else 0.0
    recipe = Recipe(steps=args.train_steps, lr=args.lr, warmup=args.warmup, batch_size=args.batch_size,
                    seq_len=args.seq_len, seed=args.seed, distill_weight=alpha, temperature=args.temperature,
                    checkpoint_every=args.checkpoint_every).resolve(model.cfg.n_positions)
    tok = model_tokenizer(model)
    train_ids = corpus_ids(args.train_data, "train", tok, args.max_train_tokens)
    eval_ids = corpus_ids(args.data, "test", tok, args.max_tokens)
    refuse_same_data(args.train_data, args.data, train_ids, eval_ids)
    fmt = args.format or marker.get("format", "native")
    n = model.cfg.n_positions
    measure = lambda m: evaluate(m, eval_ids, n, n, recipe.batch_size, progress=not args.quiet).as_dict()
    before = measure(model)
    teacher_ppl = measure(teacher) if teacher is not None else None
    result = finetune(model, train_ids, recipe, teacher, ckpt, overwrite=args.overwrite, show_progress=not args.quiet)
    after = measure(model)
    info = {"recipe": recipe.as_dict(), "train_data": args.train_data, "train_tokens": len(train_ids),
            "teacher": args.teacher, "eval_data": args.data, "before": before, "after": after,
            "teacher_eval": teacher_ppl, "first_loss": result.losses[0], "last_loss": result.losses[-1]}
    if teacher_ppl is not None:
        info["gap_recovered"] = gap_recovered(teacher_ppl["ppl"], before["ppl"], after["ppl"])
    export_recovered(model, out, fmt, marker, info, overwrite=args.overwrite)
    ckpt.unlink(missing_ok=True)  # only once the recovered model is safely written
    return {"out": str(out), "format": fmt, **info}


def format_summary(s: dict) -> str:
    """The lines ``headprune finetune`` prints."""
    r = s["recipe"]
    kind = f"distilled (alpha {r['distill_weight']:g}, T {r['temperature']:g})" if r["distill_weight"] else "fine-tuned"
    lines = [(f"{kind} {r['steps']} steps on {s['train_data']} (train split, {s['train_tokens']:,} tokens): loss "
              f"{s['first_loss']:.4f} -> {s['last_loss']:.4f}"),
             (f"test perplexity on {s['eval_data']} ({s['before']['tokens']:,} tokens): {s['before']['ppl']:.3f} -> "
              f"{s['after']['ppl']:.3f} (delta NLL {s['after']['nll'] - s['before']['nll']:+.4f} nats/token)")]
    if s.get("teacher_eval"):
        lines.append(f"teacher (unpruned) perplexity {s['teacher_eval']['ppl']:.3f}: "
                     f"{100 * s['gap_recovered']:.1f}% of the pruning gap recovered")
    lines.append(f"saved {s['format']} checkpoint -> {s['out']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- curve --recover


def curve_train_ids(args, model, eval_ids):
    """The training tokens of ``curve --recover`` (``--train-data``, train split), refused where they are the
    evaluation data; checked before any work."""
    from .corpus import corpus_ids
    from .loading import model_tokenizer

    train_ids = corpus_ids(args.train_data, "train", model_tokenizer(model))
    refuse_same_data(args.train_data, args.data, train_ids, eval_ids)
    return train_ids


def recovered_curves(model, train_ids, steps: int, show_progress: bool, **curve_args):
    """:func:`headprune.curves.pruning_curves` with every pruned model fine-tuned ``steps`` steps (the default
    :class:`headprune.finetune.Recipe`, seeded) before it is evaluated; random is left out (one ranking per
    fraction and method is enough to compare before and after). Training is seeded by ``curve_args["seed"]``."""
    from .curves import pruning_curves
    from .finetune import Recipe, finetune
    from .schema import RANDOM

    recipe = Recipe(steps=steps, seed=curve_args.get("seed", 0))
    variants = [v for v in curve_args.pop("variants") if v[0] != RANDOM]
    train = lambda pruned: finetune(pruned, train_ids, recipe, show_progress=False)
    return pruning_curves(model, variants=variants, recover=train, recover_steps=steps, show_progress=show_progress,
                          **curve_args)
