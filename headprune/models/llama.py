"""The Llama decoder and its relatives Mistral, Qwen2 and Qwen3, as transformers 5 computes them.

Block l on the residual x (B,T,d), pre-norm:

    x ← x + o_proj(attn(RMSNorm₁(x)))                 grouped-query attention, rotary on q and k
    x ← x + down(silu(gate(RMSNorm₂(x))) ⊙ up(RMSNorm₂(x)))                 SwiGLU MLP
    RMSNorm(x) = w ⊙ x / √(mean(x²) + ε)                (normalised in float32, then cast back and scaled by w)

logits = RMSNorm_f(x) W_U, with W_U = the embedding (tied) or ``lm_head``. Per-family switches (``cfg.family``):

    llama    attention_bias: q/k/v/o biases; mlp_bias; rope_scaling (linear, llama3)
    mistral  sliding_window: token t attends to s only when t − s < window
    qwen2    q/k/v biases (no o bias); sliding window on the layers ``layer_types`` marks
    qwen3    RMSNorm over each head's q and k before rotary (q_norm, k_norm); head_dim ≠ d/h; optional biases

Parameter names follow transformers' (``model.layers.{l}.self_attn.q_proj`` is ``h.{l}.attn.q_proj`` here), so a
checkpoint loads by renaming keys (:mod:`.families`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headprune.models.attention_ops import head_rows, widened
from headprune.models.base import HeadAttention, HeadBlock, HeadBlocks, HeadModel
from headprune.models.head_config import HeadConfig, check_eps
from headprune.models.hooks import Capture
from headprune.models.rotary import apply_rotary, inv_frequencies, rotary_tables

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class LlamaLikeConfig(HeadConfig):
    """Llama / Mistral / Qwen2 / Qwen3 hyper-parameters (see :class:`~.head_config.HeadConfig` for the shared ones)."""

    family: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # transformers' rope_parameters when not "default" (linear, llama3)
    qkv_bias: bool = False  # q/k/v projections have biases (Qwen2; Llama/Qwen3 with attention_bias)
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k
    sliding_windows: list[int | None] = field(default_factory=list)  # per layer; [] = none

    def __post_init__(self) -> None:
        super().__post_init__()
        check_eps(self, "rms_norm_eps")
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if not self.sliding_windows:
            self.sliding_windows = [None] * self.n_layers
        if len(self.sliding_windows) != self.n_layers:
            raise ValueError(f"sliding_windows must have one entry per layer ({self.n_layers})")


class RMSNorm(nn.Module):
    """w ⊙ x / √(mean(x²) + ε) over the last dim, normalised in float32 as transformers does."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Attention(HeadAttention):
    """Grouped-query attention with rotary embeddings: q_proj [h·d_k, d], k_proj and v_proj [h_kv·d_k, d],
    o_proj [d, h·d_k] (nn.Linear layout: out × in); query head i at q rows / o columns i·d_k..(i+1)·d_k."""

    PARAM_ROLES: ClassVar[dict[str, str]] = {"q_proj": "W_Q", "k_proj": "W_K", "v_proj": "W_V", "o_proj": "W_O"}
    qk_norm_class: ClassVar[type[nn.Module]] = RMSNorm  # the per-head q/k norm, where the config has one

    def __init__(self, cfg: LlamaLikeConfig, layer: int):
        super().__init__()
        self.set_groups(cfg, layer)
        self.d_model = cfg.d_model
        d, h, h_kv, dk = cfg.d_model, self.n_heads, self.n_kv_heads, cfg.d_head
        self.q_proj = nn.Linear(d, h * dk, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, h_kv * dk, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, h_kv * dk, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(h * dk, d, bias=True)  # b_O: zero where the checkpoint has none (cfg.o_bias)
        self.q_norm = self.qk_norm_class(dk, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = self.qk_norm_class(dk, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.window = cfg.sliding_windows[layer]
        self.scale = dk**-0.5

    # Per-head views (no copies): nn.Linear stores [out, in], so head i's q rows are W_Q^(i)ᵀ.
    def _heads(self, lin: nn.Linear, n: int) -> Tensor:
        return lin.weight.view(n, self.d_head, self.d_model).transpose(1, 2)  # [n, d_model, d_head]

    def _bias(self, lin: nn.Linear, n: int) -> Tensor:
        if lin.bias is None:
            return lin.weight.new_zeros(n, self.d_head)
        return lin.bias.view(n, self.d_head)

    @property
    def W_Q(self) -> Tensor:
        return self._heads(self.q_proj, self.n_heads)

    @property
    def W_K_kv(self) -> Tensor:
        return self._heads(self.k_proj, self.n_kv_heads)

    @property
    def W_V_kv(self) -> Tensor:
        return self._heads(self.v_proj, self.n_kv_heads)

    @property
    def W_O(self) -> Tensor:
        """[n_heads, d_head, d_model]: W_O^(i) = o_proj.weight[:, i·d_k:(i+1)·d_k]ᵀ."""
        return self.o_proj.weight.view(self.d_model, self.n_heads, self.d_head).permute(1, 2, 0)

    @property
    def b_Q(self) -> Tensor:
        return self._bias(self.q_proj, self.n_heads)

    @property
    def b_K_kv(self) -> Tensor:
        return self._bias(self.k_proj, self.n_kv_heads)

    @property
    def b_V_kv(self) -> Tensor:
        return self._bias(self.v_proj, self.n_kv_heads)

    @property
    def b_O(self) -> Tensor:
        return self.o_proj.bias

    def pruned_state(self, prefix: str, keep: list[int], b_O: Tensor) -> dict[str, Tensor]:
        dk, dev = self.d_head, self.o_proj.weight.device
        kv_keep = sorted({self.kv_positions[p] for p in keep})
        q_rows, kv_rows = head_rows(keep, dk, dev), head_rows(kv_keep, dk, dev)
        state = {prefix + "q_proj.weight": self.q_proj.weight.detach().index_select(0, q_rows),  # [h'·d_k, d]
                 prefix + "k_proj.weight": self.k_proj.weight.detach().index_select(0, kv_rows),  # [h_kv'·d_k, d]
                 prefix + "v_proj.weight": self.v_proj.weight.detach().index_select(0, kv_rows),
                 prefix + "o_proj.weight": self.o_proj.weight.detach().index_select(1, q_rows),  # [d, h'·d_k]
                 prefix + "o_proj.bias": b_O.detach().clone()}
        for name, sel in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
            bias = getattr(self, name).bias
            if bias is not None:
                state[prefix + name + ".bias"] = bias.detach().index_select(0, sel)
        return state

    def full_width_state(self, prefix: str, cfg: HeadConfig) -> dict[str, Tensor]:
        dk, dev = self.d_head, self.o_proj.weight.device
        q = head_rows(cfg.kept_heads[self.layer], dk, dev)
        kv = head_rows(cfg.kept_kv_heads(self.layer), dk, dev)
        state = {prefix + "o_proj.weight": widened(self.o_proj.weight, 1, q, cfg.n_heads * dk),
                 prefix + "o_proj.bias": self.o_proj.bias.detach().clone()}
        for name, index, n in (("q_proj", q, cfg.n_heads), ("k_proj", kv, cfg.n_kv_heads),
                               ("v_proj", kv, cfg.n_kv_heads)):
            lin = getattr(self, name)
            state[prefix + name + ".weight"] = widened(lin.weight, 0, index, n * dk)
            if lin.bias is not None:
                state[prefix + name + ".bias"] = widened(lin.bias, 0, index, n * dk)
        return state

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, _ = x.shape
        dk = self.d_head
        q = self.q_proj(x).view(B, T, self.n_heads, dk)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, dk)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, dk).transpose(1, 2)  # (B,h_kv,T,d_k)
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3: per-head RMSNorm before rotary
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q.transpose(1, 2), cos, sin)  # (B,h,T,d_k)
        k = apply_rotary(k.transpose(1, 2), cos, sin)  # (B,h_kv,T,d_k)
        return q, k, v

    def forward(
        self,
        x: Tensor,  # (B,T,d)
        cos: Tensor,  # (T, d_k) rotary tables
        sin: Tensor,
        gate: Tensor | None = None,
        fill: Tensor | None = None,
        capture: Capture | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        B, T, d = x.shape
        if self.n_heads == 0:
            return self.o_proj.bias.expand(B, T, d)
        z = self.attend(*self.qkv(x, cos, sin), gate, fill, capture, need_weights)  # (B,T,h·d_k)
        return self.o_proj(z)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) ⊙ up(x))."""

    def __init__(self, cfg: LlamaLikeConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=cfg.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(HeadBlock):
    def __init__(self, cfg: LlamaLikeConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, gate: Tensor | None = None, fill: Tensor | None = None,
                capture: Capture | None = None, need_weights: bool = False) -> Tensor:
        x = x + self.attn(self.input_layernorm(x), cos, sin, gate, fill, capture, need_weights)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaLike(HeadModel):
    """A Llama-family language model: token embedding, pre-norm blocks, final RMSNorm, LM head (tied or not)."""

    cfg: LlamaLikeConfig

    def __init__(self, cfg: LlamaLikeConfig):
        super().__init__(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.h = HeadBlocks(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._inv_freq = inv_frequencies(cfg.d_head, cfg.rope_theta, cfg.rope_scaling)  # [d_k/2], float32

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        """tokens (B,T) -> residual stream (B,T,d): no position embedding (rotary acts inside attention)."""
        self.check_length(start + tokens.shape[1])
        return self.embed_tokens(tokens)

    def block_inputs(self, resid: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        return rotary_tables(self._inv_freq, resid.shape[1], resid.device, resid.dtype, start)

    def unembed(self, resid: Tensor) -> Tensor:
        return F.linear(self.norm(resid), self.W_U)
