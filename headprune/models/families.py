"""The registry of model families: HF ``model_type`` -> config reader, model class, key mapping.

A new family is one module (a :class:`~.base.HeadModel` subclass and its config) plus one :data:`REGISTRY` entry.
Config readers accept both transformers 5's ``rope_parameters`` and the 4.x keys (``rope_theta``, ``rope_scaling``,
``rotary_pct``, ``rotary_emb_base``); they raise ValueError / KeyError / TypeError on a config they cannot use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.gemma3 import LAYER_TYPES, Gemma3, Gemma3Config
from headprune.models.gguf_names import GEMMA3, LLAMA, QWEN2, QWEN3, GgufArch
from headprune.models.gpt2 import GPT2
from headprune.models.gpt2_config import GPT2Config
from headprune.models.head_config import HeadConfig
from headprune.models.llama import LlamaLike, LlamaLikeConfig
from headprune.models.neox import NeoX, NeoXConfig
from headprune.models.rotary import SCALINGS


def _kept(hf: dict) -> dict:
    return {"kept_heads": [list(k) for k in hf.get("headprune_kept_heads", [])]}


#: transformers' max_position_embeddings where a config has none (its config classes' defaults)
DEFAULT_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "qwen3": 32768, "gemma3_text": 131072,
                     "gpt_neox": 2048}


def _positions(hf: dict) -> int:
    """max_position_embeddings as transformers reads it: the key's value, else its family config's default."""
    default = DEFAULT_POSITIONS.get(hf.get("model_type", ""))
    return hf["max_position_embeddings"] if default is None else hf.get("max_position_embeddings", default)


def _checked_rope(params: dict, hf: dict) -> dict:
    """One rope parameter set, checked as transformers' rope validation checks it (a type it knows, a positive
    θ, a positive factor, llama3's frequency band), its llama3 context filled in."""
    params.setdefault("rope_type", params.get("type", "default"))
    if params["rope_type"] not in SCALINGS:
        raise ValueError(f"rope type {params['rope_type']!r} is not supported (supported: {', '.join(SCALINGS)})")
    theta = params.get("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ValueError(f"rope_theta must be a positive number, got {theta!r}")
    if params["rope_type"] != "default":
        factor = params.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
            raise ValueError(f"the {params['rope_type']} rope scaling needs a positive factor, got {factor!r}")
    if params["rope_type"] == "llama3":
        missing = [k for k in ("low_freq_factor", "high_freq_factor") if k not in params]
        if missing:
            raise ValueError(f"the llama3 rope scaling needs {' and '.join(missing)}")
        if not 0 < params["low_freq_factor"] < params["high_freq_factor"]:
            raise ValueError("the llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor")
        params.setdefault("original_max_position_embeddings", _positions(hf))
    return params


def _rope(hf: dict) -> dict:
    """The global rope parameters (rope_type, rope_theta, ...) of either config generation."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer-type rope parameters are not supported")
    params.setdefault("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0)))
    return _checked_rope(params, hf)


#: transformers' MistralConfig default window, used where a config has no sliding_window key
MISTRAL_WINDOW = 4096


def _windows(hf: dict, family: str, n_layers: int) -> list[int | None]:
    """Sliding window per layer, as transformers reads it: Mistral's on every layer (its default window where the
    key is absent; only on the layers ``layer_types`` marks where it has one); Qwen's on the layers ``layer_types``
    (or ``max_window_layers``) marks."""
    window = hf.get("sliding_window", MISTRAL_WINDOW if family == "mistral" else None)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window must be a positive integer or null, got {window!r}")
    types = hf.get("layer_types")
    if types is not None and (len(types) != n_layers or not set(types) <= {"sliding_attention", "full_attention"}):
        raise ValueError(f"layer_types must give sliding_attention or full_attention for each of {n_layers} layers")
    if family == "mistral":
        if types and window is None and "sliding_attention" in types:
            raise ValueError("layer_types marks sliding_attention layers but sliding_window is null (transformers "
                             "has no window to apply there)")
        return [window if t == "sliding_attention" else None for t in types] if types else [window] * n_layers
    if family in ("qwen2", "qwen3") and types and "sliding_attention" in types and (
            window is None or not hf.get("use_sliding_window", False)):
        raise ValueError("layer_types marks sliding_attention layers but use_sliding_window is false or "
                         "sliding_window null (transformers has no window to apply there)")
    if family not in ("qwen2", "qwen3") or not hf.get("use_sliding_window", False) or window is None:
        return [None] * n_layers
    types = types or ["sliding_attention" if i >= hf.get("max_window_layers", 28) else "full_attention"
                      for i in range(n_layers)]
    return [window if t == "sliding_attention" else None for t in types]


#: transformers' head_dim where a config has no head_dim key (Qwen3Config: 128); other families hidden / heads
DEFAULT_HEAD_DIM = {"qwen3": 128}


def _head_dim(hf: dict, family: str) -> int:
    """head_dim as transformers reads it: the key's value; where it is absent, the family config's default
    (Qwen3: 128, which refuses null) or hidden_size / num_attention_heads (Llama, Mistral, Qwen2, also for null)."""
    if family in DEFAULT_HEAD_DIM:
        if "head_dim" in hf and hf["head_dim"] is None:
            raise ValueError(f"head_dim must be a positive integer for {family}, got null")
        return hf.get("head_dim", DEFAULT_HEAD_DIM[family])
    return hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]


def read_decoder_config(hf: dict) -> LlamaLikeConfig:
    """A Llama / Mistral / Qwen2 / Qwen3 ``config.json`` dict -> :class:`LlamaLikeConfig`."""
    family = hf["model_type"]
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):  # transformers' ACT2FN: swish is nn.SiLU
        raise ValueError(f"hidden_act {hf['hidden_act']!r}: the {family} MLP is implemented with silu only")
    rope = _rope(hf)
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor is not supported for {family}")
    n_heads, n_layers = hf["num_attention_heads"], hf["num_hidden_layers"]
    attention_bias = bool(hf.get("attention_bias", False)) and family in ("llama", "qwen3")
    return LlamaLikeConfig(
        family=family, vocab_size=hf["vocab_size"], n_positions=_positions(hf),
        d_model=hf["hidden_size"], n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        d_head=_head_dim(hf, family), d_mlp=hf["intermediate_size"],
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        o_bias=attention_bias or bool(hf.get("headprune_o_bias", False)),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=float(rope["rope_theta"]),
        rope_scaling=None if rope["rope_type"] == "default" else rope,
        qkv_bias=attention_bias or family == "qwen2", mlp_bias=bool(hf.get("mlp_bias", False)) and family == "llama",
        qk_norm=family == "qwen3", sliding_windows=_windows(hf, family, n_layers), **_kept(hf))


def _gemma3_rope(hf: dict) -> dict[str, dict]:
    """Per layer type rope parameters of a Gemma 3 config: transformers 5's ``rope_parameters`` keyed by layer type,
    or the 4.x keys (``rope_theta`` and ``rope_scaling`` for full attention, ``rope_local_base_freq`` for sliding)."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise TypeError(f"rope_parameters must be an object, got {params!r}")
    if params and not any(isinstance(v, dict) for v in params.values()):
        params = {"full_attention": params}
    if bad := [k for k, v in params.items() if k in LAYER_TYPES and not isinstance(v, dict)]:
        raise ValueError(f"rope_parameters[{bad[0]!r}] must be an object of rope parameters")
    rope = {}
    for kind, theta_key, default in (("full_attention", "rope_theta", 1_000_000.0),
                                     ("sliding_attention", "rope_local_base_freq", 10_000.0)):
        p = dict(params.get(kind) or {})
        if kind == "full_attention" and not params and hf.get("rope_scaling"):
            p.update(hf["rope_scaling"])
        p.setdefault("rope_theta", hf.get(theta_key, default))
        _checked_rope(p, hf)
        rope[kind] = p
    return rope


def read_gemma3_config(hf: dict) -> Gemma3Config:
    """A Gemma 3 text ``config.json`` dict (model_type ``gemma3_text``) -> :class:`Gemma3Config`."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_new"):
        raise ValueError(f"hidden_activation {act!r}: the Gemma 3 MLP is implemented with gelu_pytorch_tanh only")
    if hf.get("attn_logit_softcapping") is not None:
        raise ValueError("attn_logit_softcapping is not supported (Gemma 3 has none)")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention is not supported: headprune analyses causal language models")
    n_layers, n_heads = hf["num_hidden_layers"], hf["num_attention_heads"]
    pattern = hf.get("sliding_window_pattern", 6)
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ValueError(f"sliding_window_pattern must be a positive integer, got {pattern!r}")
    cap = hf.get("final_logit_softcapping")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
        raise ValueError(f"final_logit_softcapping must be a positive number or null, got {cap!r}")
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                      for i in range(n_layers)]
    if not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"layer_types may hold only {LAYER_TYPES}, got {sorted(set(types))}")
    window = hf.get("sliding_window", 4096)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:  # transformers' masks need one
        raise ValueError(f"sliding_window must be a positive integer, got {window!r}")
    scalar = hf.get("query_pre_attn_scalar", 256)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not scalar > 0:
        raise ValueError(f"query_pre_attn_scalar must be a positive number, got {scalar!r}")
    attention_bias = bool(hf.get("attention_bias", False))
    return Gemma3Config(
        vocab_size=hf["vocab_size"], n_positions=_positions(hf), d_model=hf["hidden_size"],
        n_layers=n_layers, n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        d_head=hf.get("head_dim") or 256, d_mlp=hf["intermediate_size"],
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        o_bias=attention_bias or bool(hf.get("headprune_o_bias", False)), rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        query_pre_attn_scalar=scalar, sliding_window=window,
        layer_types=list(types), rope=_gemma3_rope(hf), attention_bias=attention_bias,
        final_logit_softcapping=hf.get("final_logit_softcapping"), **_kept(hf))


def read_neox_config(hf: dict) -> NeoXConfig:
    """A GPT-NeoX ``config.json`` dict -> :class:`NeoXConfig`."""
    rope = _rope(hf)
    if rope["rope_type"] != "default":
        raise ValueError(f"rope type {rope['rope_type']!r} is not supported for gpt_neox")
    d, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    if d % n_heads:
        raise ValueError(f"hidden_size {d} is not divisible by num_attention_heads {n_heads}")
    attention_bias = bool(hf.get("attention_bias", True))
    return NeoXConfig(
        vocab_size=hf["vocab_size"], n_positions=_positions(hf), d_model=d,
        n_layers=hf["num_hidden_layers"], n_heads=n_heads, n_kv_heads=n_heads, d_head=d // n_heads,
        d_mlp=hf["intermediate_size"], tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        o_bias=attention_bias or bool(hf.get("headprune_o_bias", False)), layer_norm_eps=hf.get("layer_norm_eps", 1e-5),
        rope_theta=float(rope["rope_theta"]),
        rotary_pct=float(rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))),
        use_parallel_residual=bool(hf.get("use_parallel_residual", True)), attention_bias=attention_bias,
        hidden_act=hf.get("hidden_act", "gelu"), **_kept(hf))


@dataclass(frozen=True)
class ModelFamily:
    """Every fact of one HF ``model_type``, read by loading, GGUF reading and writing, the export, the cost model
    and the anatomy: its config reader, model class, weight names, architecture and llama.cpp names.

    HF keys are ours with ``prefix`` before the embedding, the blocks (``{blocks}.{l}`` for our ``h.{l}``) and the
    final norm, and ``.{attn}.`` for our ``.attn.``; keys ending in one of ``ignored`` are buffers, not weights.
    A checkpoint's key without the prefix is read as well (GPT-2 checkpoints saved from the bare ``GPT2Model``)."""

    read_config: Callable[[dict], HeadConfig]
    model_class: type[HeadModel]
    prefix: str  # "model." / "gpt_neox." / "transformer."
    attn: str  # the attention module's name in a block: "self_attn" / "attention" / "attn"
    lm_head: str  # the untied LM head: "lm_head" / "embed_out"
    architecture: str  # config.json "architectures" entry
    ignored: tuple[str, ...] = ("rotary_emb.inv_freq",)
    blocks: str = "layers"  # the block list's name: "layers" / "h" (GPT-2)
    bpe_fallback: bool = False  # a folder without tokenizer files is read with GPT-2's BPE (GPT-2 only)
    o_bias_switch: str | None = None  # the config key that gives attention an o_proj bias (and q/k/v biases)
    o_bias_default: bool = False  # that key's default in transformers (or the bias always exists: GPT-2)
    compact_export: bool = True  # stock transformers reads head_dim, so a uniform prune exports at smaller shapes
    heads_divide_width: bool = False  # transformers' config refuses hidden_size % num_attention_heads != 0
    config_writer: Callable[[Any], dict] | None = None  # writes config.json from the model's config (else the
    # source folder's config.json is the export's)
    mlp: str = "gated"  # "gated": act(x W_gate) ⊙ (x W_up) W_down (SwiGLU, GeGLU); "plain": act(x W_in) W_out
    norm: str = "rms"  # "rms": w ⊙ x / rms(x); "rms 1+w": (1 + w) ⊙ x / rms(x) (Gemma); "layer": LayerNorm
    rotary: str = "full"  # rotary on every q/k dimension ("full"), on a share of them ("partial"), or "none"
    gguf: GgufArch | None = None  # llama.cpp's names and conversions (None: not read from or written to GGUF)

    def norm_gain(self, norm: Any) -> Any:
        """The multiplicative gain g of a norm module of this family (y = g ⊙ x̂ + b): w, or 1 + w for Gemma."""
        return norm.weight + 1.0 if self.norm == "rms 1+w" else norm.weight

    def native_o_bias(self, hf: dict) -> bool:
        """Whether the HF config ``hf`` as it stands gives the attention output projection a bias."""
        if self.o_bias_switch is None:
            return self.o_bias_default
        return bool(hf.get(self.o_bias_switch, self.o_bias_default))

    def hf_key(self, key: str) -> str:
        """Our state-dict key -> the HF checkpoint's."""
        if key.startswith(self.lm_head + "."):
            return key
        if key.startswith("h."):
            key = f"{self.blocks}." + key[2:].replace(".attn.", f".{self.attn}.", 1)
        return self.prefix + key

    def our_key(self, hf_key: str) -> str | None:
        """The HF checkpoint's key -> ours (None for a buffer that is not a weight)."""
        if hf_key.endswith(self.ignored):
            return None
        if hf_key.startswith(self.lm_head + "."):
            return hf_key
        key = hf_key.removeprefix(self.prefix)
        if key.startswith(f"{self.blocks}."):
            key = "h." + key[len(self.blocks) + 1:].replace(f".{self.attn}.", ".attn.", 1)
        return key


def _decoder(architecture: str, **facts: Any) -> ModelFamily:
    return ModelFamily(read_decoder_config, LlamaLike, "model.", "self_attn", "lm_head", architecture, **facts)


REGISTRY: dict[str, ModelFamily] = {
    "gpt2": ModelFamily(GPT2Config.from_hf, GPT2, "transformer.", "attn", "lm_head", "GPT2LMHeadModel",
                   (".attn.bias", ".attn.masked_bias"), blocks="h", bpe_fallback=True,
                   o_bias_default=True, compact_export=False, config_writer=GPT2Config.to_hf,
                   mlp="plain", norm="layer", rotary="none"),
    # transformers 5's LlamaConfig and Gemma3TextConfig require hidden_size to be a multiple of num_attention_heads
    # even when head_dim is given (2048 / 24, 640 / 3 are refused); Mistral's, Qwen2's and Qwen3's do not
    "llama": _decoder("LlamaForCausalLM", o_bias_switch="attention_bias", heads_divide_width=True, gguf=LLAMA),
    "mistral": _decoder("MistralForCausalLM"),  # llama.cpp's converter writes Mistral as "llama": read as Llama
    "qwen2": _decoder("Qwen2ForCausalLM", gguf=QWEN2),
    "qwen3": _decoder("Qwen3ForCausalLM", o_bias_switch="attention_bias", gguf=QWEN3),
    "gemma3_text": ModelFamily(read_gemma3_config, Gemma3, "model.", "self_attn", "lm_head", "Gemma3ForCausalLM",
                          o_bias_switch="attention_bias", heads_divide_width=True, norm="rms 1+w", gguf=GEMMA3),
    "gpt_neox": ModelFamily(read_neox_config, NeoX, "gpt_neox.", "attention", "embed_out", "GPTNeoXForCausalLM",
                       ("rotary_emb.inv_freq", "attention.bias", "attention.masked_bias"),
                       o_bias_switch="attention_bias", o_bias_default=True, compact_export=False, mlp="plain",
                       norm="layer", rotary="partial"),
}
#: llama.cpp's ``general.architecture`` -> the model_type a GGUF file of it is read as
GGUF_ARCHITECTURES = {family.gguf.name: kind for kind, family in REGISTRY.items() if family.gguf is not None}
SUPPORTED = tuple(REGISTRY)  # every model_type headprune loads


def gguf_arch(kind: str) -> GgufArch:
    """llama.cpp's names of the ``kind`` family; HeadpruneError where it has none."""
    arch = REGISTRY[kind].gguf
    if arch is None:
        raise HeadpruneError(f"{kind} models have no GGUF form in headprune (GGUF families: "
                             f"{', '.join(GGUF_ARCHITECTURES.values())})")
    return arch


def loadable_head_count(kind: str, d_model: int, n_heads: int) -> bool:
    """Whether stock transformers builds a ``kind`` config with ``n_heads`` query heads of width ``d_model``."""
    return not REGISTRY[kind].heads_divide_width or d_model % n_heads == 0


def family_of(model: Any) -> ModelFamily:
    """The registry entry of a loaded model."""
    return REGISTRY[model_type(model)]


def model_type(model: Any) -> str:
    """The HF ``model_type`` of a loaded model: "gpt2", a decoder's ``cfg.family``, or its registry entry's."""
    family = getattr(model.cfg, "family", None)
    if isinstance(family, str):  # the Llama-like decoders share one class
        return family
    kind = next((kind for kind, entry in REGISTRY.items() if type(model) is entry.model_class), None)
    kind = kind or next((kind for kind, entry in REGISTRY.items() if isinstance(model, entry.model_class)), None)
    if kind is None:
        raise HeadpruneError(f"{type(model).__name__} is not a model of a headprune family ({', '.join(REGISTRY)})")
    return kind


def layout_text(model: Any) -> str:
    """The attention layout in words, e.g. "grouped-query attention, 4 query / 2 KV heads per layer"."""
    cfg = model.cfg
    kind = "multi-head" if cfg.n_kv_heads == cfg.n_heads else "grouped-query"
    return (f"{kind} attention, {cfg.n_heads} query / {cfg.n_kv_heads} KV heads per layer "
            f"({cfg.group_size} query head(s) per KV head)")
