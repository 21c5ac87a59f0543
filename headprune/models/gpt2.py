"""A faithful GPT-2 with explicit multi-head attention, per-head gates and per-head weight views.

Parameter names and layouts follow Hugging Face's GPT-2 (Conv1D weights are ``[in, out]``), minus the
``transformer.`` prefix, so a checkpoint loads by renaming keys and a pruned model exports the same way.

Attention of layer l with h heads of width d_k on x: (B,T,d):

    [Q|K|V] = x W_attn + b_attn                        (B,T,3·h·d_k), split and viewed as (B,h,T,d_k)
    A       = softmax(Q Kᵀ / √d_k + causal mask)        (B,h,T,T)
    z       = A V                                       (B,h,T,d_k)
    z_i    ← g_i z_i + (1 − g_i) f_i                    gates g (1 keeps, 0 ablates), fill f (0 or a mean);
                                                        g and f may vary by example and position (patching)
    out     = concat_i(z_i) W_O + b_O = Σ_i z_i W_O^(i) + b_O    (B,T,d), W_O^(i) = rows i·d_k..(i+1)·d_k

A layer may keep any subset of the original heads (physical pruning): ``kept_heads[l]`` lists their
original indices, and W_attn / W_O hold only their columns / rows. A layer that keeps no head adds b_O."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headprune.models.attention_ops import widened
from headprune.models.base import HeadAttention, HeadBlock, HeadBlocks, HeadModel
from headprune.models.gpt2_config import GPT2Config
from headprune.models.head_config import HeadConfig
from headprune.models.hooks import Capture
from headprune.models.token_check import check_token_tensor


class Conv1D(nn.Module):
    """GPT-2's linear layer: y = x W + b with W stored [in, out]."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: Tensor) -> Tensor:
        shape = (*x.shape[:-1], self.weight.shape[1])
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class Attention(HeadAttention):
    """Multi-head causal self-attention: c_attn [d, 3·h·d_k] (Q block, K block, V block, head-major inside each)
    and c_proj [h·d_k, d] (Conv1D: in × out); every head in one batched call, gates and fills per head."""

    PARAM_ROLES: ClassVar[dict[str, str]] = {"c_attn": "W_QKV", "c_proj": "W_O"}

    def __init__(self, cfg: GPT2Config, layer: int):
        super().__init__()
        self.set_groups(cfg, layer)  # multi-head: one KV head per query head
        self.c_attn = Conv1D(cfg.d_model, 3 * self.n_heads * self.d_head)
        self.c_proj = Conv1D(self.n_heads * self.d_head, cfg.d_model)
        self.scale = (self.d_head**-0.5 if cfg.scale_attn_weights else 1.0) / (
            layer + 1 if cfg.scale_attn_by_inverse_layer_idx else 1
        )

    # Per-head views of the weights (no copies), TransformerLens layout.
    def _qkv_view(self, t: Tensor, which: int) -> Tensor:
        hd = self.n_heads * self.d_head
        part = t[..., which * hd : (which + 1) * hd]
        if t.dim() == 1:
            return part.view(self.n_heads, self.d_head)  # [n_heads, d_head]
        return part.view(-1, self.n_heads, self.d_head).permute(1, 0, 2)  # [n_heads, d_model, d_head]

    @property
    def W_Q(self) -> Tensor:
        return self._qkv_view(self.c_attn.weight, 0)

    @property
    def W_K_kv(self) -> Tensor:
        return self._qkv_view(self.c_attn.weight, 1)

    @property
    def W_V_kv(self) -> Tensor:
        return self._qkv_view(self.c_attn.weight, 2)

    @property
    def b_Q(self) -> Tensor:
        return self._qkv_view(self.c_attn.bias, 0)

    @property
    def b_K_kv(self) -> Tensor:
        return self._qkv_view(self.c_attn.bias, 1)

    @property
    def b_V_kv(self) -> Tensor:
        return self._qkv_view(self.c_attn.bias, 2)

    @property
    def W_O(self) -> Tensor:
        """[n_heads, d_head, d_model]: row block W_O^(i) of head i."""
        return self.c_proj.weight.view(self.n_heads, self.d_head, -1)

    @property
    def b_O(self) -> Tensor:
        return self.c_proj.bias

    @staticmethod
    def qkv_columns(positions: Tensor, n_heads: int, d_head: int) -> Tensor:
        """c_attn output columns of the heads at ``positions``: part·h·d_k + p·d_k + k, Q then K then V."""
        part = torch.arange(3, device=positions.device).view(3, 1, 1) * n_heads * d_head
        k = torch.arange(d_head, device=positions.device).view(1, 1, d_head)
        return (part + positions.view(1, -1, 1) * d_head + k).reshape(-1)  # [3·len(positions)·d_k]

    @staticmethod
    def wo_rows(positions: Tensor, d_head: int) -> Tensor:
        """c_proj input rows (W_O row blocks) of the heads at ``positions``: p·d_k + k."""
        return (positions.view(-1, 1) * d_head + torch.arange(d_head, device=positions.device)).reshape(-1)

    def pruned_state(self, prefix: str, keep: list[int], b_O: Tensor) -> dict[str, Tensor]:
        positions = torch.tensor(keep, dtype=torch.long, device=self.c_attn.weight.device)
        cols, rows = self.qkv_columns(positions, self.n_heads, self.d_head), self.wo_rows(positions, self.d_head)
        return {
            prefix + "c_attn.weight": self.c_attn.weight.detach().index_select(1, cols),  # [d, 3·h'·d_k]
            prefix + "c_attn.bias": self.c_attn.bias.detach().index_select(0, cols),  # [3·h'·d_k]
            prefix + "c_proj.weight": self.c_proj.weight.detach().index_select(0, rows),  # [h'·d_k, d]
            prefix + "c_proj.bias": b_O.detach().clone(),  # [d]
        }

    def full_width_state(self, prefix: str, cfg: HeadConfig) -> dict[str, Tensor]:
        H, dk = cfg.n_heads, self.d_head
        pos = torch.tensor(cfg.kept_heads[self.layer], dtype=torch.long, device=self.c_attn.weight.device)
        cols, rows = self.qkv_columns(pos, H, dk), self.wo_rows(pos, dk)
        return {prefix + "c_attn.weight": widened(self.c_attn.weight, 1, cols, 3 * H * dk),  # [d, 3·H·d_k]
                prefix + "c_attn.bias": widened(self.c_attn.bias, 0, cols, 3 * H * dk),
                prefix + "c_proj.weight": widened(self.c_proj.weight, 0, rows, H * dk),  # [H·d_k, d]
                prefix + "c_proj.bias": self.c_proj.bias.detach().clone()}

    def qkv(self, x: Tensor, *tables: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (each (B,h,T,d_k)) of the normed input x (B,T,d) (no rotary ``tables``: learned positions)."""
        B, T = x.shape[:2]
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(
        self,
        x: Tensor,  # (B,T,d)
        gate: Tensor | None = None,  # [n_heads], [B, n_heads] or per position [B, n_heads, T]
        fill: Tensor | None = None,  # [n_heads, d_head] or per example and position [B, n_heads, T, d_head]:
        # what an ablated head outputs instead of z_i
        capture: Capture | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        B, T, d = x.shape
        if self.n_heads == 0:
            return self.c_proj.bias.expand(B, T, d)
        z = self.attend(*self.qkv(x), gate, fill, capture, need_weights)  # (B,T,h·d_k)
        return self.c_proj(z)  # (B,T,d)


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = Conv1D(cfg.d_model, cfg.d_mlp)
        self.c_proj = Conv1D(cfg.d_mlp, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(HeadBlock):
    """Pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(·))."""

    attn: Attention

    def __init__(self, cfg: GPT2Config, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg, layer)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    @property
    def input_layernorm(self) -> nn.Module:  # type: ignore[override]  # GPT-2's name for it is ln_1
        return self.ln_1

    def forward(self, x: Tensor, gate: Tensor | None = None, fill: Tensor | None = None,
                capture: Capture | None = None, need_weights: bool = False) -> Tensor:
        x = x + self.attn(self.ln_1(x), gate, fill, capture, need_weights)
        return x + self.mlp(self.ln_2(x))

    def qkv(self, resid: Tensor, *tables: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (each (B,h,T,d_k)) of this block's attention on the residual resid (B,T,d)."""
        return self.attn.qkv(self.ln_1(resid))


class GPT2(HeadModel):
    """GPT-2 language model: token + position embeddings, pre-LN blocks, final LayerNorm, tied LM head."""

    cfg: GPT2Config
    embedding_name, final_norm_name = "wte", "ln_f"

    def __init__(self, cfg: GPT2Config):
        super().__init__(cfg)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.d_model)
        self.h = HeadBlocks(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.wte.weight.dtype

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        """tokens (B,T) at positions start..start+T−1 -> residual stream (B,T,d)."""
        T = tokens.shape[1]
        self.check_length(start + T)
        check_token_tensor(tokens, self.cfg.vocab_size)
        return self.wte(tokens) + self.wpe(torch.arange(start, start + T, device=tokens.device))

    def unembed(self, resid: Tensor) -> Tensor:
        """Final LayerNorm and LM head: (B,T,d) -> logits (B,T,vocab)."""
        x = self.ln_f(resid)
        return self.lm_head(x) if self.lm_head is not None else F.linear(x, self.wte.weight)
