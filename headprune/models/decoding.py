"""Decoding with a KV cache in which streaming KV heads keep only their sinks and recent window (DuoAttention's
inference, :mod:`.streaming`'s heads): the memory a streaming pattern saves, held and measured, not only computed.

Per layer and kept KV head g the cache holds keys and values (B, n_g, d_k), rotated, at absolute positions p_g [n_g].
A step feeds tokens at positions t = start..start+T−1 (:func:`feed`); each query head i reads its KV head's cached
keys and the step's own:

    z_i(t) = Σ_{s visible from t} softmax_s(q_i(t) k_g(i)(s)ᵀ · scale) v_g(i)(s)

with s visible iff s ≤ t, t − s < the layer's sliding window (where it has one) and, for a streaming head, s < sink
or t − s < recent (:func:`~headprune.models.attention_ops.streaming_allowed`): the forward's own mask, so decoded
logits are the forward's (under :func:`~headprune.models.streaming.streaming` for the same heads). After each step
the keys the step's last query could not see are dropped (no later query sees them): a streaming head keeps at most
sink + recent positions, a head of a sliding-window layer its window, a full head everything, so between steps the
cache holds :func:`~headprune.models.kv_cache.kv_cache_bytes` (one key more per head, transiently, within a step).
A prompt is fed in chunks (:func:`prefill`), so the largest transient is one KV head's (B, r, chunk, n) scores,
never (T, T); :func:`greedy` then continues it a token at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.models.attention_ops import streaming_allowed
from headprune.models.base import HeadAttention, HeadModel
from headprune.models.kv_cache import KVHead, kv_heads
from headprune.models.streaming import DEFAULT_RECENT, DEFAULT_SINK, check_streaming
from headprune.models.token_check import check_token_tensor

DEFAULT_CHUNK = 512  # prompt tokens per prefill step


class LayerCache:
    """One layer's KV cache: per kept KV head, its keys and values (B, n_g, d_k) and their positions [n_g]."""

    def __init__(self, attn: HeadAttention, streams: Sequence[bool], sink: int, recent: int) -> None:
        self.scale, self.window, self.sink, self.recent = attn.scale, attn.window, sink, recent
        self.streams = list(streams)  # [n_kv_heads]: whether kept KV head g streams
        self.readers = [[i for i, p in enumerate(attn.kv_positions) if p == g] for g in range(attn.n_kv_heads)]
        self.keys: list[Tensor | None] = [None] * attn.n_kv_heads
        self.values: list[Tensor | None] = [None] * attn.n_kv_heads
        self.positions = [torch.empty(0, dtype=torch.long) for _ in range(attn.n_kv_heads)]
        self.start = 0  # position of this step's first token, set by :func:`attached` from the KVCache's count

    def visible(self, t: Tensor, s: Tensor, g: int) -> Tensor:
        """Bool, True where query position t may read key position s through KV head g."""
        if self.streams[g]:
            return streaming_allowed(t, s, self.sink, self.recent, self.window)
        allowed = s <= t
        return allowed if self.window is None else allowed & (t - s < self.window)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """z (B,h,T,d_k) of this step's q (B,h,T,d_k) against the cache and this step's k, v (B,h_kv,T,d_k), which
        join the cache; then what no later query can see leaves it."""
        B, _, T, dk = q.shape
        t = torch.arange(self.start, self.start + T, device=q.device)
        z = torch.empty_like(q)
        for g, heads in enumerate(self.readers):
            cached_k, cached_v = self.keys[g], self.values[g]
            keys = k[:, g] if cached_k is None else torch.cat([cached_k, k[:, g]], dim=1)  # (B, n, d_k)
            values = v[:, g] if cached_v is None else torch.cat([cached_v, v[:, g]], dim=1)
            positions = torch.cat([self.positions[g].to(q.device), t])  # [n]
            shape = (B, len(heads), keys.shape[1], dk)
            z[:, heads] = F.scaled_dot_product_attention(
                q[:, heads], keys[:, None].expand(shape), values[:, None].expand(shape),
                attn_mask=self.visible(t[:, None], positions[None, :], g), scale=self.scale)
            keep = self.visible(t[-1:], positions, g)  # what the last query saw: later ones see no earlier key
            if not bool(keep.all()):
                keys, values, positions = keys[:, keep], values[:, keep], positions[keep]
            self.keys[g], self.values[g], self.positions[g] = keys, values, positions
        return z

    def bytes(self) -> int:
        """Bytes of the keys and values this layer holds."""
        return sum(t.numel() * t.element_size() for t in [*self.keys, *self.values] if t is not None)


class KVCache:
    """The KV caches of every layer holding heads, for one batch of sequences fed token by token (or in chunks);
    the KV heads ``streaming_heads`` ((layer, original KV head)) keep ``sink`` + ``recent`` positions."""

    def __init__(self, model: HeadModel, streaming_heads: Collection[KVHead] = (), sink: int = DEFAULT_SINK,
                 recent: int = DEFAULT_RECENT) -> None:
        check_streaming(sink, recent)
        streams = set(streaming_heads)
        unknown = sorted(streams - set(kv_heads(model)))
        if unknown:
            raise HeadpruneError(f"the model holds no KV head {unknown[0]} (layer, KV head) to stream", "heads")
        self.sink, self.recent, self.streaming_heads = sink, recent, sorted(streams)
        self.layers = {layer: LayerCache(model.h[layer].attn, [(layer, g) in streams
                                                              for g in model.cfg.kept_kv_heads(layer)], sink, recent)
                       for layer in model.active_layers}
        self.next = 0  # tokens fed so far

    def bytes(self) -> int:
        """Bytes of every key and value the cache holds now."""
        return sum(layer.bytes() for layer in self.layers.values())

    def cached_positions(self) -> dict[KVHead, list[int]]:
        """{(layer, kept KV head position): the positions its cache holds}."""
        return {(layer, g): c.positions[g].tolist() for layer, c in self.layers.items() for g in range(len(c.streams))}


@contextmanager
def attached(model: HeadModel, cache: KVCache) -> Iterator[None]:
    """Every layer's attention reads and extends ``cache`` inside the block, the step starting at ``cache.next``."""
    try:
        for layer, layer_cache in cache.layers.items():
            layer_cache.start = cache.next
            model.h[layer].attn.cache = layer_cache
        yield
    finally:
        for layer in cache.layers:
            model.h[layer].attn.cache = None


@torch.no_grad()
def feed(model: HeadModel, cache: KVCache, tokens: Tensor, *, last_only: bool = False) -> Tensor:
    """tokens (B,T), the next T of each sequence after the cache's -> logits (B,T,vocab) (or (B,1,vocab) of the
    last position with ``last_only``); the cache then holds them."""
    check_token_tensor(tokens, model.cfg.vocab_size)
    start = cache.next
    if start + tokens.shape[1] > model.cfg.n_positions:
        raise HeadpruneError(f"decoding past the model's context: {start} cached + {tokens.shape[1]} new tokens > "
                             f"n_positions {model.cfg.n_positions}", "tokens")
    with attached(model, cache):
        resid = model.embed(tokens, start)  # (B,T,d)
        extra = model.block_inputs(resid, start)
        for block in model.h:
            resid = block(resid, *extra)
    cache.next += tokens.shape[1]
    return model.unembed(resid[:, -1:] if last_only else resid)


def prefill(model: HeadModel, cache: KVCache, prompt: Tensor, *, chunk: int = DEFAULT_CHUNK) -> Tensor:
    """Feed ``prompt`` (B,T) ``chunk`` tokens at a time; logits (B,1,vocab) of its last position."""
    if prompt.shape[1] == 0:
        raise HeadpruneError("an empty prompt: decoding needs at least one token", "tokens")
    logits = prompt.new_empty(0)
    for a in range(0, prompt.shape[1], chunk):
        logits = feed(model, cache, prompt[:, a:a + chunk], last_only=True)
    return logits


def greedy(model: HeadModel, cache: KVCache, logits: Tensor, new_tokens: int) -> Tensor:
    """The ``new_tokens`` (B, new_tokens) argmax continuation after ``logits`` (B,·,vocab), the logits of the last
    token the cache holds: each chosen token but the last is fed."""
    out = []
    for step in range(new_tokens):
        out.append(logits[:, -1].argmax(-1, keepdim=True))  # (B,1)
        if step + 1 < new_tokens:
            logits = feed(model, cache, out[-1], last_only=True)
    return torch.cat(out, dim=1) if out else logits.new_empty(logits.shape[0], 0, dtype=torch.long)


def generate(model: HeadModel, prompt: Tensor, new_tokens: int, *, cache: KVCache | None = None,
             chunk: int = DEFAULT_CHUNK) -> Tensor:
    """Greedy decoding: the ``new_tokens`` (B, new_tokens) argmax continuation of ``prompt`` (B,T), through
    ``cache`` (default: full attention everywhere), the prompt fed ``chunk`` tokens at a time."""
    cache = KVCache(model) if cache is None else cache
    return greedy(model, cache, prefill(model, cache, prompt, chunk=chunk), new_tokens)
