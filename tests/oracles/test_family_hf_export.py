"""hf exports of pruned Qwen2 (q/k/v biases, GQA 3) and Qwen3 (q/k RMSNorm, head_dim != d/h) checkpoints, loaded by
stock transformers: their logits equal the ORIGINAL transformers model with the removed query heads zeroed by an
o_proj forward-pre-hook. A uniform prune (the same heads in every layer, whole KV groups or kept groups' shares)
is written at smaller shapes; any other keeps the original shapes with the removed heads zeroed."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from headprune.io.export import export_hf
from headprune.io.loading import load_model
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
