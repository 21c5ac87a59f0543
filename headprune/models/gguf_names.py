"""What llama.cpp calls a family's model and tensors, and what its converter changed: the GGUF part of a family's
record (:attr:`headprune.models.families.ModelFamily.gguf`). :mod:`headprune.io.read.gguf` undoes it when it reads
a GGUF file; a writer redoes it (its ``metadata`` writes the family's own keys).

* ``permute_qk`` (``llama``): the rows of q and k are permuted for llama.cpp's rotary layout,
  (h, 2, d_k/2, d) -> (h, d_k/2, 2, d).
* ``norm_offset`` (``gemma3``): every RMSNorm weight is stored as 1 + w (Gemma's norm multiplies by 1 + w).
* ``ffn_norm``: what llama.cpp's ``ffn_norm`` is in transformers (Gemma 3: the pre-feed-forward norm).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headprune.errors import HeadpruneError

#: llama.cpp's tensor name inside ``blk.{l}.`` -> transformers' inside ``model.layers.{l}.``
BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
#: llama.cpp's top-level tensor names -> transformers'
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _decoder_config(meta: Any, hf: dict, rope: dict) -> dict:
    """Config keys of a Llama-like GGUF beyond the shared ones: one rope parameter set, SiLU."""
    return {"rope_parameters": rope, "hidden_act": "silu"}


def _qwen2_config(meta: Any, hf: dict, rope: dict) -> dict:
    return _decoder_config(meta, hf, rope) | {"use_sliding_window": False}


def _gemma3_config(meta: Any, hf: dict, rope: dict) -> dict:
    """Gemma 3: a local rope for the sliding layers, one full-attention layer in six, the query scale llama.cpp
    fixes (d / h for the 27B model, 62 layers; d_head otherwise), GELU (tanh)."""
    n_layers, d, n_heads = hf["num_hidden_layers"], hf["hidden_size"], hf["num_attention_heads"]
    return {"rope_parameters": {"full_attention": rope,
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
            "sliding_window": int(meta.need("attention.sliding_window")), "sliding_window_pattern": 6,
            "query_pre_attn_scalar": d // n_heads if n_layers == 62 else hf["head_dim"],
            "hidden_activation": "gelu_pytorch_tanh",
            "final_logit_softcapping": meta.model("final_logit_softcapping"), "attn_logit_softcapping": None,
            "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layers)]}


def _decoder_metadata(cfg: Any) -> dict[str, Any]:
    """A Llama-like model's rope keys: its whole head rotated, the default or linear scaling."""
    rope = cfg.rope_scaling or {}
    meta = {"rope.dimension_count": cfg.d_head, "rope.freq_base": cfg.rope_theta}
    if rope.get("rope_type", "default") == "linear":
        meta |= {"rope.scaling.type": "linear", "rope.scaling.factor": float(rope["factor"])}
    elif rope.get("rope_type", "default") != "default":
        raise HeadpruneError(f"the model's rope scaling {rope.get('rope_type')!r} is not written to GGUF by headprune "
                             "(default and linear only)")
    return meta


def _gemma3_metadata(cfg: Any) -> dict[str, Any]:
    """Gemma 3's keys; what llama.cpp fixes rather than reads (one full-attention layer in six, the score scale
    1/√d_k, no final soft-capping) checked."""
    pattern = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(cfg.n_layers)]
    full, local = cfg.rope["full_attention"], cfg.rope["sliding_attention"]
    if cfg.layer_types != pattern or cfg.query_pre_attn_scalar != cfg.d_head or cfg.final_logit_softcapping \
            or local.get("rope_type", "default") != "default":
        raise HeadpruneError("llama.cpp's gemma3 fixes one full-attention layer in six, scores scaled by 1/√d_k, "
                             "no logit soft-capping and a plain local rope; this Gemma 3 model differs")
    meta = {"attention.sliding_window": cfg.sliding_window, "rope.freq_base": float(full["rope_theta"]),
            "rope.freq_base_swa": float(local["rope_theta"])}
    if full.get("rope_type", "default") == "linear":
        meta |= {"rope.scaling.type": "linear", "rope.scaling.factor": float(full["factor"])}
    return meta


@dataclass(frozen=True)
class GgufArch:
    """One family in llama.cpp's terms."""

    name: str  # general.architecture
    permute_qk: bool = False  # q/k rows permuted for llama.cpp's rotary layout
    norm_offset: float = 0.0  # stored RMSNorm weight = w + norm_offset (Gemma: 1 + w)
    ffn_norm: str = "post_attention_layernorm"  # what llama.cpp's ffn_norm is in transformers
    rope_theta_default: float = 10_000.0  # llama.cpp's rope.freq_base where the file has none
    bias_switch: bool = False  # q/k/v/o biases come from config.attention_bias (set where attn_q.bias exists)
    # what llama.cpp's graph of it runs: any uniform head count (qwen2: only h·d_k = d, so unpruned only), an
    # uneven prune as ``deci`` (Llama without q/k/v biases), an attn_output bias, sliding-window layers
    uniform_prunes: bool = True
    uneven_as_deci: bool = False
    output_bias: bool = False
    sliding_windows: bool = False
    # (GGUF metadata, the shared config keys, the rope parameters) -> the family's own config keys
    config: Callable[[Any, dict, dict], dict] = field(default=_decoder_config, compare=False)
    # (the model's config) -> the family's own ``{arch}.*`` keys a writer adds (rope; Gemma's windows)
    metadata: Callable[[Any], dict] = field(default=_decoder_metadata, compare=False)

    def hf_name(self, name: str) -> str | None:
        """transformers' key of a GGUF tensor name (None: not a weight transformers has)."""
        stem, _, kind = name.rpartition(".")  # kind: weight / bias
        if stem in TOP_NAMES:
            return f"{TOP_NAMES[stem]}.{kind}"
        parts = stem.split(".")
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
            inner = self.ffn_norm if parts[2] == "ffn_norm" else BLOCK_NAMES.get(parts[2])
            return f"model.layers.{parts[1]}.{inner}.{kind}" if inner else None
        return None


LLAMA = GgufArch("llama", permute_qk=True, bias_switch=True, uneven_as_deci=True, output_bias=True)
QWEN2 = GgufArch("qwen2", config=_qwen2_config, uniform_prunes=False)
QWEN3 = GgufArch("qwen3", bias_switch=True)
GEMMA3 = GgufArch("gemma3", norm_offset=1.0, ffn_norm="pre_feedforward_layernorm", rope_theta_default=1_000_000.0,
                  config=_gemma3_config, metadata=_gemma3_metadata, sliding_windows=True)
