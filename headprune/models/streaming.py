"""Streaming heads (StreamingLLM's attention sinks, DuoAttention's streaming heads): a head that attends only to
the first ``sink`` tokens and the last ``recent`` (itself included), so its KV cache holds sink + recent entries
at any context length.

Per query head i of a layer, with its full-attention output z_i^full and its streaming output z_i^stream (the same
q, k, v; key s visible from query t iff s ≤ t and (s < sink or t − s < recent), and t − s < the layer's own sliding
window where it has one):

    z_i = α_i z_i^full + (1 − α_i) z_i^stream      α_i = 1: full attention, 0: streaming (DuoAttention's gate)

α is [h] or per copy of the batch [B, h], and may require a gradient (the gate gradient dL/dα at α = 1). A KV
head streams when every query head reading it does (:func:`kv_alpha`): only then does its cache shrink. The
streaming output is computed a block of queries at a time (:func:`~headprune.models.attention_ops.streaming_z`),
never as a (T, T) mask, unless the forward forms the probabilities anyway (``need_weights`` or a pattern hook).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from headprune.errors import HeadpruneError
from headprune.models.attention_ops import streaming_probs, streaming_z

#: DuoAttention's default for its streaming heads (StreamingLLM's 4 sinks; a recent window of 256 tokens).
DEFAULT_SINK, DEFAULT_RECENT = 4, 256


@dataclass(frozen=True)
class Streaming:
    """One layer's streaming heads: ``alpha`` [h] or [B, h] per query head (1 full, 0 streaming)."""

    alpha: Tensor
    sink: int = DEFAULT_SINK
    recent: int = DEFAULT_RECENT
    block: int = 256  # queries per block of the banded computation

    def __post_init__(self) -> None:
        check_streaming(self.sink, self.recent)

    def _needed(self, moved: float) -> Tensor:
        """Positions of the query heads with α ≠ ``moved`` somewhere, or every head where α requires a gradient."""
        a = self.alpha.detach().reshape(-1, self.alpha.shape[-1])
        if self.alpha.requires_grad:
            return torch.arange(a.shape[1], device=a.device)
        return (a != moved).any(0).nonzero().flatten()

    def heads(self) -> Tensor:
        """Positions of the query heads whose streaming output is needed: α < 1 somewhere, or every head where α
        requires a gradient."""
        return self._needed(1.0)

    def full_heads(self) -> Tensor:
        """Positions of the query heads whose full-attention output is needed: α ≠ 0 somewhere, or every head where
        α requires a gradient (a head at α = 0 in every row is its streaming output alone)."""
        return self._needed(0.0)

    def mix(self, z_full: Tensor, z_stream: Tensor) -> Tensor:
        """α z_full + (1 − α) z_stream, z (B,h,T,·)."""
        a = self.alpha.view(-1, self.alpha.shape[-1], 1, 1).to(z_full.dtype)
        return z_stream + a * (z_full - z_stream)

    def probs(self, probs: Tensor, q: Tensor, k: Tensor, scale: float, window: int | None) -> Tensor:
        """Mixed probabilities (B,h,T,T) where the forward forms them anyway: α P_full + (1 − α) P_stream."""
        return self.mix(probs, streaming_probs(q, k, scale, self.sink, self.recent, window))

    def output(self, z: Tensor, q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None) -> Tensor:
        """The layer's z (B,h,T,d_k) from its full-attention z, q (B,h,T,d_k) and k, v (B,h_k,T,d_k) with h_k = h
        or h_k = h_kv in the repeat_kv layout (r = h / h_kv consecutive query heads per KV head)."""
        heads = self.heads()
        if not len(heads):
            return z
        kv = heads if k.shape[1] == q.shape[1] else heads // (q.shape[1] // k.shape[1])
        part = streaming_z(q.index_select(1, heads), k.index_select(1, kv), v.index_select(1, kv), scale,
                           self.sink, self.recent, window, self.block)  # (B,n,T,d_k)
        z_stream = z.index_copy(1, heads, part.to(z.dtype))
        return self.mix(z, z_stream)


def check_streaming(sink: int, recent: int, context: int | None = None) -> None:
    """HeadpruneError unless sink ≥ 0 and 1 ≤ recent (and sink + recent < ``context`` where given: else a
    streaming head would see the whole window and change nothing)."""
    if isinstance(sink, bool) or not isinstance(sink, int) or sink < 0:
        raise HeadpruneError(f"sink {sink!r} must be a whole number of tokens, 0 or more", "sink")
    if isinstance(recent, bool) or not isinstance(recent, int) or recent < 1:
        raise HeadpruneError(f"window {recent!r} must be a whole number of tokens, at least 1", "window")
    if context is not None and sink + recent >= context:
        raise HeadpruneError(f"sink {sink} + window {recent} cover the whole context of {context} tokens: a "
                             "streaming head would see everything; give a smaller --window or longer windows", "window")


def kv_alpha(model: nn.Module, layer: int, kv_heads: Sequence[int], *, dtype: torch.dtype = torch.float32) -> Tensor:
    """α [h] of layer ``layer``: 0 for every query head reading one of the KV heads ``kv_heads`` (original
    indices), 1 elsewhere."""
    m = cast(Any, model)
    kept_kv = m.cfg.kept_kv_heads(layer)
    attn = m.h[layer].attn
    alpha = torch.ones(attn.n_heads, dtype=dtype, device=attn.W_O.device)
    for g in kv_heads:
        if g not in kept_kv:
            raise HeadpruneError(f"layer {layer} holds no KV head {g} (it holds {kept_kv})", "heads")
        alpha[[i for i, p in enumerate(attn.kv_positions) if p == kept_kv.index(g)]] = 0
    return alpha


@contextmanager
def streaming(model: nn.Module, layers: Mapping[int, Streaming]) -> Iterator[None]:
    """Layer l's attention runs with ``layers[l]``'s streaming heads inside the block (any family)."""
    attns = [cast(Any, model).h[layer].attn for layer in layers]
    try:
        for attn, spec in zip(attns, layers.values()):
            if spec.alpha.shape[-1] != attn.n_heads:
                raise HeadpruneError(f"streaming alpha for layer {attn.layer} has {spec.alpha.shape[-1]} heads, the "
                                     f"layer holds {attn.n_heads}", "heads")
            attn.streaming = spec
        yield
    finally:
        for attn in attns:
            attn.streaming = None
