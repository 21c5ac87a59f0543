"""GGUF files of the Llama, Qwen2 and Qwen3 architectures, written here from random transformers models (float32
tensors, llama.cpp's tensor names and metadata, its q/k row permutation for llama) and read back by headprune: the
logits equal the transformers model the file was written from, and transformers' own GGUF loader on the same
file. The packaged real models cover llama (Q4_1) and gemma3 (K-quants): tests/oracles/test_real_models.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from headprune.io.read.loading import load_model

SIZES = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
CASES = {"llama": (LlamaConfig, LlamaForCausalLM, {}), "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
         "qwen3": (Qwen3Config, Qwen3ForCausalLM, {}),
         # head_dim ≠ d/h: transformers 5.24's GGUF loader cannot read it (it sizes q_proj by d/h), so this case is
         # checked against the model the file was written from only
         "qwen3-head_dim": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 12})}
NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(key: str) -> str:
    """transformers' key -> llama.cpp's tensor name."""
    stem, kind = key.rsplit(".", 1)
    if stem == "model.embed_tokens":
        return f"token_embd.{kind}"
    if stem == "model.norm":
        return f"output_norm.{kind}"
    if stem == "lm_head":
        return f"output.{kind}"
    _, _, layer, inner = stem.split(".", 3)
    return f"blk.{layer}.{NAMES[inner]}.{kind}"


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (its rotary layout)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch: str, hf) -> None:
    cfg = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers), w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size), w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads), w.add_head_count_kv(cfg.num_key_value_heads)
    d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(d_head), w.add_value_length(d_head)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"])), w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    tokens = [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(cfg.vocab_size)]
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("default"), w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens)), w.add_token_merges(["a a", "b b"])
    w.add_bos_token_id(0), w.add_eos_token_id(1)
    for key, value in hf.state_dict().items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        array = value.detach().float().numpy().copy()
        if arch == "llama" and key.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in key else cfg.num_key_value_heads
            array = llama_cpp_permute(array, heads)
        w.add_tensor(gguf_name(key), array)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_gguf_of_a_family_reads_back_as_its_model(case, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_MODELS", str(tmp_path / "cache"))
    cfg_cls, model_cls, extra = CASES[case]
    arch = case.split("-")[0]
    torch.manual_seed(sorted(CASES).index(case))
    hf = model_cls(cfg_cls(**SIZES, **extra)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    write_gguf(tmp_path / "m.gguf", arch, hf)
    ours = load_model(tmp_path / "m.gguf")
    x = torch.randint(2, SIZES["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = hf(x).logits, ours(x)
    assert want.abs().max() > 0.1
    assert (got - want).abs().max() <= 1e-5  # the model the file was written from
    if "head_dim" not in extra:
        oracle = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32).eval()
        with torch.no_grad():
            assert (got - oracle(x).logits).abs().max() <= 1e-5  # transformers' own reading of the file
