"""Issue 38, "the other members of each class": config keys transformers reads with a default (absent, null, or
per family), and values it reads in ways headprune does not compute. Each config is written by transformers'
own model (a tiny random one, ``save_pretrained``), edited, then loaded by both: either headprune's logits equal
``AutoModelForCausalLM.from_pretrained``'s, or ``load_model`` raises a HeadpruneError naming the value, before
any weight is read."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model

from helpers import edit_config

DECODER = {"vocab_size": 97, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 48, "num_hidden_layers": 2, "max_position_embeddings": 64}
FAMILIES = {"llama": ("LlamaConfig", DECODER), "mistral": ("MistralConfig", DECODER),
            "qwen2": ("Qwen2Config", DECODER), "qwen3": ("Qwen3Config", DECODER),
            "gemma3": ("Gemma3TextConfig", {**DECODER, "head_dim": 8}),
            "neox": ("GPTNeoXConfig", {k: v for k, v in DECODER.items() if k != "num_key_value_heads"}),
            "gpt2": ("GPT2Config", {"vocab_size": 97, "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 64})}
DEL = object()  # the edit removes the key
WINDOWED = {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}
QWEN_WINDOW = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}


def rope(kind: str, **extra) -> dict:
    return {"rope_parameters": {"rope_type": kind, "rope_theta": 10000.0, **extra}}


def written(tmp_path, family: str, built: dict | None, edit: dict | None):
    """transformers' model of ``family`` (its config + ``built``), weights perturbed so that every parameter
    matters (norm gains and biases off their initial values), saved, then its config.json edited."""
    name, sizes = FAMILIES[family]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(getattr(transformers, name)(**{**sizes, **(built or {})})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(tmp_path)
    return edit_config(tmp_path, edit or {}, delete=DEL)


MATCHED = {  # id: (family, built with, config.json edit)
    "llama head_dim absent": ("llama", None, {"head_dim": DEL}),
    "llama head_dim null": ("llama", None, {"head_dim": None}),
    "llama head_dim != d/h": ("llama", {"head_dim": 16}, None),
    "llama attention_bias": ("llama", {"attention_bias": True}, None),
    "llama mlp_bias": ("llama", {"mlp_bias": True}, None),
    "llama bias keys absent": ("llama", None, {"attention_bias": DEL, "mlp_bias": DEL}),
    "llama hidden_act swish": ("llama", None, {"hidden_act": "swish"}),
    "llama linear rope": ("llama", rope("linear", factor=2.0), None),
    "llama 4.x rope_scaling": ("llama", None, {"rope_parameters": DEL, "rope_theta": 500.0,
                                               "rope_scaling": {"type": "linear", "factor": 2.0}}),
    "llama rope theta absent": ("llama", None, {"rope_parameters": DEL, "rope_theta": DEL}),
    "llama rms_norm_eps absent": ("llama", None, {"rms_norm_eps": DEL}),
    "llama tie absent": ("llama", None, {"tie_word_embeddings": DEL}),
    **{f"{family} positions absent": (family, rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
                                      if family == "llama" else None, {"max_position_embeddings": DEL})
       for family in ("llama", "mistral", "qwen2", "qwen3", "gemma3", "neox")},  # llama3's band reads it
    "gpt2 n_positions absent": ("gpt2", {"n_positions": 1024}, {"n_positions": DEL, "n_ctx": DEL}),
    "mistral head_dim null": ("mistral", None, {"head_dim": None}),
    "mistral attention_bias key": ("mistral", None, {"attention_bias": True}),  # Mistral has no such bias
    "qwen2 window from max_window_layers": ("qwen2", QWEN_WINDOW, {"layer_types": DEL}),
    "qwen2 max_window_layers absent": ("qwen2", None, {**QWEN_WINDOW, "max_window_layers": DEL, "layer_types": DEL}),
    "qwen2 window unused": ("qwen2", {"use_sliding_window": False, "sliding_window": 8}, None),
    "qwen2 hidden_act swish": ("qwen2", None, {"hidden_act": "swish"}),
    "qwen3 head_dim absent": ("qwen3", None, {"head_dim": DEL}),  # Qwen3Config's default is 128, not d/h
    "qwen3 window": ("qwen3", QWEN_WINDOW, None),
    "qwen3 attention_bias": ("qwen3", {"attention_bias": True}, None),
    "gemma3 sliding_window_pattern": ("gemma3", {"sliding_window": 8}, {"layer_types": DEL,
                                                                         "sliding_window_pattern": 2}),
    "gemma3 layer_types": ("gemma3", {"sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]},
                           None),
    "gemma3 final soft-capping": ("gemma3", {"final_logit_softcapping": 3.0}, None),
    "gemma3 final soft-capping null": ("gemma3", {"final_logit_softcapping": None}, None),
    "gemma3 query_pre_attn_scalar absent": ("gemma3", None, {"query_pre_attn_scalar": DEL}),
    "gemma3 sliding_window absent": ("gemma3", None, {"sliding_window": DEL}),
    "gemma3 rope absent": ("gemma3", None, {"rope_parameters": DEL}),
    "gemma3 tie absent": ("gemma3", None, {"tie_word_embeddings": DEL}),
    "gemma3 attention_bias": ("gemma3", {"attention_bias": True}, None),
    "neox sequential residual": ("neox", {"use_parallel_residual": False}, None),
    "neox partial_rotary_factor": ("neox", None, {"partial_rotary_factor": 0.5}),
    "neox no attention bias": ("neox", {"attention_bias": False}, None),
    "neox layer_norm_eps absent": ("neox", None, {"layer_norm_eps": DEL}),
    **{f"neox hidden_act {act}": ("neox", {"hidden_act": act}, None)
       for act in ("gelu_new", "relu", "swish", "gelu_python")},
    "gpt2 inverse layer scaling": ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, None),
    "gpt2 reorder and upcast": ("gpt2", {"reorder_and_upcast_attn": True}, None),
    "gpt2 unscaled attention": ("gpt2", {"scale_attn_weights": False}, None),
    "gpt2 n_inner": ("gpt2", {"n_inner": 40}, None),
    "gpt2 n_inner null": ("gpt2", None, {"n_inner": None}),
    "gpt2 layer_norm_epsilon absent": ("gpt2", None, {"layer_norm_epsilon": DEL}),
    "gpt2 gelu_pytorch_tanh": ("gpt2", {"activation_function": "gelu_pytorch_tanh"}, None),
}


@pytest.mark.parametrize("family, built, edit", MATCHED.values(), ids=MATCHED.keys())
def test_config_read_as_transformers_reads_it(tmp_path, family, built, edit):
    folder = written(tmp_path, family, built, edit)
    reference = AutoModelForCausalLM.from_pretrained(folder).eval()
    ours = load_model(folder)
    x = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))  # past the windows of 8
    with torch.no_grad():
        gap = (ours(x) - reference(x).logits).abs().max()
    assert gap <= 1e-5
    positions = "n_positions" if family == "gpt2" else "max_position_embeddings"
    assert ours.cfg.n_positions == getattr(reference.config, positions)


REFUSED = {  # id: (family, built with, config.json edit, the HeadpruneError's words)
    "llama dynamic rope": ("llama", rope("dynamic", factor=2.0), None, "rope type 'dynamic' is not supported"),
    "llama yarn rope": ("llama", rope("yarn", factor=2.0), None, "rope type 'yarn' is not supported"),
    "llama longrope": ("llama", rope("longrope", short_factor=[1.0] * 4, long_factor=[2.0] * 4,
                                     original_max_position_embeddings=32), None,
                       "rope type 'longrope' is not supported"),
    "llama partial rotary": ("llama", None, rope("default", partial_rotary_factor=0.5),
                             "partial_rotary_factor is not supported for llama"),
    "llama hidden_act gelu": ("llama", None, {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    "llama max_position_embeddings null": ("llama", None, {"max_position_embeddings": None},
                                           "n_positions must be a positive integer, got None"),
    "qwen3 head_dim null": ("qwen3", None, {"head_dim": None}, "head_dim must be a positive integer for qwen3"),
    "qwen2 sliding layers, window off": ("qwen2", None, {"use_sliding_window": False, **WINDOWED},
                                         "layer_types marks sliding_attention layers but use_sliding_window"),
    "mistral sliding layers, window null": ("mistral", WINDOWED, {"sliding_window": None},
                                            "layer_types marks sliding_attention layers but sliding_window is null"),
    "gemma3 sliding_window 0": ("gemma3", None, {"sliding_window": 0}, "sliding_window must be a positive integer"),
    "gemma3 sliding_window null": ("gemma3", None, {"sliding_window": None},
                                   "sliding_window must be a positive integer, got None"),
    "gemma3 sliding_window negative": ("gemma3", None, {"sliding_window": -2},
                                       "sliding_window must be a positive integer"),
    "gemma3 query_pre_attn_scalar null": ("gemma3", None, {"query_pre_attn_scalar": None},
                                          "query_pre_attn_scalar must be a positive number, got None"),
    "gemma3 soft-capping 0": ("gemma3", None, {"final_logit_softcapping": 0}, "final_logit_softcapping must be"),
    "gemma3 hidden_activation gelu": ("gemma3", None, {"hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
    "gemma3 layer_types too long": ("gemma3", None, {"layer_types": ["full_attention"] * 3},
                                    "for each of 2 layers"),
    "neox linear rope": ("neox", None, rope("linear", factor=2.0, partial_rotary_factor=0.25),
                         "rope type 'linear' is not supported for gpt_neox"),
    "neox hidden_act gelu_fast": ("neox", None, {"hidden_act": "gelu_fast"}, "hidden_act 'gelu_fast'"),
    "gpt2 relu": ("gpt2", None, {"activation_function": "relu"}, "activation_function 'relu'"),
    "gpt2 exact gelu": ("gpt2", None, {"activation_function": "gelu"}, "activation_function 'gelu'"),
}


@pytest.mark.parametrize("family, built, edit, words", REFUSED.values(), ids=REFUSED.keys())
def test_config_headprune_cannot_compute_is_refused(tmp_path, family, built, edit, words):
    folder = written(tmp_path, family, built, edit)
    with pytest.raises(HeadpruneError, match=words):
        load_model(folder)


@pytest.mark.parametrize("case", ["gemma3 sliding_window null", "qwen2 sliding layers, window off",
                                  "llama yarn rope"])
def test_the_cli_says_a_refused_config_in_one_line(tmp_path, capsys, case):
    from headprune.cli.main import main

    family, built, edit, words = REFUSED[case]
    folder = written(tmp_path / "model", family, built, edit)
    capsys.readouterr()
    assert main(["info", "--model", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("headprune: error:") and words in err[0], err
