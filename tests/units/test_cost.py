"""The cost model against hand counts: GPT-2's F = L·(24·d² + 4·T·d) + 2·d·V, a gated MLP's three matrices, the
ablation sweep's forward-equivalents, and the hint past ten minutes."""

from __future__ import annotations

import pytest

from headprune.cost import (
    MIN_WINDOWS,
    REFERENCE_RATE,
    RUN_BUDGET_SECONDS,
    Estimate,
    Pace,
    RunPlan,
    ablation_fe,
    block_flops,
    cheaper_hint,
    estimate_scoring,
    forward_flops,
    head_flops,
    methods_fe,
    run_budget,
    run_fe,
    run_seconds,
)
from headprune.io.read.loading import load_model
from headprune.models.gemma3 import Gemma3, Gemma3Config
from headprune.models.meta import on_meta
from headprune.models.prune import prune_heads
from headprune.schema import parse_methods


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
    small = estimate_scoring(model, methods, 1000, 32, Pace(1e9))
    large = estimate_scoring(model, methods, 1_000_000, 32, Pace(1e9))
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
    fe = cost.verify_fe(model, T, verified=2, subsets=16, rounds=1)
    assert fe["sweep"] == sweep
    assert fe["total"] == pytest.approx(2 + 1 + 2 * (sweep - 1) / 12 + 16, rel=1e-12)  # taylor, base, K, R
    two = cost.verify_fe(model, T, verified=2, subsets=16)  # the default: a second round, its own cached forward
    assert two["total"] == pytest.approx(2 + 2 * (1 + 2 * (sweep - 1) / 12) + 16, rel=1e-12)
    tokens = 10_000
    lines = cost.scoring_lines(model, ["grad", "abl_zero"], tokens, T, Pace(1e6))  # slow enough to pass ten minutes
    want = cost.verify_fe(model, T, 1, 32)["total"] * forward_flops(model, T) * tokens / 1e6  # 10% of 12 -> 1
    assert lines[-2].startswith("or rank by abl_zero without its full sweep: headprune verify --method abl_zero")
    assert lines[-2].endswith(f"takes about {cost.duration(want)}")
    first = ablation_fe(model, T) * forward_flops(model, T) * 8 * T / 1e6  # rank's first round: 8 windows
    assert lines[-1] == ("or certify its top 10% exactly within a time you choose: headprune rank --method abl_zero "
                         f"--margin 0.005 --max-minutes M (its first round, every head on {8 * T:,} tokens, takes "
                         f"about {cost.duration(first)}; then only the heads whose place is open)")


def _smollm2_shapes():
    """SmolLM2-135M's shapes on the meta device (no weights: the budget is arithmetic on shapes)."""
    from headprune.models.llama import LlamaLike, LlamaLikeConfig

    with on_meta():
        return LlamaLike(LlamaLikeConfig(vocab_size=49152, n_positions=8192, d_model=576, n_layers=30, n_heads=9,
                                         n_kv_heads=3, d_head=64, d_mlp=1536, tie_word_embeddings=True))


RUN_PLAN = RunPlan(parse_methods(["all"]), rankings=16, fractions=tuple(round(0.1 * i, 1) for i in range(9)),
                   seeds=5, patch_pairs=32)


def test_run_stages_by_hand(tiny_dir):
    """Curves: the baseline, then each of 16 rankings, 5 seeds and the mean-compensated best at the 8 fractions
    above 0; scoring: the methods' sweeps and passes plus the anatomy and serving."""
    model = load_model(tiny_dir)
    fe = run_fe(model, RUN_PLAN, 64)
    assert fe["curves"] == 1 + (16 + 5 + 1) * 8
    assert fe["scoring"] == pytest.approx(sum(methods_fe(model, RUN_PLAN.methods, 64).values()), rel=1e-12)
    # each layer's heads removed together on both splits: the baseline, then layer l reruns layers l..L-1 and the
    # LM head; the tiny GPT-2's blocks all cost the same, c, and its LM head u
    c, u, n_layers = block_flops(model, 64)[0], head_flops(model), model.cfg.n_layers
    reruns = sum((n_layers - layer) * c + u for layer in range(n_layers))
    assert fe["layers"] == pytest.approx(2 * (1 + reruns / (n_layers * c + u)), rel=1e-12)
    seconds = run_seconds(model, RUN_PLAN, 1000, 64, rate=1e9)
    assert seconds["curves"] == pytest.approx(fe["curves"] * forward_flops(model, 64) * 1000 / 1e9, rel=1e-12)


def test_run_budget_keeps_the_shipped_models_default_and_cuts_smollm2s():
    """The shipped model's run fits: 8,192 tokens in its 256-token windows (the committed report's budget).
    SmolLM2's does not even in its shortest window: the budget is raised to the floor of MIN_WINDOWS windows of 128
    (its run then overruns the target a little: the layers removed whole on both splits tipped it over)."""
    shipped = load_model("stdlib-gpt2-mini")
    kept = run_budget(shipped, RUN_PLAN, 8192, None)
    assert (kept.tokens, kept.seq_len) == (8192, 256) and sum(kept.seconds.values()) <= RUN_BUDGET_SECONDS
    assert "(the default)" in kept.line(8192)
    smol = _smollm2_shapes()
    cut = run_budget(smol, RUN_PLAN, 8192, None)
    assert (cut.tokens, cut.seq_len) == (1024, 128)  # the number --max-tokens' help gives
    assert cut.tokens == MIN_WINDOWS * cut.seq_len and RUN_BUDGET_SECONDS < sum(cut.seconds.values()) < sum(
        run_seconds(smol, RUN_PLAN, cut.tokens + cut.seq_len, cut.seq_len, REFERENCE_RATE).values())
    assert sum(cut.seconds.values()) - cut.seconds["layers"] <= RUN_BUDGET_SECONDS
    assert cut.default_seconds == pytest.approx(sum(run_seconds(smol, RUN_PLAN, 8192, 1024, REFERENCE_RATE).values()))
    assert "1,024 tokens per split in windows of 128" in cut.line(8192)
    given = run_budget(smol, RUN_PLAN, 8192, 512)  # a given window is kept, the tokens fill whole windows of it
    assert given.seq_len == 512 and given.tokens % 512 == 0 and given.tokens >= MIN_WINDOWS * 512


def test_run_resolves_its_budget_into_the_settings_of_the_explicit_command():
    """``run`` without --max-tokens: the budget's tokens and window become the settings (what the report lists and
    its reproduce commands say); a given --seq-len is kept; with --max-tokens nothing changes."""
    from headprune.stages.inputs import RunSettings, resolve_budget

    smol = _smollm2_shapes()
    s = RunSettings(model="smollm2-135m-instruct", budget=True)
    budget = resolve_budget(s, smol)
    assert (s.max_tokens, s.seq_len, s.budget) == (1024, 128, False) and budget.tokens == 1024
    assert resolve_budget(s, smol) is None and s.max_tokens == 1024  # resolved once
    given = RunSettings(model="smollm2-135m-instruct", budget=True, seq_len=512)
    resolve_budget(given, smol)
    assert given.seq_len == 512 and given.max_tokens % 512 == 0
    explicit = RunSettings(model="smollm2-135m-instruct", max_tokens=4096)
    assert resolve_budget(explicit, smol) is None and (explicit.max_tokens, explicit.seq_len) == (4096, None)
    shipped = RunSettings(model="stdlib-gpt2-mini", budget=True)  # nothing cut: the settings stay the defaults
    assert resolve_budget(shipped, load_model("stdlib-gpt2-mini")).tokens == 8192
    assert (shipped.max_tokens, shipped.seq_len) == (8192, None)


def test_a_model_whose_fixed_stages_overrun_the_target_gets_the_floor():
    """SmolLM2-360M's shapes (32 layers of 15 heads, d 960): patching and the report alone pass 25 minutes at
    4,000 prompt pairs, so the budget is the floor, 8 windows of 128; a stride keeps windows at least as long."""
    from headprune.models.llama import LlamaLike, LlamaLikeConfig

    with on_meta():
        big = LlamaLike(LlamaLikeConfig(vocab_size=49152, n_positions=8192, d_model=960, n_layers=32, n_heads=15,
                                        n_kv_heads=5, d_head=64, d_mlp=2560, tie_word_embeddings=True))
    crowded = RunPlan(RUN_PLAN.methods, 16, RUN_PLAN.fractions, 5, patch_pairs=4000)
    floor = run_budget(big, crowded, 8192, None)
    assert (floor.tokens, floor.seq_len) == (1024, 128) and sum(floor.seconds.values()) > RUN_BUDGET_SECONDS
    assert run_budget(big, RUN_PLAN, 8192, None, stride=512).seq_len >= 512


def test_the_estimate_is_a_range_around_its_point_in_two_significant_figures():
    from headprune.cost import ESTIMATE_SPREAD, duration

    assert [duration(s) for s in (41, 99.4, 210, 720, 4320, 7200)] == ["41 s", "99 s", "3.5 min", "12 min",
                                                                      "72 min", "2.0 h"]
    est = Estimate("on 10 tokens", {"a": 50.0, "b": 30.0})
    assert ESTIMATE_SPREAD == 1.5 and (est.low, est.high) == pytest.approx((80 / 1.5, 120.0))
    assert est.line() == "estimated time: 53 s to 2.0 min (about 80 s) on 10 tokens (a 50 s, b 30 s)"
    assert Estimate("here", {"a": 80.0}).line() == "estimated time: 53 s to 2.0 min (about 80 s) here"


def test_the_rate_is_the_median_of_timed_forwards_after_a_warm_up_and_measured_once(tiny_dir, monkeypatch):
    """Three timed forwards of 3, 1 and 2 s after an untimed one: the rate is F·batch·T / 2 s (the median, not the
    fastest); the same model and shape again is not timed again."""
    from headprune.cost import rate

    model = load_model(tiny_dir)
    clock = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # start/stop of each timed forward
    calls = []
    monkeypatch.setattr(rate.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(rate, "model_nll", lambda m, tokens: calls.append(tuple(tokens.shape)))
    got = rate.measured_rate(model, 16, batch=4)
    assert got == forward_flops(model, 16) * 4 * 16 / 2.0
    assert calls == [(4, 16)] * 4  # the warm-up and three timed
    assert rate.measured_rate(model, 16, batch=4) == got and len(calls) == 4
    assert Pace(got, 2).seconds(model, 16, 1000, 3.0) == pytest.approx(3 * forward_flops(model, 16) * 1000 / got / 2)


def test_curve_patch_verify_and_run_estimates_by_hand(tiny_dir):
    from headprune.cost import (
        estimate_curves,
        estimate_patching,
        estimate_run,
        estimate_verify,
        patching_fe,
        verify_fe,
    )

    model = load_model(tiny_dir)  # 12 heads
    pace, T, N = Pace(1e9, 2), 32, 4096
    per_fe = forward_flops(model, T) * N / 2e9
    curves = estimate_curves(model, 40, N, T, pace, fill_tokens=N // 2)
    assert curves.seconds == pytest.approx({"curves": 41 * per_fe, "fills": per_fe / 2})
    sweep = ablation_fe(model, 12)
    assert patching_fe(model, 12, 1, 2, 64) == pytest.approx(2 + 3 + (sweep - 1) + 128)
    assert patching_fe(model, 12, 2, 0, 0, by_position=True) == pytest.approx(2 + 2 * (sweep - 1) * 12)
    patching = estimate_patching(model, 32, 12, 1, 2, 64, pace)
    assert patching.total == pytest.approx(patching_fe(model, 12, 1, 2, 64) * forward_flops(model, 12) * 384 / 2e9)
    verifying, exact = estimate_verify(model, T, N, pace, verify_fe(model, T, 2, 16))
    assert verifying.total == pytest.approx(verify_fe(model, T, 2, 16)["total"] * per_fe)
    assert exact.total == pytest.approx((ablation_fe(model, T) + 2) * per_fe)  # the sweep and taylor's pass
    assert estimate_verify(model, T, N, pace, verify_fe(model, T, 2, 16, estimate=None))[1].total == pytest.approx(
        ablation_fe(model, T) * per_fe)
    run = estimate_run(model, RUN_PLAN, N, T, pace)
    assert run.seconds == pytest.approx(run_seconds(model, RUN_PLAN, N, T, 2e9))
