"""hf exports of pruned Qwen2 (q/k/v biases, GQA 3) and Qwen3 (q/k RMSNorm, head_dim != d/h) checkpoints, loaded by
stock transformers: their logits equal the ORIGINAL transformers model with the removed query heads zeroed by an
o_proj forward-pre-hook. A uniform prune (the same heads in every layer, whole KV groups or kept groups' shares)
is written at smaller shapes; any other keeps the original shapes with the removed heads zeroed."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from headprune.io.read.loading import load_model
from headprune.io.write.export import export_hf
from headprune.models.prune import prune_heads
from tests.oracles.test_families import build, hf_zeroed, tokens

TOL = 1e-4

# case -> (heads removed by a zeroed prune, heads removed by a uniform prune, (query, KV) heads per layer left)
PRUNES = {
    "qwen2-bias-window": ([(0, 1), (1, 0), (1, 2)], [(0, 2), (1, 2)], (2, 1)),
    "qwen3-headdim": ([(0, 0), (0, 4), (1, 5)], [(l, h) for l in range(2) for h in (3, 4, 5)], (3, 1)),
    "qwen3-tied-gqa4": ([(1, 1), (1, 2)], [(l, h) for l in range(2) for h in (0, 3)], (2, 1)),
}


def _hf_export_logits(ours, removed, folder, x):
    export_hf(prune_heads(ours, removed), folder)
    config = json.loads((folder / "config.json").read_text())
    theirs = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return config, theirs, theirs(x).logits


@pytest.mark.parametrize("case", sorted(PRUNES))
def test_qwen_hf_exports_equal_hf_with_heads_zeroed(case, tmp_path_factory, tmp_path):
    hf, folder, _ = build(case, tmp_path_factory)
    ours = load_model(folder)
    zeroed, uniform, (n_q, n_kv) = PRUNES[case]
    d_head = ours.cfg.d_head
    x = tokens(3)

    config, _, got = _hf_export_logits(ours, zeroed, tmp_path / "zeroed", x)
    assert config["num_attention_heads"] == hf.config.num_attention_heads  # original shapes
    want = hf_zeroed(hf, x, zeroed, d_head)
    assert (got - want).abs().max() <= TOL
    with torch.no_grad():
        assert (want - hf(x).logits).abs().max() > 100 * TOL  # the removed heads mattered

    config, compact, got = _hf_export_logits(ours, uniform, tmp_path / "compact", x)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (n_q, n_kv, d_head)
    attn = compact.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (n_q * d_head, hf.config.hidden_size)
    assert attn.k_proj.weight.shape == (n_kv * d_head, hf.config.hidden_size)
    assert (got - hf_zeroed(hf, x, uniform, d_head)).abs().max() <= TOL


def test_llama_head_counts_transformers_refuses_are_exported_zeroed_and_avoided_by_uniform(tmp_path):
    """transformers 5's LlamaConfig refuses hidden_size % num_attention_heads != 0 even with head_dim given (24 / 5
    here), so a uniform prune to 5 heads of 4 is written at the original shapes, and ``uniform_heads`` only picks
    counts the config accepts."""
    import pandas as pd
    from huggingface_hub.errors import StrictDataclassClassValidationError
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig

    from headprune.io.write.export import hf_layout, is_compact
    from headprune.models.families import loadable_head_count
    from headprune.pruning.uniform import uniform_heads

    for n in range(1, 7):
        try:
            LlamaConfig(hidden_size=24, num_attention_heads=n, num_key_value_heads=1, head_dim=4)
            accepted = True
        except StrictDataclassClassValidationError:  # transformers' config validation
            accepted = False
        assert accepted == loadable_head_count("llama", 24, n) == (n != 5), n
        MistralConfig(hidden_size=24, num_attention_heads=n, num_key_value_heads=1, head_dim=4)  # no such rule
        assert loadable_head_count("mistral", 24, n)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=24, num_attention_heads=6, num_key_value_heads=6,
                                      intermediate_size=40, num_hidden_layers=2, initializer_range=0.2)).eval()
    hf.save_pretrained(tmp_path / "llama")
    ours = load_model(tmp_path / "llama")
    x = tokens(3) % 64

    removed = [(0, 5), (1, 2)]  # uniform: 5 query / 5 KV heads left in each layer
    pruned = prune_heads(ours, removed)
    assert not is_compact(pruned) and "multiple of num_attention_heads 5" in hf_layout(pruned)
    config, _, got = _hf_export_logits(ours, removed, tmp_path / "zeroed", x)
    assert config["num_attention_heads"] == 6
    assert (got - hf_zeroed(hf, x, removed, 4)).abs().max() <= TOL

    scores = pd.DataFrame([{"layer": l, "head": h, "s": float(10 * l + h)} for l, h in ours.head_ids])
    chosen = uniform_heads(ours, scores, "s", count=2)  # 5 heads a layer would be exact, but is refused
    assert len(chosen) == 4
    config, compact, got = _hf_export_logits(ours, chosen, tmp_path / "compact", x)
    assert config["num_attention_heads"] == 4 and compact.model.layers[0].self_attn.q_proj.weight.shape == (16, 24)
    assert (got - hf_zeroed(hf, x, chosen, 4)).abs().max() <= TOL


def test_hf_exports_write_the_models_own_tensors_and_change_none(tmp_path_factory, tmp_path):
    """An export reads the model's tensors without copying them (a real model's export would double its memory): the
    unpruned, zeroed and compact models' states after their exports equal their states before."""
    _, folder, _ = build("qwen2-bias-window", tmp_path_factory)
    ours = load_model(folder)
    zeroed, uniform, _ = PRUNES["qwen2-bias-window"]
    for name, model in (("full", ours), ("zeroed", prune_heads(ours, zeroed)),
                        ("compact", prune_heads(ours, uniform, share=True))):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        export_hf(model, tmp_path / name)
        after = model.state_dict()
        assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items()), name
