"""What a KV cache holds at a context length, with some KV heads streaming (:mod:`.streaming`).

A KV head of width d_k stores a key and a value per cached position: 2·d_k values. At a context of n tokens it
caches

    full attention:      min(n, w_l)                 positions (w_l: the layer's sliding window, ∞ without one)
    streaming (s + r):   min(n, s + r)               positions (the first s sinks and the last r tokens) without a
                         window; within one, the sinks still inside it and the last min(r, w_l)

so a layer's cache is 2·d_k·bytes · Σ_g positions_g, and the model's the sum over layers: for SmolLM2-135M (30
layers × 3 KV heads × d_k 64, no window) 2·64·2·90 = 23,040 bytes per token of context in fp16, as llama.cpp
reports for its F16 cache.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from headprune.models.base import HeadModel

KVHead = tuple[int, int]  # (layer, original KV head index)
FP16_BYTES = 2  # bytes per cached value in fp16/bf16, the usual cache type


def kv_heads(model: HeadModel) -> list[KVHead]:
    """Every (layer, original KV head) the model holds, layer-major."""
    return [(layer, g) for layer in model.active_layers for g in model.cfg.kept_kv_heads(layer)]


def cached_positions(n_tokens: int, window: int | None, streams: bool, sink: int, recent: int) -> int:
    """Positions one KV head caches at a context of n = ``n_tokens``: those the last query (position n − 1) may see.
    Full attention: [lo, n) with lo = max(0, n − w) (lo = 0 without a window), n − lo positions; streaming: of those,
    the sinks s < sink and the recent s ≥ n − recent (a sink outside a sliding window is gone too)."""
    lo = 0 if window is None else max(0, n_tokens - window)
    if not streams:
        return n_tokens - lo
    sinks_end = min(sink, n_tokens)
    return max(0, sinks_end - lo) + n_tokens - max(lo, n_tokens - recent, sinks_end)


def kv_cache_bytes(model: HeadModel, n_tokens: int, streaming_heads: Collection[KVHead] = (), sink: int = 0,
                   recent: int = 1, bytes_per_value: int = FP16_BYTES) -> int:
    """Bytes of the whole KV cache at a context of ``n_tokens`` with ``streaming_heads`` keeping sink + recent."""
    streams = set(streaming_heads)
    total = 0
    for layer, g in kv_heads(model):
        positions = cached_positions(n_tokens, model.h[layer].attn.window, (layer, g) in streams, sink, recent)
        total += 2 * model.cfg.d_head * bytes_per_value * positions
    return total


def kv_bytes_table(model: HeadModel, contexts: Collection[int], streaming_heads: Collection[KVHead], sink: int,
                   recent: int, bytes_per_value: int = FP16_BYTES) -> Mapping[int, int]:
    """{context: bytes of the cache} at each context length."""
    return {n: kv_cache_bytes(model, n, streaming_heads, sink, recent, bytes_per_value) for n in contexts}
