"""Decoding through headprune's KV cache (headprune.models.decoding) in every family: a prompt fed in chunks of 13
and then one token at a time gives transformers' logits at every position (full attention), and, with one KV head
streaming, the logits of headprune's banded streaming forward (itself checked against transformers with the explicit
mask in test_streaming_heads.py), fp32 within 1e-4. The cache then holds exactly the positions the mask leaves
visible (the sinks and the last `recent`; a sliding layer's last `window`), so its bytes are kv_cache_bytes'; greedy
decoding picks transformers' generate's tokens; a pruned model with uneven head counts decodes as it forwards."""

from __future__ import annotations

import pytest
import torch

from headprune.errors import HeadpruneError
from headprune.models.decoding import KVCache, feed, generate, prefill
from headprune.models.kv_cache import kv_cache_bytes
from headprune.models.prune import prune_heads
from headprune.models.streaming import Streaming, kv_alpha, streaming

from family_cases import CASES, VOCAB, build

TOL = 1e-4
T, PROMPT, CHUNK, SINK, RECENT = 40, 25, 13, 3, 6


def tokens(seed: int = 0, length: int = T) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))


def decoded(model, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits (B,T,vocab): the first PROMPT tokens fed CHUNK at a time, then one token per step."""
    parts = [feed(model, cache, x[:, a:min(a + CHUNK, PROMPT)]) for a in range(0, PROMPT, CHUNK)]
    parts += [feed(model, cache, x[:, t:t + 1]) for t in range(PROMPT, x.shape[1])]
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("case", list(CASES))
def test_full_attention_decoding_gives_transformers_logits(case, tmp_path_factory):
    hf, ours, _ = build(case, tmp_path_factory)
    x = tokens()
    cache = KVCache(ours)
    got = decoded(ours, x, cache)
    with torch.no_grad():
        expected = hf(x).logits
    assert (got - expected).abs().max() <= TOL
    assert cache.next == T
    assert cache.bytes() == 2 * kv_cache_bytes(ours, T, bytes_per_value=4)  # a batch of 2 sequences, fp32


@pytest.mark.parametrize("case", list(CASES))
def test_a_streaming_kv_head_decodes_as_the_streaming_forward(case, tmp_path_factory):
    _, ours, (layer, kv_head) = build(case, tmp_path_factory)
    x = tokens(1)
    with torch.no_grad():
        full = ours(x)
        with streaming(ours, {layer: Streaming(kv_alpha(ours, layer, [kv_head]), SINK, RECENT)}):
            expected = ours(x)
    cache = KVCache(ours, [(layer, kv_head)], SINK, RECENT)
    got = decoded(ours, x, cache)
    assert (got - expected).abs().max() <= TOL
    assert (full - expected).abs().max() > 1e-3  # streaming changed the logits: the check has teeth
    held = cache.cached_positions()
    position = ours.cfg.kept_kv_heads(layer).index(kv_head)
    window = ours.h[layer].attn.window
    in_window = [s for s in range(T) if window is None or T - 1 - s < window]  # a sink outside the window is gone
    assert held[(layer, position)] == [s for s in in_window if s < SINK or T - 1 - s < RECENT]
    for (lay, g), positions in held.items():  # every other head: the whole context, or its layer's window
        if (lay, g) != (layer, position):
            w = ours.h[lay].attn.window
            assert positions == list(range(0 if w is None else max(0, T - w), T))
    assert cache.bytes() == 2 * kv_cache_bytes(ours, T, [(layer, kv_head)], SINK, RECENT, bytes_per_value=4)


@pytest.mark.parametrize("case", ["gpt2", "llama-gqa2", "gemma3-global", "neox"])
def test_greedy_decoding_picks_transformers_tokens(case, tmp_path_factory):
    hf, ours, _ = build(case, tmp_path_factory)
    prompt = tokens(2, 9)
    got = generate(ours, prompt, 12, chunk=4)
    with torch.no_grad():
        expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, min_new_tokens=12,
                               do_sample=False, pad_token_id=0)[:, 9:]
    assert torch.equal(got, expected)


def test_a_pruned_model_with_uneven_heads_decodes_as_it_forwards(tmp_path_factory):
    _, ours, _ = build("llama-gqa2", tmp_path_factory)
    # layer 0 keeps 3 query heads over 2 KV heads, layer 1 keeps 5
    pruned = prune_heads(ours, [(0, 0), (0, 1), (0, 5), (1, 2)])
    assert [len(k) for k in pruned.cfg.kept_heads] == [3, 5]
    x = tokens(3)
    with torch.no_grad():
        expected = pruned(x)
    cache = KVCache(pruned, [(1, 0)], SINK, RECENT)
    with torch.no_grad(), streaming(pruned, {1: Streaming(kv_alpha(pruned, 1, [0]), SINK, RECENT)}):
        expected_streaming = pruned(x)
    assert (decoded(pruned, x, KVCache(pruned)) - expected).abs().max() <= TOL
    assert (decoded(pruned, x, cache) - expected_streaming).abs().max() <= TOL


def test_refusals(tmp_path_factory):
    _, ours, _ = build("llama-gqa2", tmp_path_factory)
    with pytest.raises(HeadpruneError, match="no KV head"):
        KVCache(ours, [(0, 7)])
    with pytest.raises(HeadpruneError, match="window"):
        KVCache(ours, [(0, 0)], sink=2, recent=0)
    with pytest.raises(HeadpruneError, match="empty prompt"):
        prefill(ours, KVCache(ours), tokens(0, 0))
    cache = KVCache(ours)
    feed(ours, cache, tokens(0, 60))
    with pytest.raises(HeadpruneError, match="past the model's context"):
        feed(ours, cache, tokens(0, 5))
    assert all(blk.attn.cache is None for blk in ours.h)  # detached after the refusal too
