"""GGUF metadata that disagrees with its tensors, and partial rotary: refused in one line before any reshape, naming
the key, its value and what the tensors imply (issue 52, 2). The untouched file reads back as its transformers
model."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from headprune.cli import main

SIZES = {"vocab_size": 40, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _name(key: str) -> str:
    stem, kind = key.rsplit(".", 1)
    fixed = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if stem in fixed:
        return f"{fixed[stem]}.{kind}"
    _, _, layer, inner = stem.split(".", 3)
    return f"blk.{layer}.{NAMES[inner]}.{kind}"


@pytest.fixture(scope="module")
def hf():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SIZES)).eval()


def write(path, hf, **meta):
    """The GGUF of ``hf`` (llama.cpp's names and q/k permutation), its ``llama.KEY`` metadata replaced by ``meta``
    (a str value is written as a string)."""
    cfg = hf.config
    values = {"block_count": 2, "context_length": 64, "embedding_length": 32, "feed_forward_length": 48,
              "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 8,
              "rope.dimension_count": 8} | {k.replace("__", "."): v for k, v in meta.items()}
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in values.items():
        (w.add_string if isinstance(value, str) else w.add_uint32)(f"llama.{key}", value)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"])), w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    tokens = [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(cfg.vocab_size)]
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("default"), w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens)), w.add_token_merges(["a a"]), w.add_bos_token_id(0), w.add_eos_token_id(1)
    for key, value in hf.state_dict().items():
        array = value.detach().float().numpy().copy()
        if key.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's rotary permutation
            h = 4 if "q_proj" in key else 2
            array = array.reshape(h, 2, array.shape[0] // h // 2, -1).swapaxes(1, 2).reshape(array.shape)
        w.add_tensor(_name(key), array)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


@pytest.mark.parametrize("meta, message", [
    ({"attention__head_count_kv": 3}, ("llama.attention.head_count_kv is 3, but its tensors imply 2 KV heads of 8 "
                                      "(blk.0.attn_k.weight has 16 rows)")),
    ({"attention__head_count_kv": 1}, "llama.attention.head_count_kv is 1, but its tensors imply 2 KV heads of 8"),
    ({"attention__head_count_kv": 0}, "llama.attention.head_count_kv is 0 (int), not a positive whole number"),
    ({"attention__head_count": 0}, "llama.attention.head_count is 0 (int), not a positive whole number"),
    ({"attention__head_count": 3}, ("llama.attention.head_count is 3, but its tensors imply 32 query rows "
                                   "(blk.0.attn_q.weight), not 3 heads × 8")),
    ({"context_length": "64"}, "llama.context_length is '64' (str), not a positive whole number"),
    ({"block_count": 3}, "llama.block_count is 3, but its tensors imply 2 blocks"),
    ({"embedding_length": 30}, "llama.embedding_length is 30, but its tensors imply 32 (token_embd.weight"),
    ({"feed_forward_length": 40}, "llama.feed_forward_length is 40, but its tensors imply 48"),
    ({"rope__dimension_count": 4}, "llama.rope.dimension_count is 4, less than its head size 8 (partial rotary)"),
    ({"rope__dimension_count": 16}, "llama.rope.dimension_count is 16, but its tensors imply at most the head size 8"),
])
def test_metadata_against_tensors_is_one_line(hf, meta, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADPRUNE_MODELS", str(tmp_path / "cache"))
    code = main(["info", "--model", str(write(tmp_path / "m.gguf", hf, **meta))])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("headprune: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert message in errors[0], errors[0]
    assert not any((tmp_path / "cache").rglob("config.json"))


def test_the_untouched_file_reads_back_as_its_model(hf, tmp_path, monkeypatch):
    """The control: the same writer with consistent metadata (rope.dimension_count = head size) is accepted."""
    from headprune.io.read.loading import load_model

    monkeypatch.setenv("HEADPRUNE_MODELS", str(tmp_path / "cache"))
    ours = load_model(write(tmp_path / "m.gguf", hf))
    x = torch.randint(2, SIZES["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = hf(x).logits, ours(x)
    assert want.abs().max() > 0.05 and float((got - want).abs().max()) <= 1e-5
    assert np.isfinite(got.numpy()).all()
