"""What an export keeps of the checkpoint its model was loaded from (``model.origin.folder``): the special token
ids of its config.json, and the number format of its weights unless the caller asks for another.

The model may compute in another dtype (``load_model`` loads in float32 by default): a checkpoint stored in
float16 and loaded in float32 holds float16-representable values, so writing them back in float16 is exact
(float16 -> float32 -> float16 is the identity); constants fitted in float32 (mean compensation, folded value
biases) are rounded once, to the nearest float16."""

from __future__ import annotations

import torch
from torch import Tensor

from headprune.errors import HeadpruneError

#: The config.json keys an export copies from its source when the source has them (transformers otherwise fills
#: GPT-2's defaults, 50256, which lie outside a smaller vocabulary).
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def source_token_ids(model) -> dict:
    """``bos_token_id``/``eos_token_id``/``pad_token_id`` of the source config.json, those it has."""
    from headprune.io.read.loading import parse_config_json

    folder = model.origin.folder
    if folder is None or not (folder / "config.json").is_file():
        return {}
    hf = parse_config_json(folder)
    return {key: hf[key] for key in TOKEN_ID_KEYS if key in hf}


def export_dtype(model, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """``dtype`` when given; else the source checkpoint's (the floating dtype holding most of its numbers, read
    from the weight files' headers); else, with no readable source, the model's own."""
    from headprune.io.read.checkpoint import CheckpointReader
    from headprune.io.read.loading import resolve_dtype

    if dtype is not None:
        return resolve_dtype(dtype)
    if model.origin.folder is not None:
        try:
            found = CheckpointReader(model.origin.folder).float_dtype()
        except HeadpruneError:  # the source folder lost its weights since loading: nothing to keep
            found = None
        if found is not None:
            return found
    return model.dtype


def cast_floats(state: dict[str, Tensor], dtype: torch.dtype) -> dict[str, Tensor]:
    """``state`` with every floating tensor in ``dtype`` (contiguous; integer buffers as they are)."""
    return {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous() for k, v in state.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """``float16`` for ``torch.float16``: the spelling of config.json's ``dtype``."""
    return str(dtype).removeprefix("torch.")
