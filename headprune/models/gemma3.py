"""Gemma 3 (text), as transformers 5's ``Gemma3ForCausalLM`` computes it.

Block l on the residual x (B,T,d), with four RMSNorms (Gemma's form: (1 + w) ⊙ x / √(mean(x²) + ε), all in float32):

    x ← x + N_post_attn(o_proj(attn(N_in(x))))      grouped-query attention; RMSNorm over each head's q and k
    x ← x + N_post_ffw(mlp(N_pre_ffw(x)))           mlp(x) = down(gelu_tanh(gate(x)) ⊙ up(x))

    embedding: x₀ = √d · W_E[token] (the scale cast to the weights' dtype first)
    scores:    q kᵀ / √query_pre_attn_scalar (not √d_k)
    layers:    ``layer_types[l]`` is "sliding_attention" (window ``sliding_window``, rope θ_local) or
               "full_attention" (causal only, rope θ_global and its scaling): one rotary table per layer type
    logits:    N_f(x) W_U (W_U = W_E when tied), then cap · tanh(logits / cap) when ``final_logit_softcapping``

The post-attention norm sits between o_proj and the residual, so what head i writes into the residual is
z_i W_O^(i) ⊙ s (s = (1 + w) / rms(attn output), per position): linear in each head once s is read off the forward
(:meth:`Block.attn_write_scale`), the way an analysis freezes a LayerNorm's scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headprune.models.base import HeadBlock, HeadBlocks, HeadModel
from headprune.models.head_config import HeadConfig, check_eps
from headprune.models.hooks import Capture
from headprune.models.llama import Attention as DecoderAttention
from headprune.models.rotary import inv_frequencies, rotary_tables

LAYER_TYPES = ("sliding_attention", "full_attention")
Tables = dict[str, tuple[Tensor, Tensor]]  # layer type -> rotary (cos, sin), each (T, d_k)


@dataclass
class Gemma3Config(HeadConfig):
    """Gemma 3 hyper-parameters (see :class:`~.head_config.HeadConfig` for the shared ones)."""

    rms_norm_eps: float = 1e-6
    query_pre_attn_scalar: float = 256.0
    sliding_window: int = 4096
    layer_types: list[str] = field(default_factory=list)  # per layer: one of LAYER_TYPES
    rope: dict[str, dict] = field(default_factory=dict)  # layer type -> rope parameters (rope_type, rope_theta, ..)
    attention_bias: bool = False
    final_logit_softcapping: float | None = None
    embed_scale: float = 0.0  # √d_model unless given

    def __post_init__(self) -> None:
        super().__post_init__()
        check_eps(self, "rms_norm_eps")
        if not self.layer_types:
            self.layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                for i in range(self.n_layers)]
        if len(self.layer_types) != self.n_layers or not set(self.layer_types) <= set(LAYER_TYPES):
            raise ValueError(f"layer_types must give one of {LAYER_TYPES} for each of {self.n_layers} layers")
        if not isinstance(self.sliding_window, int) or self.sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive integer, got {self.sliding_window!r}")
        if not self.query_pre_attn_scalar > 0:
            raise ValueError(f"query_pre_attn_scalar must be positive, got {self.query_pre_attn_scalar!r}")
        self.rope = {kind: self.rope.get(kind, {"rope_type": "default", "rope_theta": theta})
                     for kind, theta in (("sliding_attention", 10_000.0), ("full_attention", 1_000_000.0))}
        self.embed_scale = self.embed_scale or self.d_model**0.5

    # what the Llama attention reads from a config
    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias

    @property
    def qk_norm(self) -> bool:
        return True

    @property
    def sliding_windows(self) -> list[int | None]:
        return [self.sliding_window if t == "sliding_attention" else None for t in self.layer_types]


class RMSNorm(nn.Module):
    """Gemma's RMSNorm: (1 + w) ⊙ x / √(mean(x²) + ε), all in float32, cast back last (w starts at 0)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))
        self.eps = eps

    @property
    def gain(self) -> Tensor:
        """1 + w: what the normalised x is multiplied by."""
        return 1.0 + self.weight

    def scale(self, x: Tensor) -> Tensor:
        """s with RMSNorm(x) = x ⊙ s (float32, broadcast over the last dim)."""
        x32 = x.float()
        return torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.gain.float()

    def forward(self, x: Tensor) -> Tensor:
        return (x.float() * self.scale(x)).type_as(x)


class Attention(DecoderAttention):
    """The Llama attention with Gemma's q/k norms, its score scale and this layer's type."""

    qk_norm_class = RMSNorm

    def __init__(self, cfg: Gemma3Config, layer: int):
        super().__init__(cfg, layer)  # type: ignore[arg-type]  # Gemma3Config has every field it reads
        self.scale = float(cfg.query_pre_attn_scalar) ** -0.5
        self.layer_type = cfg.layer_types[layer]


class MLP(nn.Module):
    """GeGLU: down(gelu_tanh(gate(x)) ⊙ up(x))."""

    def __init__(self, cfg: Gemma3Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.down_proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)
        self.act = partial(F.gelu, approximate="tanh")

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Block(HeadBlock):
    attn: Attention

    def __init__(self, cfg: Gemma3Config, layer: int):
        super().__init__()
        d, eps = cfg.d_model, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.pre_feedforward_layernorm = RMSNorm(d, eps)
        self.mlp = MLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(d, eps)

    def qkv(self, resid: Tensor, tables: Tables) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        return self.attn.qkv(self.input_layernorm(resid), *tables[self.attn.layer_type])

    def attn_write_scale(self, attn_out: Tensor) -> Tensor:
        """s (B,T,d) with what attention adds to the residual = attn_out ⊙ s (the post-attention norm)."""
        return self.post_attention_layernorm.scale(attn_out)

    def forward(self, x: Tensor, tables: Tables, gate: Tensor | None = None, fill: Tensor | None = None,
                capture: Capture | None = None, need_weights: bool = False) -> Tensor:
        cos, sin = tables[self.attn.layer_type]
        x = x + self.post_attention_layernorm(self.attn(self.input_layernorm(x), cos, sin, gate, fill, capture,
                                                        need_weights))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3(HeadModel):
    """A Gemma 3 language model: scaled embedding, sandwich-norm blocks, final RMSNorm, LM head (tied or not)."""

    cfg: Gemma3Config

    def __init__(self, cfg: Gemma3Config):
        super().__init__(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.h = HeadBlocks(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._inv_freq = {kind: inv_frequencies(cfg.d_head, float(p["rope_theta"]),
                                                None if p.get("rope_type", "default") == "default" else p)
                          for kind, p in cfg.rope.items()}  # [d_k/2] float32 per layer type

    def embedding_rows(self, start: int, stop: int) -> Tensor:
        """[stop − start, d]: rows of the embedding as the first block reads it, √d · embed_tokens."""
        return self.embed_tokens.weight[start:stop] * self._embed_scale()

    def _embed_scale(self) -> Tensor:
        return torch.tensor(self.cfg.embed_scale).to(self.embed_tokens.weight.dtype)

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        self.check_length(start + tokens.shape[1])
        return self.embed_tokens(tokens) * self._embed_scale().to(tokens.device)

    def block_inputs(self, resid: Tensor, start: int = 0) -> tuple[Tables]:
        T = resid.shape[1]
        return ({kind: rotary_tables(inv, T, resid.device, resid.dtype, start)
                 for kind, inv in self._inv_freq.items()},)

    def unembed(self, resid: Tensor) -> Tensor:
        logits = F.linear(self.norm(resid), self.W_U)
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
