"""GPT-NeoX (Pythia), as transformers 5 computes it.

Block l on the residual x (B,T,d), with LayerNorms and biases:

    a = dense(attn(LN₁(x)))                     multi-head attention, rotary on the first ⌊rotary_pct·d_k⌋ dims
    parallel residual (use_parallel_residual):  x ← x + a + mlp(LN₂(x))
    sequential:                                 x ← x + a;  x ← x + mlp(LN₂(x))
    mlp(x) = dense_4h_to_h(act(dense_h_to_4h(x)))    act: gelu (exact) for Pythia

logits = LN_f(x) W_U with W_U = ``embed_out`` (untied for Pythia). ``query_key_value`` [3·h·d_k, d] is
interleaved per head: rows i·3d_k.. hold head i's q, then k, then v (d_k each); ``dense`` [d, h·d_k] reads
head i at columns i·d_k..(i+1)·d_k. No GQA: every query head has its own KV head.

Parameter names follow transformers' (``gpt_neox.layers.{l}.attention.dense`` is ``h.{l}.attn.dense`` here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headprune.models.attention_ops import head_rows, widened
from headprune.models.base import HeadAttention, HeadBlock, HeadBlocks, HeadModel
from headprune.models.head_config import HeadConfig, check_eps
from headprune.models.hooks import Capture
from headprune.models.rotary import apply_rotary, inv_frequencies, rotary_tables

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"gelu": F.gelu, "gelu_new": partial(F.gelu, approximate="tanh"),
               "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"), "relu": F.relu, "silu": F.silu,
               "swish": F.silu, "gelu_python": F.gelu}  # transformers' ACT2FN: swish is SiLU, gelu_python erf's GELU


@dataclass
class NeoXConfig(HeadConfig):
    """GPT-NeoX hyper-parameters (n_kv_heads = n_heads, d_head = d_model / n_heads)."""

    layer_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rotary_pct: float = 0.25  # fraction of each head's dims that rotary rotates
    use_parallel_residual: bool = True
    attention_bias: bool = True  # query_key_value and dense biases
    hidden_act: str = "gelu"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_eps(self, "layer_norm_eps")
        if self.n_kv_heads != self.n_heads or self.d_head * self.n_heads != self.d_model:
            raise ValueError("GPT-NeoX has n_kv_heads = n_heads and d_head = d_model / n_heads")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; use one of {sorted(ACTIVATIONS)}")
        if not 0 < self.rotary_pct <= 1:
            raise ValueError(f"rotary_pct must be in (0, 1], got {self.rotary_pct}")

    @property
    def rotary_dims(self) -> int:
        return int(self.d_head * self.rotary_pct)


class Attention(HeadAttention):
    """Multi-head attention with partial rotary: one fused, per-head interleaved query_key_value projection."""

    PARAM_ROLES: ClassVar[dict[str, str]] = {"query_key_value": "W_QKV", "dense": "W_O"}

    def __init__(self, cfg: NeoXConfig, layer: int):
        super().__init__()
        self.set_groups(cfg, layer)
        self.d_model = cfg.d_model
        d, h, dk = cfg.d_model, self.n_heads, cfg.d_head
        self.query_key_value = nn.Linear(d, 3 * h * dk, bias=cfg.attention_bias)
        self.dense = nn.Linear(h * dk, d, bias=True)  # b_O: zero where the checkpoint has none (cfg.o_bias)
        self.scale = dk**-0.5

    def _qkv(self, which: int) -> Tensor:  # [h, d, d_k] view of part `which` (0 q, 1 k, 2 v)
        return self.query_key_value.weight.view(self.n_heads, 3, self.d_head, self.d_model)[:, which].transpose(1, 2)

    def _qkv_bias(self, which: int) -> Tensor:  # [h, d_k]
        bias = self.query_key_value.bias
        if bias is None:
            return self.query_key_value.weight.new_zeros(self.n_heads, self.d_head)
        return bias.view(self.n_heads, 3, self.d_head)[:, which]

    @property
    def W_Q(self) -> Tensor:
        return self._qkv(0)

    @property
    def W_K_kv(self) -> Tensor:
        return self._qkv(1)

    @property
    def W_V_kv(self) -> Tensor:
        return self._qkv(2)

    @property
    def W_O(self) -> Tensor:
        return self.dense.weight.view(self.d_model, self.n_heads, self.d_head).permute(1, 2, 0)  # [h, d_k, d]

    @property
    def b_Q(self) -> Tensor:
        return self._qkv_bias(0)

    @property
    def b_K_kv(self) -> Tensor:
        return self._qkv_bias(1)

    @property
    def b_V_kv(self) -> Tensor:
        return self._qkv_bias(2)

    @property
    def b_O(self) -> Tensor:
        return self.dense.bias

    def pruned_state(self, prefix: str, keep: list[int], b_O: Tensor) -> dict[str, Tensor]:
        dk, dev = self.d_head, self.dense.weight.device
        heads = torch.tensor(keep, dtype=torch.long, device=dev).view(-1, 1)
        qkv_rows = (heads * 3 * dk + torch.arange(3 * dk, device=dev)).reshape(-1)  # [h'·3d_k]
        o_cols = (heads * dk + torch.arange(dk, device=dev)).reshape(-1)  # [h'·d_k]
        state = {prefix + "query_key_value.weight": self.query_key_value.weight.detach().index_select(0, qkv_rows),
                 prefix + "dense.weight": self.dense.weight.detach().index_select(1, o_cols),
                 prefix + "dense.bias": b_O.detach().clone()}
        if self.query_key_value.bias is not None:
            state[prefix + "query_key_value.bias"] = self.query_key_value.bias.detach().index_select(0, qkv_rows)
        return state

    def full_width_state(self, prefix: str, cfg: HeadConfig) -> dict[str, Tensor]:
        dk, dev, kept = self.d_head, self.dense.weight.device, cfg.kept_heads[self.layer]
        qkv_rows, o_cols = head_rows(kept, 3 * dk, dev), head_rows(kept, dk, dev)
        state = {prefix + "query_key_value.weight": widened(self.query_key_value.weight, 0, qkv_rows,
                                                            3 * cfg.n_heads * dk),
                 prefix + "dense.weight": widened(self.dense.weight, 1, o_cols, cfg.n_heads * dk),
                 prefix + "dense.bias": self.dense.bias.detach().clone()}
        if self.query_key_value.bias is not None:
            state[prefix + "query_key_value.bias"] = widened(self.query_key_value.bias, 0, qkv_rows,
                                                             3 * cfg.n_heads * dk)
        return state

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, _ = x.shape
        qkv = self.query_key_value(x).view(B, T, self.n_heads, 3 * self.d_head).transpose(1, 2)  # (B,h,T,3d_k)
        q, k, v = qkv.chunk(3, dim=-1)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, gate: Tensor | None = None, fill: Tensor | None = None,
                capture: Capture | None = None, need_weights: bool = False) -> Tensor:
        B, T, d = x.shape
        if self.n_heads == 0:
            return self.dense.bias.expand(B, T, d)
        z = self.attend(*self.qkv(x, cos, sin), gate, fill, capture, need_weights)  # (B,T,h·d_k)
        return self.dense(z)


class MLP(nn.Module):
    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(cfg.d_model, cfg.d_mlp)
        self.dense_4h_to_h = nn.Linear(cfg.d_mlp, cfg.d_model)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class Block(HeadBlock):
    def __init__(self, cfg: NeoXConfig, layer: int):
        super().__init__()
        self.parallel = cfg.use_parallel_residual
        self.input_layernorm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, gate: Tensor | None = None, fill: Tensor | None = None,
                capture: Capture | None = None, need_weights: bool = False) -> Tensor:
        a = self.attn(self.input_layernorm(x), cos, sin, gate, fill, capture, need_weights)
        if self.parallel:
            return x + a + self.mlp(self.post_attention_layernorm(x))
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x))


class NeoX(HeadModel):
    """A GPT-NeoX language model: embed_in, blocks, final LayerNorm, embed_out (or the tied embedding)."""

    cfg: NeoXConfig
    embedding_name, lm_head_name, final_norm_name = "embed_in", "embed_out", "final_layer_norm"

    def __init__(self, cfg: NeoXConfig):
        super().__init__(cfg)
        self.embed_in = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.h = HeadBlocks(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.final_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.embed_out = None if cfg.tie_word_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._inv_freq = inv_frequencies(cfg.rotary_dims, cfg.rope_theta)  # [r/2], float32

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        self.check_length(start + tokens.shape[1])
        return self.embed_in(tokens)

    def block_inputs(self, resid: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        return rotary_tables(self._inv_freq, resid.shape[1], resid.device, resid.dtype, start)

    def unembed(self, resid: Tensor) -> Tensor:
        return F.linear(self.final_layer_norm(resid), self.W_U)
