"""What every headprune model family shares: the per-head interface, grouped-query attention with gates, the
layer-wise forward (physical pruning of query heads: :mod:`.prune`).

Attention of a layer with h query heads and h_kv ≤ h key/value heads (grouped-query attention, GQA; h_kv = h is
multi-head attention) on x (B,T,d); query head i reads the keys and values of KV head g(i) (``kv_group``):

    q_i = x W_Q^(i) + b_Q^(i),  k_g = x W_K^(g) + b_K^(g),  v_g = x W_V^(g) + b_V^(g)    each (B,T,d_k)
    z_i = softmax(q_i k_g(i)ᵀ / √d_k + mask) v_g(i)                                     (B,T,d_k)
    z_i ← g_i z_i + (1 − g_i) f_i                   gates g (1 keeps, 0 ablates) and fills f, per QUERY head
    out = Σ_i z_i W_O^(i) + b_O                     W_O^(i): the d_k columns of o_proj that read head i

Before pruning, g(i) = ⌊i / (h / h_kv)⌋ (transformers' ``repeat_kv``). A layer keeps any subset of its original
query heads (``cfg.kept_heads[l]``, original indices) and exactly the KV heads that still serve one of them, so a KV
head's k/v rows go when its last query head goes.

Per-head views (TransformerLens layout): ``W_Q [h, d, d_k]``, ``W_O [h, d_k, d]`` and ``W_K_kv``, ``W_V_kv
[h_kv, d, d_k]`` share the weights' storage. ``W_K`` and ``W_V [h, d, d_k]`` give each QUERY head its KV head's
weights (W_K[i] = W_K_kv[g(i)]): a view where every KV head serves one query head; under GQA no strided tensor can
repeat rows (index ⌊i/r⌋ is not linear in i), so there they are a gathered copy: write through the ``_kv`` views.
``b_O`` always exists (zero where the family has no o_proj bias), so mean compensation and value-bias folding have
a bias to go into; ``cfg.o_bias`` says whether the checkpoint stores one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from headprune.errors import HeadpruneError
from headprune.models.attention_ops import causal_probs, full_attention, gated
from headprune.models.head_config import Head, HeadConfig, Origin
from headprune.models.hooks import AttentionHook, Capture, StepCache
from headprune.models.streaming import Streaming
from headprune.models.token_check import check_token_tensor


class HeadAttention(nn.Module):
    """Base of every family's attention: per-head views, the GQA map and the gated attention core.

    A subclass sets ``n_heads``, ``n_kv_heads``, ``d_head``, ``layer``, ``kv_heads`` (the kept KV heads' original
    indices), ``kv_positions`` (per kept query head, its KV head's position among them) and implements the raw
    views below plus :meth:`pruned_state`."""

    layer: int
    n_heads: int  # query heads this layer keeps
    n_kv_heads: int  # KV heads this layer keeps
    d_head: int
    kv_positions: list[int]  # [n_heads]: g(i) as a position among the kept KV heads
    scale: float  # of q kᵀ
    window: int | None = None  # sliding window of this layer (Mistral, Qwen2), None: causal only
    hook: AttentionHook | None = None  # set by :func:`hooked`
    streaming: Streaming | None = None  # streaming heads, set by :func:`~headprune.models.streaming.streaming`
    cache: StepCache | None = None  # this layer's KV cache while decoding (:mod:`headprune.models.decoding`)
    PARAM_ROLES: ClassVar[dict[str, str]] = {}  # submodule -> its role in the ledger ("o_proj" -> "W_O")

    def set_groups(self, cfg: HeadConfig, layer: int) -> None:
        kept, kv = cfg.kept_heads[layer], cfg.kept_kv_heads(layer)
        self.layer, self.n_heads, self.n_kv_heads, self.d_head = layer, len(kept), len(kv), cfg.d_head
        self.kv_positions = [kv.index(cfg.kv_head(h)) for h in kept]
        self.one_to_one = self.kv_positions == list(range(self.n_heads))  # MHA, or one query head per KV head
        # every KV head serves the same number r of consecutive query heads: repeat_kv's layout (SDPA's enable_gqa)
        r = self.n_heads // max(self.n_kv_heads, 1)
        self.repeat_kv_layout = r > 0 and self.kv_positions == [i // r for i in range(self.n_heads)]

    @property
    def kv_group(self) -> Tensor:
        """[n_heads] int64: g(i), the position of query head i's KV head in this layer's k/v weights."""
        return torch.tensor(self.kv_positions, dtype=torch.long, device=self.W_O.device)

    def _per_query(self, t: Tensor) -> Tensor:
        """[n_kv, ...] -> [n_heads, ...]: row g(i) for each query head (a view when one-to-one)."""
        return t if self.one_to_one else t.index_select(0, self.kv_group)

    # Raw views the family provides.
    @property
    def W_Q(self) -> Tensor:  # [n_heads, d_model, d_head]
        raise NotImplementedError

    @property
    def W_K_kv(self) -> Tensor:  # [n_kv_heads, d_model, d_head]
        raise NotImplementedError

    @property
    def W_V_kv(self) -> Tensor:  # [n_kv_heads, d_model, d_head]
        raise NotImplementedError

    @property
    def W_O(self) -> Tensor:  # [n_heads, d_head, d_model]
        raise NotImplementedError

    @property
    def b_Q(self) -> Tensor:  # [n_heads, d_head] (zeros where the family has no bias)
        raise NotImplementedError

    @property
    def b_K_kv(self) -> Tensor:  # [n_kv_heads, d_head]
        raise NotImplementedError

    @property
    def b_V_kv(self) -> Tensor:  # [n_kv_heads, d_head]
        raise NotImplementedError

    @property
    def b_O(self) -> Tensor:  # [d_model]
        raise NotImplementedError

    # Per query head.
    @property
    def W_K(self) -> Tensor:
        return self._per_query(self.W_K_kv)

    @property
    def W_V(self) -> Tensor:
        return self._per_query(self.W_V_kv)

    @property
    def b_K(self) -> Tensor:
        return self._per_query(self.b_K_kv)

    @property
    def b_V(self) -> Tensor:
        return self._per_query(self.b_V_kv)

    def probs(self, q: Tensor, k: Tensor) -> Tensor:
        """Attention probabilities (B,h,T,T) of q (B,h,T,d_k) and k (B,h_kv,T,d_k), as :meth:`attend` computes them."""
        return causal_probs(q, k if self.one_to_one else k.index_select(1, self.kv_group), self.scale, self.window)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (B,h,T,d_k), k and v (B,h_kv,T,d_k) of the normed input x (B,T,d), rotary applied (cos, sin: its
        tables)."""
        raise NotImplementedError

    def pruned_state(self, prefix: str, keep: list[int], b_O: Tensor) -> dict[str, Tensor]:
        """This layer's attention tensors (state-dict keys under ``prefix``) keeping the query heads at positions
        ``keep`` and the KV heads they read, with output bias ``b_O``."""
        raise NotImplementedError

    def full_width_state(self, prefix: str, cfg: HeadConfig) -> dict[str, Tensor]:
        """This layer's attention tensors (keys under ``prefix``) at the original head counts ``cfg.n_heads`` /
        ``cfg.n_kv_heads``: each head the layer no longer holds has zero q/k/v rows (and biases) and zero W_O
        columns, so it adds exactly 0 (what an hf export writes where transformers cannot hold fewer heads)."""
        raise NotImplementedError

    def attend(
        self,
        q: Tensor,  # (B,h,T,d_k), rotated
        k: Tensor,  # (B,h_kv,T,d_k), rotated
        v: Tensor,  # (B,h_kv,T,d_k)
        gate: Tensor | None = None,  # [h], [B, h] or [B, h, T]
        fill: Tensor | None = None,  # [h, d_k] or [B, h, T, d_k]
        capture: Capture | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """concat_i z_i (B,T,h·d_k) after gates and fills (:func:`gated`): the input of o_proj. z_i = softmax(q_i
        k_g(i)ᵀ · ``self.scale`` + mask) v_g(i), the mask causal and, in a layer with a sliding ``self.window``,
        also t − s < window."""
        B, h, T, dk = q.shape
        hook, scale, window = self.hook, self.scale, self.window
        if hook is not None:
            q, k, v = hook.qkv(q, k, v)
        if self.cache is not None:  # decoding: the queries read the cached keys and this step's
            return gated(self.cache.attend(q, k, v), gate, fill).transpose(1, 2).reshape(B, T, h * dk)
        explicit = need_weights or (hook is not None and hook.needs_pattern)
        if explicit or not (self.one_to_one or self.repeat_kv_layout):  # each query head its own K/V rows
            k, v = k.index_select(1, self.kv_group), v.index_select(1, self.kv_group)
        if explicit:
            probs = causal_probs(q, k, scale, window)  # (B,h,T,T)
            if self.streaming is not None:
                probs = self.streaming.probs(probs, q, k, scale, window)
            if hook is not None:
                probs = hook.pattern(probs)
            z = probs @ v  # (B,h,T,d_k)
            if capture is not None and need_weights:
                capture.record_attn(self.layer, probs)
        else:
            full = None if self.streaming is None else self.streaming.full_heads()
            z = full_attention(q, k, v, scale, window, full)  # only the heads that are not wholly streaming
            if self.streaming is not None:  # streaming heads: their banded z, mixed in by α
                z = self.streaming.output(z, q, k, v, scale, window)
        if capture is not None:
            capture.z[self.layer] = z
        return gated(z, gate, fill).transpose(1, 2).reshape(B, T, h * dk)


class HeadBlock(nn.Module):
    """A transformer block whose attention is a :class:`HeadAttention`, read through ``input_layernorm``."""

    attn: HeadAttention
    input_layernorm: nn.Module

    def qkv(self, resid: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (B,h,T,d_k), k and v (B,h_kv,T,d_k) of this block's attention on the residual resid (B,T,d)."""
        return self.attn.qkv(self.input_layernorm(resid), cos, sin)

    def attn_write_scale(self, attn_out: Tensor) -> Tensor | None:
        """s with what attention adds to the residual = attn_out ⊙ s, where a norm sits between them (Gemma's
        post-attention norm); None where attention adds its output as it is."""
        return None


class HeadBlocks(nn.ModuleList):
    """``model.h``: ``model.h[l]`` and ``for blk in model.h`` give a :class:`HeadBlock`."""

    def __getitem__(self, idx: int) -> HeadBlock:  # type: ignore[override]  # only ints are used
        return cast(HeadBlock, super().__getitem__(idx))

    def __iter__(self) -> Iterator[HeadBlock]:
        return cast("Iterator[HeadBlock]", super().__iter__())


class HeadModel(nn.Module):
    """The interface of every family (GPT-2, the Llama-like decoders, Gemma 3, GPT-NeoX):

    ``embed`` (tokens -> residual), ``run_blocks`` (layers start..stop-1 from a cached residual, with per-layer gates
    and fills), ``unembed`` (final norm and LM head), ``forward`` (all three). A family implements ``embed``,
    ``unembed``, ``block_inputs`` (what every block needs besides the residual, e.g. rotary tables), ``h``, the
    effective embedding and unembedding ``W_E`` / ``W_U`` and ``final_norm``."""

    cfg: HeadConfig
    h: HeadBlocks

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.origin = Origin()  # set by the loader; kept by pruning

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def head_ids(self) -> list[Head]:
        """(layer, original query head index) of every query head the model holds, in weight order."""
        return [(layer, head) for layer, kept in enumerate(self.cfg.kept_heads) for head in kept]

    def require_heads(self, what: str) -> None:
        """Refuse head-level work (``what``) on a model that has no heads left (fully pruned)."""
        if not self.head_ids:
            raise HeadpruneError(f"the model has no attention heads left (fully pruned); {what} needs at least one")

    @property
    def active_layers(self) -> list[int]:
        """Layers that hold at least one head, in order."""
        return [layer for layer, kept in enumerate(self.cfg.kept_heads) if kept]

    embedding_name: ClassVar[str] = "embed_tokens"  # the token embedding module
    lm_head_name: ClassVar[str] = "lm_head"  # the untied LM head (None when tied)
    final_norm_name: ClassVar[str] = "norm"  # the norm before the LM head

    @property
    def final_norm(self) -> nn.Module:
        return getattr(self, self.final_norm_name)

    @property
    def W_E(self) -> Tensor:
        """[vocab, d]: the token embedding as the first block reads it (:meth:`embedding_rows` of every row)."""
        return self.embedding_rows(0, getattr(self, self.embedding_name).weight.shape[0])

    def embedding_rows(self, start: int, stop: int) -> Tensor:
        """[stop − start, d]: rows start..stop of :attr:`W_E`, formed for those rows alone (a family that scales its
        embedding, such as Gemma 3, overrides this: its whole W_E is a copy of the vocabulary's size)."""
        return getattr(self, self.embedding_name).weight[start:stop]

    @property
    def W_U(self) -> Tensor:
        """[vocab, d]: the LM head's rows (the token embedding's, unscaled, when tied)."""
        head = getattr(self, self.lm_head_name)
        return head.weight if head is not None else getattr(self, self.embedding_name).weight

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        """tokens (B,T) at positions start..start+T−1 (``start`` > 0 only when decoding) -> residual (B,T,d)."""
        raise NotImplementedError

    def unembed(self, resid: Tensor) -> Tensor:
        raise NotImplementedError

    def block_inputs(self, resid: Tensor, start: int = 0) -> tuple[Any, ...]:
        """Extra positional inputs of every block for a residual (B,T,d) at positions start..start+T−1, computed
        once per run_blocks."""
        return ()

    def qkv(self, layer: int, resid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (B,h,T,d_k), k and v (B,h_kv,T,d_k), after rotary, of layer ``layer`` on the residual (B,T,d)
        entering it."""
        return self.h[layer].qkv(resid, *self.block_inputs(resid))

    def check_length(self, T: int) -> None:
        if T > self.cfg.n_positions:
            raise HeadpruneError(f"sequence length {T} exceeds the model's n_positions {self.cfg.n_positions}; use "
                                 "shorter windows (--seq-len)")

    def run_blocks(
        self,
        resid: Tensor,  # (B,T,d), the residual stream entering layer `start`
        start: int = 0,
        stop: int | None = None,
        gates: Sequence[Tensor | None] | None = None,
        fills: Sequence[Tensor | None] | None = None,
        capture: Capture | None = None,
        need_weights: bool = False,
        checkpoint_layers: bool = False,
    ) -> Tensor:
        """Layers start..stop-1. ``gates[l]``/``fills[l]`` are indexed by absolute layer.

        ``checkpoint_layers`` (under autograd): each block keeps only its input for the backward, which reruns the
        block's forward when it reaches it; the saved activations are one block's instead of every block's, for
        one more forward of the blocks (the same values: the rerun computes what the forward did)."""
        extra = self.block_inputs(resid)
        for layer in range(start, self.cfg.n_layers if stop is None else stop):
            if capture is not None:
                capture.resid_pre[layer] = resid
            gate = gates[layer] if gates is not None else None
            fill = fills[layer] if fills is not None else None
            if checkpoint_layers and torch.is_grad_enabled():
                resid = checkpoint(self.h[layer], resid, *extra, gate, fill, capture, need_weights, use_reentrant=False)
            else:
                resid = self.h[layer](resid, *extra, gate, fill, capture, need_weights)
        return resid

    def forward(
        self,
        tokens: Tensor,  # (B,T) int64
        gates: Sequence[Tensor | None] | None = None,  # per layer: [n_heads_l] or [B, n_heads_l]
        fills: Sequence[Tensor | None] | None = None,  # per layer: [n_heads_l, d_head]
        capture: Capture | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """tokens (B,T) -> logits (B,T,vocab)."""
        check_token_tensor(tokens, self.cfg.vocab_size)
        return self.unembed(self.run_blocks(self.embed(tokens), 0, None, gates, fills, capture, need_weights))

    def ones_gates(self, requires_grad: bool = False, dtype: torch.dtype = torch.float32) -> list[Tensor]:
        """One gate tensor per layer, all ones: [n_heads_l]."""
        return [torch.ones(blk.attn.n_heads, device=self.device, dtype=dtype, requires_grad=requires_grad)
                for blk in self.h]

