"""Llama / Mistral / Qwen2 / Qwen3 / GPT-NeoX against transformers 5's own models (the oracle), on random-init tiny
checkpoints built here with transformers' config classes, with every norm weight and bias perturbed away from its
init so that their handling is tested. fp32 logits agree to <= 1e-4."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import load_family_tokenizer
from headprune.models.hooks import Capture
from headprune.models.interventions import fill_tensors, mask_gates
from headprune.models.prune import prune_heads
from headprune.models.rotary import inv_frequencies

TOL = 1e-4
VOCAB, T = 151, 24
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
BASE = {"vocab_size": VOCAB, "num_hidden_layers": 2, "max_position_embeddings": 64, "initializer_range": 0.15}

# name -> (config class, model class, config kwargs): GQA ratios 1, 2 and 4, odd head counts, head_dim != d/h,
# biases, llama3 rope scaling, a sliding window shorter than the sequence, tied and untied embeddings; Gemma 3 with
# its per-layer-type windows and rope parameters, score scale and logit soft-capping.
def shape(d: int, h: int, kv: int | None, mlp: int, **extra) -> dict:
    """transformers config kwargs: hidden size d, h query heads, kv KV heads (None: no such key), MLP width."""
    kv_key = {} if kv is None else {"num_key_value_heads": kv}
    return {"hidden_size": d, "num_attention_heads": h, "intermediate_size": mlp, **kv_key, **extra}


CASES = {
    "llama-gqa2-bias-llama3": (LlamaConfig, LlamaForCausalLM, shape(
        48, 6, 3, 64, attention_bias=True, mlp_bias=True, rope_parameters=LLAMA3)),
    "llama-gqa4-tied": (LlamaConfig, LlamaForCausalLM, shape(32, 4, 1, 48, tie_word_embeddings=True)),
    "llama-mha-odd": (LlamaConfig, LlamaForCausalLM, shape(40, 5, 5, 56)),
    "mistral-window": (MistralConfig, MistralForCausalLM, shape(32, 4, 2, 48, sliding_window=7, head_dim=12)),
    "qwen2-bias-window": (Qwen2Config, Qwen2ForCausalLM, shape(
        36, 3, 1, 40, use_sliding_window=True, sliding_window=5, max_window_layers=1, tie_word_embeddings=True)),
    "qwen3-headdim": (Qwen3Config, Qwen3ForCausalLM, shape(32, 6, 2, 40, head_dim=10, attention_bias=True)),
    "qwen3-tied-gqa4": (Qwen3Config, Qwen3ForCausalLM, shape(32, 4, 1, 40, head_dim=8, tie_word_embeddings=True)),
    "gemma3-window-gqa2": (Gemma3TextConfig, Gemma3ForCausalLM, shape(
        32, 4, 2, 48, head_dim=12, sliding_window=5, query_pre_attn_scalar=20,
        layer_types=["sliding_attention", "full_attention"])),
    "gemma3-untied-linear-softcap": (Gemma3TextConfig, Gemma3ForCausalLM, shape(
        40, 2, 1, 56, head_dim=24, tie_word_embeddings=False, final_logit_softcapping=3.0, sliding_window=9,
        layer_types=["full_attention", "sliding_attention"], rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
    "neox-parallel": (GPTNeoXConfig, GPTNeoXForCausalLM, shape(
        40, 5, None, 64, rotary_pct=0.5, use_parallel_residual=True)),
    "neox-sequential-tied": (GPTNeoXConfig, GPTNeoXForCausalLM, shape(
        48, 4, None, 64, rotary_pct=0.25, use_parallel_residual=False, tie_word_embeddings=True)),
}


@torch.no_grad()
def perturb(hf) -> None:
    """Random non-zero biases and norm weights (transformers initialises them to 0 and 1)."""
    for name, p in hf.named_parameters():
        if name.endswith("bias") or "norm" in name:
            p.add_(0.3 * torch.randn_like(p))


_BUILT: dict = {}


def build(case: str, tmp_path_factory):
    """(HF model, folder, our model) of a case, built once per session."""
    if case not in _BUILT:
        cfg_cls, model_cls, kwargs = CASES[case]
        torch.manual_seed(sorted(CASES).index(case))
        hf = model_cls(cfg_cls(**BASE, **kwargs)).eval()
        perturb(hf)
        folder = tmp_path_factory.mktemp(case)
        hf.save_pretrained(folder)
        _BUILT[case] = (hf, folder, load_model(folder))
    return _BUILT[case]


def tokens(seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(seed))


def hf_layers(hf):
    return hf.gpt_neox.layers if hasattr(hf, "gpt_neox") else hf.model.layers


def hf_out_proj(hf, layer: int):
    blk = hf_layers(hf)[layer]
    return blk.attention.dense if hasattr(blk, "attention") else blk.self_attn.o_proj


def hf_zeroed(hf, x, heads, d_head):
    """HF logits with query heads ``heads`` [(layer, head)] zeroed by an o_proj forward-pre-hook on their slice."""
    hooks = []
    for layer, head in heads:
        def hook(_module, args, head=head):
            z = args[0].clone()
            z[..., head * d_head:(head + 1) * d_head] = 0
            return (z,)
        hooks.append(hf_out_proj(hf, layer).register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            return hf(x).logits
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_transformers(case, tmp_path_factory):
    hf, _, ours = build(case, tmp_path_factory)
    x = tokens()
    with torch.no_grad():
        want, got = hf(x).logits, ours(x)
        weighted = ours(x, need_weights=True)  # the explicit softmax path
    assert want.abs().max() > 1  # logits large enough for the comparison to mean something
    assert (got - want).abs().max() <= TOL
    assert (weighted - want).abs().max() <= TOL


@pytest.mark.parametrize("case", ["mistral-window", "qwen2-bias-window", "llama-gqa2-bias-llama3", "neox-parallel",
                                  "gemma3-window-gqa2"])
def test_attention_probabilities_equal_eager_transformers(case, tmp_path_factory):
    """Per query head attention patterns (sliding window and GQA included) equal HF eager's output_attentions."""
    _, folder, ours = build(case, tmp_path_factory)
    eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    x = tokens(1)
    capture = Capture()
    with torch.no_grad():
        out = eager(x, output_attentions=True)
        ours(x, capture=capture, need_weights=True)
    for layer, probs in enumerate(out.attentions):
        assert (capture.attn[layer] - probs).abs().max() <= 1e-5
    if case == "mistral-window":  # the window is really applied: nothing beyond 7 tokens back
        assert capture.attn[0][..., 10, :4].abs().max() == 0 and capture.attn[0][..., 10, 4:11].min() > 0
    if case == "gemma3-window-gqa2":  # the window on the sliding layer only (5 tokens back), not on the full one
        assert capture.attn[0][..., 10, :6].abs().max() == 0 and capture.attn[0][..., 10, 6:11].min() > 0
        assert capture.attn[1][..., 10, :11].min() > 0


def test_llama3_scaling_changes_frequencies():
    """The llama3 case would test nothing if its rescaling left θ unchanged at these sizes."""
    plain, scaled = inv_frequencies(8, 10000.0), inv_frequencies(8, 10000.0, LLAMA3)
    assert not torch.allclose(plain, scaled)
    assert torch.equal(scaled[1:], plain[1:] / 8)  # wavelengths 2π/θ above 16 (= L / low_freq_factor): θ / 8
    smooth = (16 / (2 * math.pi) - 1) / (4 - 1)  # θ_0 = 1: wavelength 2π lies between 16/4 and 16/1
    assert scaled[0].item() == pytest.approx((1 - smooth) / 8 + smooth, rel=1e-6)  # by hand


@pytest.mark.parametrize("case", sorted(CASES))
def test_gate_zero_equals_o_proj_prehook(case, tmp_path_factory):
    hf, _, ours = build(case, tmp_path_factory)
    x = tokens(2)
    last = ours.cfg.n_heads - 1
    for heads in ([(0, 0)], [(1, last)], [(0, 1), (1, 0)]):
        with torch.no_grad():
            got = ours(x, gates=mask_gates(ours, heads))
        want = hf_zeroed(hf, x, heads, ours.cfg.d_head)
        assert (got - want).abs().max() <= TOL
        assert (got - ours(x)).abs().max() > 1e-3  # the head mattered


@pytest.mark.parametrize("case", ["llama-gqa2-bias-llama3", "qwen3-headdim", "neox-parallel", "llama-mha-odd"])
def test_head_views_share_storage_and_match_hf(case, tmp_path_factory):
    hf, _, ours = build(case, tmp_path_factory)
    cfg = ours.cfg
    dk, r = cfg.d_head, cfg.n_heads // cfg.n_kv_heads
    for layer in range(cfg.n_layers):
        attn, blk = ours.h[layer].attn, hf_layers(hf)[layer]
        shares = lambda view, param: view.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()
        if hasattr(blk, "attention"):  # GPT-NeoX: per-head interleaved [q_i; k_i; v_i] rows
            W = blk.attention.query_key_value.weight.view(cfg.n_heads, 3, dk, -1)
            hf_q, hf_k, hf_v = W[:, 0], W[:, 1], W[:, 2]  # [h, d_k, d]
            hf_o, fused = blk.attention.dense.weight, attn.query_key_value.weight
            params = {"W_Q": fused, "W_K": fused, "W_V": fused, "W_K_kv": fused, "W_V_kv": fused}
        else:
            sa = blk.self_attn
            hf_q = sa.q_proj.weight.view(cfg.n_heads, dk, -1)
            hf_k, hf_v = (w.view(cfg.n_kv_heads, dk, -1) for w in (sa.k_proj.weight, sa.v_proj.weight))
            hf_o = sa.o_proj.weight
            params = {"W_Q": attn.q_proj.weight, "W_K_kv": attn.k_proj.weight, "W_V_kv": attn.v_proj.weight}
            if r == 1:
                params |= {"W_K": attn.k_proj.weight, "W_V": attn.v_proj.weight}
        params["W_O"] = attn.o_proj.weight if hasattr(attn, "o_proj") else attn.dense.weight
        for name, param in params.items():
            assert shares(getattr(attn, name), param), name
        assert attn.W_Q.shape == (cfg.n_heads, cfg.d_model, dk) and attn.W_O.shape == (cfg.n_heads, dk, cfg.d_model)
        assert attn.kv_group.tolist() == [i // r for i in range(cfg.n_heads)]
        for i in range(cfg.n_heads):
            assert torch.equal(attn.W_Q[i], hf_q[i].T)
            assert torch.equal(attn.W_K[i], hf_k[i // r].T) and torch.equal(attn.W_V[i], hf_v[i // r].T)
            assert torch.equal(attn.W_O[i], hf_o[:, i * dk:(i + 1) * dk].T)


@pytest.mark.parametrize("case", ["qwen2-bias-window", "neox-parallel"])
def test_value_bias_views(case, tmp_path_factory):
    hf, _, ours = build(case, tmp_path_factory)
    attn, blk, cfg = ours.h[0].attn, hf_layers(hf)[0], ours.cfg
    r = cfg.n_heads // cfg.n_kv_heads
    if hasattr(blk, "attention"):
        hf_b_v = blk.attention.query_key_value.bias.view(cfg.n_heads, 3, cfg.d_head)[:, 2]
    else:
        hf_b_v = blk.self_attn.v_proj.bias.view(cfg.n_kv_heads, cfg.d_head)
    assert all(torch.equal(attn.b_V[i], hf_b_v[i // r]) for i in range(cfg.n_heads))
    assert attn.b_V.abs().min() > 0  # perturbed: non-zero


@pytest.mark.parametrize("case", ["llama-gqa2-bias-llama3", "mistral-window", "neox-sequential-tied"])
def test_run_blocks_from_cached_residual(case, tmp_path_factory):
    _, _, ours = build(case, tmp_path_factory)
    x = tokens(3)
    gates = mask_gates(ours, [(1, 1)])
    capture = Capture()
    with torch.no_grad():
        full = ours(x, gates=gates, capture=capture)
        for layer in range(ours.cfg.n_layers):
            resumed = ours.unembed(ours.run_blocks(capture.resid_pre[layer], start=layer, gates=gates))
            assert (resumed - full).abs().max() <= 1e-5
        assert capture.z[0].shape == (2, ours.cfg.n_heads, T, ours.cfg.d_head)  # per QUERY head


@pytest.mark.parametrize("case", ["llama-gqa2-bias-llama3", "qwen2-bias-window", "qwen3-headdim", "neox-parallel"])
def test_capture_z_is_the_o_proj_input(case, tmp_path_factory):
    hf, _, ours = build(case, tmp_path_factory)
    x, seen = tokens(4), {}
    hook = hf_out_proj(hf, 1).register_forward_pre_hook(lambda _m, args: seen.update(z=args[0]))
    capture = Capture()
    with torch.no_grad():
        hf(x)
        ours(x, capture=capture)
    hook.remove()
    B, h, _, dk = capture.z[1].shape
    assert (capture.z[1].transpose(1, 2).reshape(B, T, h * dk) - seen["z"]).abs().max() <= 1e-5


@pytest.mark.parametrize("case", ["llama-gqa2-bias-llama3", "qwen3-tied-gqa4", "mistral-window", "neox-parallel",
                                  "gemma3-window-gqa2"])
def test_pruning_equals_gating(case, tmp_path_factory):
    """Removing query heads physically equals gating them off; a KV head's rows go with its last query head."""
    _, _, ours = build(case, tmp_path_factory)
    cfg, x = ours.cfg, tokens(5)
    r = cfg.n_heads // cfg.n_kv_heads
    group = [(0, h) for h in range(r)]  # every query head of KV head 0 in layer 0
    for heads in ([(0, 1)], group, [*group, (1, cfg.n_heads - 1)], [(1, h) for h in range(cfg.n_heads)]):
        pruned = prune_heads(ours, heads)
        with torch.no_grad():
            want, got = ours(x, gates=mask_gates(ours, heads)), pruned(x)
        assert (got - want).abs().max() <= 1e-5
        for layer in range(cfg.n_layers):
            gone = {h for l, h in heads if l == layer}
            kept_kv = len({h // r for h in range(cfg.n_heads) if h not in gone})
            attn = pruned.h[layer].attn
            assert attn.n_heads == cfg.n_heads - len(gone) and attn.n_kv_heads == kept_kv
            assert attn.W_K_kv.shape[0] == kept_kv and attn.W_O.shape[0] == attn.n_heads
    assert ours.h[0].attn.n_heads == cfg.n_heads  # the input model is unchanged


@pytest.mark.parametrize("case", ["qwen2-bias-window", "neox-parallel", "gemma3-untied-linear-softcap"])
def test_pruning_with_mean_compensation_equals_filled_gates(case, tmp_path_factory):
    _, _, ours = build(case, tmp_path_factory)
    x = tokens(6)
    heads = [(0, 0), (1, ours.cfg.n_heads - 1)]
    fills = {h: torch.randn(ours.cfg.d_head, generator=torch.Generator().manual_seed(h[1])) for h in heads}
    pruned = prune_heads(ours, heads, fills)
    with torch.no_grad():
        want = ours(x, gates=mask_gates(ours, heads), fills=fill_tensors(ours, fills))
        assert (pruned(x) - want).abs().max() <= 1e-5
    assert pruned.cfg.o_bias  # the constant lives in an o_proj bias now (Qwen2 had none)


def test_sharded_bf16_checkpoint_loads(tmp_path):
    torch.manual_seed(7)
    hf = LlamaForCausalLM(LlamaConfig(**BASE, **CASES["llama-gqa2-bias-llama3"][2])).eval()
    perturb(hf)
    hf.to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = load_model(tmp_path, dtype="fp32")
    x = tokens(7)
    with torch.no_grad():
        assert (ours(x) - ref(x).logits).abs().max() <= TOL
    assert load_model(tmp_path, dtype="bf16").dtype == torch.bfloat16


def test_bad_checkpoints_are_refused(tmp_path_factory, tmp_path):
    _, folder, _ = build("llama-gqa4-tied", tmp_path_factory)
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "bert"}))
    with pytest.raises(HeadpruneError,
                       match="'bert' model.*'llama', 'mistral', 'qwen2', 'qwen3', 'gemma3_text', 'gpt_neox'"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config | {"intermediate_size": 50}))
    with pytest.raises(HeadpruneError, match="has shape .*config implies"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config | {"num_key_value_heads": 3}))
    with pytest.raises(HeadpruneError, match="not a usable llama config"):
        load_model(tmp_path)


def test_tokenizer_from_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>"])
    tok.train_from_iterator(["the cat sat on the mat"] * 20, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(tmp_path)
    loaded = load_family_tokenizer(tmp_path, vocab_size=VOCAB)
    assert loaded.decode(loaded("the cat")["input_ids"]) == "the cat"
    with pytest.raises(HeadpruneError, match="embeds only 10"):
        load_family_tokenizer(tmp_path, vocab_size=10)
