"""Whether training text is the evaluation text: fine-tuning on what is evaluated would overstate recovery."""

from __future__ import annotations

from pathlib import Path

from headprune.errors import HeadpruneError


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
    from headprune.data.tokens import token_digest

    if same_data(train_spec, "train", eval_spec, "test") or token_digest(train_ids) == token_digest(eval_ids):
        raise HeadpruneError(f"the training data {train_spec!r} is the evaluation data {eval_spec!r} (test split): "
                             "fine-tuning on it would overstate recovery; give another --train-data or --data")
