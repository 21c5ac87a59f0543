"""What the GGUF reader undoes, by hand on a small real file (fast; the real Gemma 3 checks it end to end, slowly):
Gemma 3's RMSNorm weights are stored as 1 + w, and llama's q/k rows are permuted for llama.cpp's rotary layout."""

from __future__ import annotations

import gguf
import numpy as np

from headprune.io.read.gguf import _open, _state
from headprune.models.families import gguf_arch

RNG = np.random.default_rng(0)
NORM = RNG.normal(size=8).astype(np.float32)
Q = RNG.normal(size=(8, 8)).astype(np.float32)  # 2 heads of 4 rows


def _file(path, arch: str):
    w = gguf.GGUFWriter(str(path), arch)
    for name, value in {"blk.0.attn_norm.weight": NORM, "output_norm.weight": NORM, "blk.0.attn_q.weight": Q}.items():
        w.add_tensor(name, value)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return _open(path)


def test_gemma3_norms_lose_the_stored_one(tmp_path):
    state = _state(_file(tmp_path / "g.gguf", "gemma3"), gguf_arch("gemma3_text"),
                   {"model_type": "gemma3_text", "num_attention_heads": 2, "num_key_value_heads": 1})
    np.testing.assert_array_equal(state["model.layers.0.input_layernorm.weight"].numpy(), NORM - 1.0)
    np.testing.assert_array_equal(state["model.norm.weight"].numpy(), NORM - 1.0)
    np.testing.assert_array_equal(state["model.layers.0.self_attn.q_proj.weight"].numpy(), Q)  # not permuted


def test_llama_q_rows_return_to_transformers_order(tmp_path):
    state = _state(_file(tmp_path / "l.gguf", "llama"), gguf_arch("llama"),
                   {"model_type": "llama", "num_attention_heads": 2, "num_key_value_heads": 1})
    # llama.cpp stored, per head of 4 rows, the rows (0, 2, 1, 3) of transformers' order: pairs interleaved
    want = Q[[0, 2, 1, 3, 4, 6, 5, 7]]
    np.testing.assert_array_equal(state["model.layers.0.self_attn.q_proj.weight"].numpy(), want)
    np.testing.assert_array_equal(state["model.layers.0.input_layernorm.weight"].numpy(), NORM)  # no offset
