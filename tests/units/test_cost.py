"""The cost model against hand counts: GPT-2's F = L·(24·d² + 4·T·d) + 2·d·V, a gated MLP's three matrices, the
ablation sweep's forward-equivalents, and the hint past ten minutes."""

from __future__ import annotations

import pytest

from headprune.cost import Estimate, ablation_fe, block_flops, cheaper_hint, estimate_scoring, forward_flops
from headprune.io.loading import load_model
from headprune.models.gemma3 import Gemma3, Gemma3Config
from headprune.models.meta import on_meta
from headprune.models.prune import prune_heads


def test_gpt2_forward_flops_by_hand(tiny_dir):
    model = load_model(tiny_dir)
    L, d, V, T = model.cfg.n_layers, model.cfg.d_model, model.cfg.vocab_size, 64
    assert model.cfg.d_mlp == 4 * d
    assert forward_flops(model, T) == L * (24 * d * d + 4 * T * d) + 2 * d * V


def test_a_gated_mlp_counts_three_matrices_and_gqa_its_kv_heads():
    with on_meta():
        model = Gemma3(Gemma3Config(vocab_size=100, d_model=64, n_layers=2, n_heads=4, n_kv_heads=1, d_head=32,
                                    d_mlp=96))
    d, dk, h, kv, T = 64, 32, 4, 1, 16
    per_block = 2 * d * (h + 2 * kv) * dk + 2 * h * dk * d + 4 * h * dk * T + 2 * 3 * d * 96
    assert block_flops(model, T) == [per_block, per_block]


def test_ablation_sweep_by_hand(tiny_dir):
    model = prune_heads(load_model(tiny_dir), [(0, 0), (2, 1), (2, 3)])  # heads per layer 3, 4, 2
    T = 32
    c, u = block_flops(model, T), 2 * model.cfg.d_model * model.cfg.vocab_size
    F = sum(c) + u
    want = 1 + (3 * (c[0] + c[1] + c[2] + u) + 4 * (c[1] + c[2] + u) + 2 * (c[2] + u)) / F
    assert ablation_fe(model, T) == pytest.approx(want, rel=1e-12)


def test_estimate_scales_with_tokens_and_hints_past_ten_minutes(tiny_dir):
    model = load_model(tiny_dir)
    methods = ["wo_fro", "fluct", "grad", "abl_zero"]
    small = estimate_scoring(model, methods, 1000, 32, rate=1e9)
    large = estimate_scoring(model, methods, 1_000_000, 32, rate=1e9)
    assert large.total == pytest.approx(1000 * small.total)
    assert small.seconds["gradients"] == pytest.approx(2 * small.seconds["activations"])
    assert small.total < 600 and cheaper_hint(small, methods) is None
    hint = cheaper_hint(Estimate(10, {"abl_zero": 900.0, "gradients": 30.0, "activations": 15.0}), methods)
    assert hint is not None and "--methods wo_fro,fluct,grad" in hint and "45 s" in hint


def test_verify_by_hand_and_named_past_ten_minutes(tiny_dir, monkeypatch):
    from headprune import cost

    model = load_model(tiny_dir)  # 12 heads
    T = 32
    sweep = ablation_fe(model, T)
    fe = cost.verify_fe(model, T, verified=2, subsets=16)
    assert fe["sweep"] == sweep
    assert fe["total"] == pytest.approx(2 + 1 + 2 * (sweep - 1) / 12 + 16, rel=1e-12)  # taylor, base, K, R
    monkeypatch.setattr(cost, "measured_rate", lambda model, seq_len: 1e6)  # slow enough to pass ten minutes
    tokens = 10_000
    lines = cost.scoring_lines(model, ["grad", "abl_zero"], tokens, T)
    want = cost.verify_fe(model, T, 1, 32)["total"] * forward_flops(model, T) * tokens / 1e6  # 10% of 12 -> 1
    assert lines[-1].startswith("or rank by abl_zero without its full sweep: headprune verify --method abl_zero")
    assert lines[-1].endswith(f"takes about {cost.duration(want)}")
