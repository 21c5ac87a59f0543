"""Tiny random-init checkpoints of every family (GPT-2, Llama with GQA and biases, Mistral with a sliding window,
Qwen2 with one KV head, Qwen3 with q/k norms, Gemma 3's sliding and global layers, GPT-NeoX with partial rotary),
saved in transformers' format and loaded by headprune, once per test session: (transformers model, ours,
(layer, KV head) a test streams)."""

from __future__ import annotations

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from headprune.io.read.loading import load_model

from helpers import TINY, save_hf_gpt2

VOCAB = 97
BASE = {"vocab_size": VOCAB, "num_hidden_layers": 2, "max_position_embeddings": 64, "initializer_range": 0.15}


def shape(d: int, h: int, kv: int | None, mlp: int, **extra) -> dict:
    return {"hidden_size": d, "num_attention_heads": h, "intermediate_size": mlp,
            **({} if kv is None else {"num_key_value_heads": kv}), **extra}


# name -> (config class, model class, kwargs, (layer, KV head) to stream)
CASES = {
    "gpt2": None,
    "llama-gqa2": (LlamaConfig, LlamaForCausalLM, shape(48, 6, 3, 64, attention_bias=True), (1, 1)),
    "mistral-window": (MistralConfig, MistralForCausalLM, shape(32, 4, 2, 48, sliding_window=11), (0, 1)),
    "qwen2-gqa3": (Qwen2Config, Qwen2ForCausalLM, shape(36, 3, 1, 40), (1, 0)),
    "qwen3-mha": (Qwen3Config, Qwen3ForCausalLM, shape(32, 4, 4, 40, head_dim=8), (0, 2)),
    "gemma3-sliding": (Gemma3TextConfig, Gemma3ForCausalLM, shape(
        32, 4, 2, 48, head_dim=12, sliding_window=9, layer_types=["sliding_attention", "full_attention"]), (0, 0)),
    "gemma3-global": (Gemma3TextConfig, Gemma3ForCausalLM, shape(
        32, 4, 2, 48, head_dim=12, sliding_window=9, layer_types=["sliding_attention", "full_attention"]), (1, 1)),
    "neox": (GPTNeoXConfig, GPTNeoXForCausalLM, shape(40, 5, None, 64, rotary_pct=0.5), (1, 3)),
}
_BUILT: dict = {}


def build(case: str, tmp_path_factory):
    """(transformers model, ours, (layer, KV head)), once per session."""
    if case not in _BUILT:
        folder = tmp_path_factory.mktemp(case)
        if CASES[case] is None:
            hf, target = save_hf_gpt2(folder, seed=2, **{**TINY, "vocab_size": VOCAB}), (1, 2)
        else:
            cfg_cls, model_cls, kwargs, target = CASES[case]
            torch.manual_seed(sorted(CASES).index(case))
            hf = model_cls(cfg_cls(**BASE, **kwargs)).eval()
            with torch.no_grad():
                for name, p in hf.named_parameters():
                    if name.endswith("bias") or "norm" in name:
                        p.add_(0.3 * torch.randn_like(p))
            hf.save_pretrained(folder)
        hf.set_attn_implementation("eager")
        _BUILT[case] = (hf, load_model(folder), target)
    return _BUILT[case]


