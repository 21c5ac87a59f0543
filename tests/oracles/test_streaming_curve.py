"""The streaming curve's points (headprune.context.curve) against transformers: a Llama with grouped KV heads and a
Gemma 3 with a sliding layer, each run eagerly with per-head additive masks on every layer (the streaming mask on
the query heads of the streamed KV heads), give the same per-window NLL of the last tokens (<= 1e-5 nats). The KV
cache's bytes are counted by hand; the pattern file is read back, and kvpress' and DuoAttention's own selection
rules applied to its full_attention_heads.tsv pick exactly its streaming heads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from headprune.context.curve import LongProbe, measure_point, point_key, random_order, streaming_curve, streaming_order
from headprune.context.pattern import KVPattern, read_pattern, write_pattern
from headprune.errors import HeadpruneError
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.read.loading import load_model
from headprune.models.kv_cache import kv_cache_bytes, kv_heads
from headprune.schema import DEFAULT_MODEL

VOCAB, T, TAIL, SINK, RECENT = 97, 40, 12, 3, 6
BASE = {"vocab_size": VOCAB, "num_hidden_layers": 2, "max_position_embeddings": 64, "initializer_range": 0.15,
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48}
CASES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, {"head_dim": 12, "sliding_window": 9,
                                                     "layer_types": ["sliding_attention", "full_attention"]}),
}
_BUILT: dict = {}


def build(case: str, tmp_path_factory):
    if case not in _BUILT:
        cfg_cls, model_cls, extra = CASES[case]
        torch.manual_seed(3)
        hf = model_cls(cfg_cls(**BASE, **extra)).eval()
        folder = tmp_path_factory.mktemp(case)
        hf.save_pretrained(folder)
        hf.set_attn_implementation("eager")
        _BUILT[case] = (hf, load_model(folder))
    return _BUILT[case]


def hf_tail_nll(hf, x, streamed: list[tuple[int, int]], windows: list[int | None]) -> torch.Tensor:
    """[b] transformers' mean NLL of each window's last TAIL tokens with ``streamed`` KV heads (layer, g)
    streaming: every layer's mask replaced per head by a pre-hook."""
    n_heads, group = BASE["num_attention_heads"], BASE["num_attention_heads"] // BASE["num_key_value_heads"]
    handles = []
    for layer, window in enumerate(windows):
        allowed = torch.tensor([[s <= q and (window is None or q - s < window) for s in range(T)] for q in range(T)])
        allowed = allowed.expand(n_heads, T, T).clone()
        stream = torch.tensor([[s < SINK or q - s < RECENT for s in range(T)] for q in range(T)])
        for lay, g in streamed:
            if lay == layer:
                allowed[g * group:(g + 1) * group] &= stream
        additive = torch.zeros(1, n_heads, T, T).masked_fill(~allowed, float("-inf"))
        handles.append(hf.model.layers[layer].self_attn.register_forward_pre_hook(
            lambda _m, args, kwargs, a=additive: (args, {**kwargs, "attention_mask": a}), with_kwargs=True))
    try:
        with torch.no_grad():
            logits = hf(x).logits[:, -TAIL - 1:-1].double()
    finally:
        for h in handles:
            h.remove()
    return F.cross_entropy(logits.transpose(1, 2), x[:, -TAIL:], reduction="none").mean(1)


@pytest.mark.parametrize("case", list(CASES))
def test_curve_points_match_transformers(case, tmp_path_factory):
    hf, ours = build(case, tmp_path_factory)
    x = torch.randint(0, VOCAB, (3, T), generator=torch.Generator().manual_seed(0))
    probe = LongProbe(x, TAIL, [], SINK, RECENT)
    windows = [ours.h[layer].attn.window for layer in range(2)]
    order = random_order(ours, 1)
    curve, points = streaming_curve(ours, probe, {"random/1": order}, (0.25, 0.75, 1.0), show_progress=False)
    assert list(curve.n_streaming) == [0, 1, 3, 4]
    plain = hf_tail_nll(hf, x, [], windows)
    for n in (0, 1, 3, 4):
        got = torch.tensor(points[point_key(order[:n])]["tail_nll"], dtype=torch.float64)
        expected = hf_tail_nll(hf, x, order[:n], windows)
        assert (got - expected).abs().max() <= 1e-5, n
        if n:
            assert (expected - plain).abs().max() > 1e-4  # streaming changed the NLL: the check has teeth
    assert measure_point(ours, probe, order[:1])["right"] == []


def test_streaming_order_by_kv_need(tmp_path_factory):
    _, ours = build("llama", tmp_path_factory)
    # query heads 0,1 read KV head 0 and 2,3 KV head 1; a KV head's need is its largest query head's score
    scores = {(0, 0): 0.5, (0, 1): 0.1, (0, 2): 0.3, (0, 3): 0.2, (1, 0): 0.0, (1, 1): 0.05, (1, 2): 0.9, (1, 3): 0.0}
    assert streaming_order(ours, scores) == [(1, 0), (0, 1), (0, 0), (1, 1)]
    with pytest.raises(HeadpruneError, match="no finite score"):
        streaming_order(ours, {**scores, (1, 2): float("nan"), (1, 3): float("nan")})


def test_kv_cache_bytes_by_hand(tmp_path_factory):
    shipped = load_model(DEFAULT_MODEL)  # 6 layers x 8 KV heads x d_k 32, no window
    per_token = 2 * 32 * 2 * 48  # K and V, fp16
    assert kv_cache_bytes(shipped, 2048) == 2048 * per_token == 12_582_912
    assert kv_cache_bytes(shipped, 2048, kv_heads(shipped), 4, 32) == 36 * per_token
    assert kv_cache_bytes(shipped, 20, kv_heads(shipped), 4, 32) == 20 * per_token  # shorter than sink + recent
    _, gemma = build("gemma3", tmp_path_factory)  # layer 0: window 9, layer 1 global; 2 KV heads x d_k 12
    per_head = 2 * 12 * 2
    assert kv_cache_bytes(gemma, 1000) == per_head * (2 * 9 + 2 * 1000)
    # streaming (3 sinks + 4 recent): in the window-9 layer the sinks have left the window (the last query, 999,
    # sees 991..999), so 4 positions; in the global layer 3 + 4
    assert kv_cache_bytes(gemma, 1000, [(0, 0), (1, 1)], 3, 4) == per_head * (4 + 9 + 7 + 1000)
    assert kv_cache_bytes(gemma, 8, [(0, 0)], 3, 4) == per_head * (7 + 8 + 2 * 8)  # within the window: 3 + 4
    assert kv_cache_bytes(gemma, 10, [(0, 0)], 3, 4) == per_head * (2 + 4 + 9 + 2 * 10)  # sinks 1, 2 still in


def kvpress_streaming(scores: np.ndarray, ratio: float) -> set[tuple[int, int]]:
    """kvpress' DuoAttentionPress rule: the round(ratio · L·G) lowest scores stream."""
    n = round(scores.size * ratio)
    rows, cols = np.unravel_index(np.argsort(scores, axis=None)[:n], scores.shape)
    return {(int(r), int(c)) for r, c in zip(rows, cols)}


def test_pattern_files(tmp_path):
    shipped = load_model(DEFAULT_MODEL)
    order = random_order(shipped, 5)
    pattern = KVPattern(model_fingerprint(shipped), 4, 32, order, 20, "random/5", {"tolerance": 0.01})
    written = write_pattern(pattern, shipped, tmp_path / "p")
    assert sorted(p.name for p in written) == ["config.json", "full_attention_heads.tsv", "kv_pattern.json"]
    back = read_pattern(tmp_path / "p")
    assert back == pattern
    scores = np.loadtxt(tmp_path / "p" / "full_attention_heads.tsv", delimiter="\t")
    assert scores.shape == (6, 8) and scores.min() >= 0 and scores.max() <= 1
    streaming = set(order[:20])
    assert kvpress_streaming(scores, 20 / 48) == streaming
    assert {(int(r), int(c)) for r, c in zip(*np.nonzero(scores < 0.5))} == streaming  # DuoAttention's cut
    assert [tuple(k) for k in np.array(np.unravel_index(np.argsort(scores, axis=None), scores.shape)).T] == order
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert (config["sink_size"], config["recent_size"]) == (4, 32)
    layers = back.layers(shipped)
    zeroed = {(layer, h) for layer, s in layers.items() for h in range(8) if s.alpha[h] == 0}
    assert zeroed == streaming  # multi-head attention: KV head g is query head g


def test_pattern_refusals(tmp_path, tmp_path_factory):
    shipped = load_model(DEFAULT_MODEL)
    _, other = build("llama", tmp_path_factory)
    pattern = KVPattern(model_fingerprint(shipped), 4, 32, kv_heads(shipped), 3, "x")
    with pytest.raises(HeadpruneError, match="another model"):
        pattern.layers(other)
    write_pattern(pattern, shipped, tmp_path / "p")
    path = tmp_path / "p" / "kv_pattern.json"
    record = json.loads(path.read_text())
    for bad, match in [({**record, "format": "x"}, "not a headprune streaming pattern"),
                       ({k: v for k, v in record.items() if k != "sink"}, "damaged"),
                       ({**record, "n_streaming": 99}, "inconsistent")]:
        path.write_text(json.dumps(bad))
        with pytest.raises(HeadpruneError, match=match):
            read_pattern(path)
    path.write_text("{")
    with pytest.raises(HeadpruneError, match="cannot read"):
        read_pattern(path)
    with pytest.raises(HeadpruneError, match="no streaming pattern"):
        read_pattern(tmp_path / "absent.json")
