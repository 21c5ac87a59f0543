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

from collections.abc import Callable, Iterator, Sequence
from typing import cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headprune.errors import HeadpruneError
from headprune.models.attention_ops import causal_probs, gated
from headprune.models.gpt2_config import ModelConfig
from headprune.models.head_config import Origin
from headprune.models.hooks import AttentionHook, Capture


def check_token_tensor(tokens: Tensor, vocab_size: int) -> None:
    """HeadpruneError unless ``tokens`` is an integer tensor of ids in [0, vocab_size) (an id outside would be an
    index error deep in the embedding, or on a GPU a device-side assert)."""
    if not isinstance(tokens, Tensor) or tokens.dtype not in (
        torch.long, torch.int32, torch.int16, torch.uint8
    ):
        raise HeadpruneError("token ids must be an integer tensor, "
                             f"got {getattr(tokens, 'dtype', type(tokens).__name__)}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise HeadpruneError(f"token ids lie outside the model's vocabulary [0, {vocab_size}) "
                             f"(min {int(tokens.min())}, max {int(tokens.max())}); use the model's own tokenizer")



class Conv1D(nn.Module):
    """GPT-2's linear layer: y = x W + b with W stored [in, out]."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: Tensor) -> Tensor:
        shape = (*x.shape[:-1], self.weight.shape[1])
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class Attention(nn.Module):
    """Multi-head causal self-attention; every head in one batched call, gates and fills per head."""

    hook: AttentionHook | None = None  # set by headprune.models.hooks.hooked

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads = len(cfg.kept_heads[layer])  # heads this layer keeps
        self.d_head = cfg.d_head
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
    def W_K(self) -> Tensor:
        return self._qkv_view(self.c_attn.weight, 1)

    @property
    def W_V(self) -> Tensor:
        return self._qkv_view(self.c_attn.weight, 2)

    @property
    def b_Q(self) -> Tensor:
        return self._qkv_view(self.c_attn.bias, 0)

    @property
    def b_K(self) -> Tensor:
        return self._qkv_view(self.c_attn.bias, 1)

    @property
    def b_V(self) -> Tensor:
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

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (each (B,h,T,d_k)) of the normed input x (B,T,d)."""
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        return q, k, v

    def probs(self, q: Tensor, k: Tensor) -> Tensor:
        """Attention probabilities (B,h,T,T) of q and k (each (B,h,T,d_k)), as the forward computes them."""
        return causal_probs(q, k, self.scale)

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
        q, k, v = self.qkv(x)
        hook = self.hook
        if hook is not None:
            q, k, v = hook.qkv(q, k, v)
        if need_weights or (hook is not None and hook.needs_pattern):
            probs = self.probs(q, k)  # (B,h,T,T)
            if hook is not None:
                probs = hook.pattern(probs)
            z = probs @ v  # (B,h,T,d_k)
            if capture is not None and need_weights:
                capture.attn[self.layer] = probs
        else:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)  # (B,h,T,d_k)
        if capture is not None:
            capture.z[self.layer] = z
        z = gated(z, gate, fill).transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)  # concat_i z_i
        return self.c_proj(z)  # (B,T,d)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = Conv1D(cfg.d_model, cfg.d_mlp)
        self.c_proj = Conv1D(cfg.d_mlp, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(·))."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg, layer)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, gate: Tensor | None = None, fill: Tensor | None = None,
                capture: Capture | None = None, need_weights: bool = False) -> Tensor:
        x = x + self.attn(self.ln_1(x), gate, fill, capture, need_weights)
        return x + self.mlp(self.ln_2(x))

    def qkv(self, resid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (each (B,h,T,d_k)) of this block's attention on the residual resid (B,T,d)."""
        return self.attn.qkv(self.ln_1(resid))


class Blocks(nn.ModuleList):
    """The ``nn.ModuleList`` of a GPT2's Blocks, typed so ``model.h[l]`` and ``for blk in model.h`` give a Block."""

    @overload
    def __getitem__(self, idx: slice) -> Blocks: ...

    @overload
    def __getitem__(self, idx: int) -> Block: ...

    def __getitem__(self, idx: int | slice) -> Block | Blocks:
        return cast("Block | Blocks", super().__getitem__(idx))  # only Blocks are ever stored

    def __iter__(self) -> Iterator[Block]:
        return cast("Iterator[Block]", super().__iter__())


class GPT2(nn.Module):
    """GPT-2 language model: token + position embeddings, pre-LN blocks, final LayerNorm, tied LM head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.d_model)
        self.h = Blocks(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.origin = Origin()  # set by the loader; kept by pruning

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.wte.weight.dtype

    @property
    def head_ids(self) -> list[tuple[int, int]]:
        """(layer, original head index) of every head the model holds, in weight order."""
        return [(layer, head) for layer, kept in enumerate(self.cfg.kept_heads) for head in kept]

    def require_heads(self, what: str) -> None:
        """Refuse head-level work (``what``) on a model that has no heads left (fully pruned)."""
        if not self.head_ids:
            raise HeadpruneError(f"the model has no attention heads left (fully pruned); {what} needs at least one")

    @property
    def active_layers(self) -> list[int]:
        """Layers that hold at least one head, in order (layer-major head order skips the others)."""
        return [layer for layer, kept in enumerate(self.cfg.kept_heads) if kept]

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens (B,T) -> residual stream (B,T,d)."""
        T = tokens.shape[1]
        if T > self.cfg.n_positions:
            raise ValueError(f"sequence length {T} exceeds n_positions {self.cfg.n_positions}")
        check_token_tensor(tokens, self.cfg.vocab_size)
        return self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))

    def run_blocks(
        self,
        resid: Tensor,  # (B,T,d), the residual stream entering layer `start`
        start: int = 0,
        stop: int | None = None,
        gates: Sequence[Tensor | None] | None = None,
        fills: Sequence[Tensor | None] | None = None,
        capture: Capture | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """Layers start..stop-1. ``gates[l]``/``fills[l]`` are indexed by absolute layer."""
        for layer in range(start, self.cfg.n_layers if stop is None else stop):
            if capture is not None:
                capture.resid_pre[layer] = resid
            gate = gates[layer] if gates is not None else None
            fill = fills[layer] if fills is not None else None
            resid = self.h[layer](resid, gate, fill, capture, need_weights)
        return resid

    def qkv(self, layer: int, resid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (each (B,h,T,d_k)) of layer ``layer`` on the residual (B,T,d) entering it."""
        return self.h[layer].qkv(resid)

    def unembed(self, resid: Tensor) -> Tensor:
        """Final LayerNorm and LM head: (B,T,d) -> logits (B,T,vocab)."""
        x = self.ln_f(resid)
        return self.lm_head(x) if self.lm_head is not None else F.linear(x, self.wte.weight)

    def forward(
        self,
        tokens: Tensor,  # (B,T) int64
        gates: Sequence[Tensor | None] | None = None,  # per layer: [n_heads_l], [B, n_heads_l] or [B, n_heads_l, T]
        fills: Sequence[Tensor | None] | None = None,  # per layer: [n_heads_l, d_head] or [B, n_heads_l, T, d_head]
        capture: Capture | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """tokens (B,T) -> logits (B,T,vocab)."""
        return self.unembed(self.run_blocks(self.embed(tokens), 0, None, gates, fills, capture, need_weights))

    def ones_gates(self, requires_grad: bool = False, dtype: torch.dtype = torch.float32) -> list[Tensor]:
        """One gate tensor per layer, all ones: [n_heads_l]."""
        return [torch.ones(blk.attn.n_heads, device=self.device, dtype=dtype, requires_grad=requires_grad)
                for blk in self.h]


def token_nll(logits: Tensor, tokens: Tensor) -> Tensor:
    """Per-position next-token NLL: logits (B,T,V), tokens (B,T) -> (B,T-1), in fp32 or wider.

    The last position (no next token) gets target -100 (ignored) instead of being sliced off, so fp32 logits
    are used in place rather than copied (a batch's logits are tens of MB)."""
    B, T, V = logits.shape
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    targets = F.pad(tokens[:, 1:], (0, 1), value=-100)  # (B,T)
    return F.cross_entropy(logits.reshape(B * T, V), targets.reshape(-1), reduction="none").view(B, T)[:, :-1]


NLL_CHUNK_TOKENS = 1024  # positions whose logits unembed_nll holds at once


def unembed_nll(model: nn.Module, resid: Tensor, tokens: Tensor, chunk_tokens: int = NLL_CHUNK_TOKENS) -> Tensor:
    """``token_nll(model.unembed(resid), tokens)`` (B,T-1) from the final residual stream (B,T,d), the LM head
    applied to ⌊chunk_tokens / T⌋ windows (at least one) at a time.

    The LM head and the softmax act per position, so each window's NLLs are those of the whole batch (bit for bit
    on the CPUs measured); the logits held at once are chunk × vocab floats instead of B·T × vocab (10% faster
    here at vocab 8192, and 0.5 instead of 1 GiB per batch of 8 × 256 at Llama-3's 128,256)."""
    rows = max(1, chunk_tokens // resid.shape[1])
    unembed = cast(Callable[[Tensor], Tensor], model.unembed)
    return torch.cat([token_nll(unembed(r), t) for r, t in zip(resid.split(rows), tokens.split(rows))])


def count_params(model: GPT2) -> int:
    return sum(p.numel() for p in model.parameters())
