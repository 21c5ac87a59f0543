"""A headprune model as an in-memory transformers model (the way back of :func:`headprune.io.read.in_memory.from_hf`):
what ``export_hf`` writes, loaded back by transformers (a pruned model at its original shapes with the removed heads
zeroed where the family cannot hold fewer)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from headprune.errors import HeadpruneError
from headprune.io.write.export import export_hf
from headprune.models.base import HeadModel

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def to_hf(model: HeadModel) -> PreTrainedModel:
    """A transformers ``*ForCausalLM`` (eval mode, on the model's device and dtype) computing what ``model``
    computes: :func:`headprune.io.write.export.export_hf` loaded back (a mean or optimal compensation is in b_O)."""
    from transformers import AutoModelForCausalLM

    if not isinstance(model, HeadModel):
        raise HeadpruneError(f"to_hf converts a headprune model; got {type(model).__name__}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_hf(model, Path(tmp) / "model", dtype=model.dtype)
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=model.dtype)
    hf.to(model.device)  # type: ignore[arg-type]  # transformers types .to() for its own arguments
    return hf.eval()
