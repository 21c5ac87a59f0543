"""Streaming heads (headprune.models.streaming) against transformers' own models in every family: transformers runs
eagerly with layer l's attention mask replaced, through a forward pre-hook on that layer's attention module, by a
per-head additive mask (1, H, T, T): the streaming mask (first `sink` keys and the last `recent`, within the layer's
own sliding window) on the query heads of the streamed KV head, the layer's usual mask on the others. fp32 logits
agree to <= 1e-4. The banded computation runs in blocks of 7 queries over T = 40, so blocks, sinks outside the
block's keys and the window edge are all crossed. Mixed gates (0 < α < 1) are checked against the explicit path
(the (T, T) probabilities mixed), and dL/dα against a finite difference."""

from __future__ import annotations

import pytest
import torch

from headprune.errors import HeadpruneError
from headprune.models.streaming import Streaming, kv_alpha, streaming

from family_cases import CASES, VOCAB, build

TOL = 1e-4
T, SINK, RECENT, BLOCK = 40, 3, 6, 7
def hf_attention(hf, layer: int):
    if hasattr(hf, "transformer"):
        return hf.transformer.h[layer].attn
    if hasattr(hf, "gpt_neox"):
        return hf.gpt_neox.layers[layer].attention
    return hf.model.layers[layer].self_attn


def hf_streaming_logits(hf, x, layer: int, query_heads: list[int], window: int | None) -> torch.Tensor:
    """transformers' logits with ``query_heads`` of ``layer`` streaming: the layer's mask replaced per head."""
    cfg = hf.config
    n_heads = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    usual = torch.tensor([[s <= q and (window is None or q - s < window) for s in range(T)] for q in range(T)])
    allowed = usual.expand(n_heads, T, T).clone()
    allowed[query_heads] &= torch.tensor([[s < SINK or q - s < RECENT for s in range(T)] for q in range(T)])
    additive = torch.zeros(1, n_heads, T, T).masked_fill(~allowed, float("-inf"))

    def pre_hook(_module, args, kwargs):
        return args, {**kwargs, "attention_mask": additive}

    handle = hf_attention(hf, layer).register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        with torch.no_grad():
            return hf(x).logits
    finally:
        handle.remove()


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", list(CASES))
def test_one_streaming_kv_head_matches_transformers(case, tmp_path_factory):
    hf, ours, (layer, kv_head) = build(case, tmp_path_factory)
    x = tokens()
    attn = ours.h[layer].attn
    alpha = kv_alpha(ours, layer, [kv_head])
    query_heads = [i for i in range(attn.n_heads) if alpha[i] == 0]
    assert query_heads and len(query_heads) == attn.n_heads // attn.n_kv_heads
    expected = hf_streaming_logits(hf, x, layer, query_heads, attn.window)
    with torch.no_grad():
        plain = ours(x)
        with streaming(ours, {layer: Streaming(alpha, SINK, RECENT, BLOCK)}):
            got = ours(x)
            explicit = ours(x, need_weights=True)  # the (T, T) path
    assert (got - expected).abs().max() <= TOL
    assert (explicit - expected).abs().max() <= TOL
    assert (plain - expected).abs().max() > 1e-3  # streaming changed the logits: the check has teeth


@pytest.mark.parametrize("case", ["llama-gqa2", "gemma3-global", "gpt2"])
def test_mixed_gates_and_their_gradient(case, tmp_path_factory):
    """α between 0 and 1, per copy of the batch: the banded path equals the explicit mixture of probabilities, and
    dL/dα equals a central finite difference of the loss."""
    _, ours, (layer, _) = build(case, tmp_path_factory)
    x = tokens(1)
    n_heads = ours.h[layer].attn.n_heads
    alpha = torch.rand(2, n_heads, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    with torch.no_grad(), streaming(ours, {layer: Streaming(alpha, SINK, RECENT, BLOCK)}):
        banded, explicit = ours(x), ours(x, need_weights=True)
    assert (banded - explicit).abs().max() <= TOL

    def loss(a: torch.Tensor) -> torch.Tensor:
        with streaming(ours, {layer: Streaming(a, SINK, RECENT, BLOCK)}):
            logits = ours(x).double()
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))

    ones = torch.ones(n_heads, requires_grad=True)
    (grad,) = torch.autograd.grad(loss(ones), ones)
    eps = 1e-2
    for i in range(n_heads):
        step = torch.zeros(n_heads)
        step[i] = eps
        with torch.no_grad():
            fd = (loss(torch.ones(n_heads) + step) - loss(torch.ones(n_heads) - step)) / (2 * eps)
        assert abs(float(grad[i]) - float(fd)) <= 2e-4 * max(1.0, abs(float(fd)))


def test_refusals(tmp_path_factory):
    _, ours, _ = build("llama-gqa2", tmp_path_factory)
    with pytest.raises(HeadpruneError, match="window"):
        Streaming(torch.zeros(6), 4, 0)
    with pytest.raises(HeadpruneError, match="sink"):
        Streaming(torch.zeros(6), -1, 4)
    with pytest.raises(HeadpruneError, match="no KV head 7"):
        kv_alpha(ours, 0, [7])
    with pytest.raises(HeadpruneError, match="holds 6"), streaming(ours, {0: Streaming(torch.zeros(4))}):
        pass
