"""Hugging Face GPT-2 names <-> ours: HF stores ``transformer.``-prefixed Conv1D weights ``[in, out]``; our names are
the same without the prefix, so loading is a key rename (:func:`convert_state_dict`) and an hf export the reverse."""

from __future__ import annotations

from typing import TypeVar

from torch import Tensor

from headprune.models.gpt2_config import ModelConfig

T = TypeVar("T")


def convert_state_dict(state: dict[str, T], cfg: ModelConfig) -> dict[str, T]:
    """Hugging Face GPT-2 keys -> ours: strip ``transformer.``, drop mask buffers, tie the LM head (the values,
    tensors or anything else, are kept as they are)."""
    out = {}
    for key, value in state.items():
        key = key.removeprefix("transformer.")
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of older checkpoints
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        out[key] = value
    return out


def hf_key(key: str) -> str:
    """Our key -> the Hugging Face GPT2LMHeadModel key (``transformer.`` prefix but for the LM head)."""
    return key if key.startswith("lm_head.") else "transformer." + key


def hf_tensors(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our keys -> Hugging Face GPT2LMHeadModel keys, contiguous CPU copies."""
    return {hf_key(k): v.detach().cpu().contiguous().clone() for k, v in state.items()}
