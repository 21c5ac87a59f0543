"""One record per family (models/families.py ModelFamily): complete for every family, each fact checked against
transformers' own model of that family, and no module outside models/ branching on a family's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import headprune
from headprune.models.families import GGUF_ARCHITECTURES, REGISTRY, gguf_arch
from headprune.models.gguf_names import BLOCK_NAMES, TOP_NAMES
from tests.oracles.test_families import CASES, build

ROOT = Path(headprune.__file__).parent
#: one transformers case per model_type (tests/oracles/test_families.py builds them)
CASE_OF = {"llama": "llama-mha-odd", "mistral": "mistral-window", "qwen2": "qwen2-bias-window",
           "qwen3": "qwen3-headdim", "gemma3_text": "gemma3-window-gqa2", "gpt_neox": "neox-parallel"}


def test_every_family_record_is_complete():
    for kind, family in REGISTRY.items():
        assert family.mlp in ("gated", "plain") and family.rotary in ("full", "partial", "none"), kind
        assert family.norm in ("rms", "rms 1+w", "layer"), kind
        assert family.architecture.endswith(("ForCausalLM", "LMHeadModel")), kind
        assert family.prefix.endswith(".") and family.attn and family.lm_head, kind
    # every GGUF architecture is read as a family that has that record, and back
    assert GGUF_ARCHITECTURES == {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
    assert all(gguf_arch(kind).name == name for name, kind in GGUF_ARCHITECTURES.items())
    with pytest.raises(headprune.HeadpruneError, match="no GGUF form"):
        gguf_arch("gpt_neox")


@pytest.mark.parametrize("kind", sorted(CASE_OF))
def test_each_fact_is_what_transformers_builds(kind, tmp_path_factory):
    """mlp, norm and rotary read off transformers' model of the family, not off our classes."""
    hf, _, _ = build(CASE_OF[kind], tmp_path_factory)
    family = REGISTRY[kind]
    layer = hf.base_model.layers[0]
    mlp = layer.mlp
    assert (family.mlp == "gated") == hasattr(mlp, "gate_proj"), kind
    norm = layer.input_layernorm
    assert (family.norm == "layer") == isinstance(norm, nn.LayerNorm), kind
    # the gain: transformers' norm of x = g ⊙ x̂ (+ b); RMSNorm with x̂ = x / rms(x)
    x = torch.randn(3, norm.weight.shape[0])
    eps = norm.eps if hasattr(norm, "eps") else norm.variance_epsilon
    hat = x - x.mean(-1, keepdim=True) if family.norm == "layer" else x
    hat = hat / (hat.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    expected = family.norm_gain(norm) * hat + (norm.bias if family.norm == "layer" else 0)
    torch.testing.assert_close(norm(x), expected, atol=1e-5, rtol=1e-5)
    rope = hf.config.rope_parameters
    rotary_share = (rope.get("full_attention", rope)).get("partial_rotary_factor", 1.0)
    assert family.rotary == ("partial" if rotary_share < 1 else "full"), kind
    assert CASES[CASE_OF[kind]][1].__name__ == family.architecture


def test_gpt2_record():
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=11, n_positions=8))
    family = REGISTRY["gpt2"]
    assert family.mlp == "plain" and not hasattr(hf.transformer.h[0].mlp, "gate_proj")
    assert family.norm == "layer" and isinstance(hf.transformer.ln_f, nn.LayerNorm)
    assert family.rotary == "none" and family.architecture == type(hf).__name__


def test_gguf_names_map_every_transformers_key_once():
    """llama.cpp's block and top names are distinct and map onto distinct transformers names."""
    assert len(set(BLOCK_NAMES.values())) == len(BLOCK_NAMES)
    gemma = gguf_arch("gemma3_text")
    assert gemma.hf_name("blk.3.ffn_norm.weight") == "model.layers.3.pre_feedforward_layernorm.weight"
    assert gguf_arch("llama").hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert gemma.hf_name("output_norm.weight") == TOP_NAMES["output_norm"] + ".weight"
    assert gemma.hf_name("blk.x.attn_q.weight") is None and gemma.hf_name("rope_freqs.weight") is None


FAMILY_NAMES = set(REGISTRY) | set(GGUF_ARCHITECTURES) | {"gemma3", "neox", "gpt-neox"}


def _branches_on_family(tree: ast.AST) -> list[int]:
    """Lines where a comparison (==, !=, in, not in) has a family's name as a string constant."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for part in [node.left, *node.comparators]:
                names = [part] if isinstance(part, ast.Constant) else list(getattr(part, "elts", []))
                if any(isinstance(c, ast.Constant) and c.value in FAMILY_NAMES for c in names):
                    lines.append(node.lineno)
    return lines


def test_no_module_outside_models_branches_on_a_family_name():
    found = {str(p.relative_to(ROOT)): lines for p in ROOT.rglob("*.py")
             if p.relative_to(ROOT).parts[0] != "models" and (lines := _branches_on_family(ast.parse(
                 p.read_text())))}
    assert found == {}


def test_the_branch_finder_finds_branches():
    source = 'if kind == "qwen2": pass\nif arch in ("llama", "x"): pass\nif name == "grad": pass\n'
    assert _branches_on_family(ast.parse(source)) == [1, 2]
