"""Issue 38's classes: config keys transformers reads with a default (or per layer) give transformers' model;
values it would refuse, or that make NaN, are refused before any work; degenerate patching inputs and malformed
API calls get a HeadpruneError naming the bad value, not a torch error."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from headprune.errors import HeadpruneError
from headprune.io.read.checkpoint import all_finite
from headprune.io.read.loading import load_model
from headprune.patching.pairs import PromptPairs
from headprune.patching.study import StudyOptions, patch_study
from headprune.scoring import ScoringOptions, score_heads

from helpers import edit_config

SIZES = {"vocab_size": 97, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 48, "num_hidden_layers": 2, "max_position_embeddings": 64}


def saved(hf_model, folder, **config_edits):
    hf_model.save_pretrained(folder)
    return edit_config(folder, config_edits)


def logits(model, x):
    with torch.no_grad():
        out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


def test_mistral_layer_types_window_only_the_sliding_layers(tmp_path):
    """A Mistral config with layer_types (the Ministral layout): transformers' AutoModelForCausalLM loads it as
    MinistralForCausalLM, which windows only the layers marked sliding_attention (MistralForCausalLM itself would
    window every layer, and says to use AutoModel)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = MistralForCausalLM(MistralConfig(**SIZES, sliding_window=5,
                                          layer_types=["sliding_attention", "full_attention"])).eval()
    saved(hf, tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ours = load_model(tmp_path)
    assert [blk.attn.window for blk in ours.h] == [5, None]
    x = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    assert (logits(ours, x) - logits(reference, x)).abs().max() <= 1e-4
    assert (logits(ours, x) - logits(hf, x)).abs().max() > 1e-2  # the layout matters at this length


def test_mistral_without_a_window_key_gets_transformers_default(tmp_path):
    hf = MistralForCausalLM(MistralConfig(**SIZES)).eval()
    ours = load_model(saved(hf, tmp_path, sliding_window=None))
    reloaded = MistralConfig.from_pretrained(tmp_path)
    assert [blk.attn.window for blk in ours.h] == [reloaded.sliding_window] * 2 == [4096] * 2


def test_tied_llama_with_its_own_stored_head_uses_the_head(tmp_path):
    """transformers 5 uses a stored lm_head.weight that differs from the embedding, whatever the config says."""
    torch.manual_seed(2)
    hf = LlamaForCausalLM(LlamaConfig(**SIZES)).eval()  # untied: its own LM head
    saved(hf, tmp_path, tie_word_embeddings=True)
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ours = load_model(tmp_path)
    x = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(3))
    assert not ours.cfg.tie_word_embeddings
    assert (logits(ours, x) - logits(reference, x)).abs().max() <= 1e-4


@pytest.mark.parametrize("edit, message", [
    ({"sliding_window": 0}, "sliding_window must be a positive integer"),
    ({"sliding_window": -3}, "sliding_window must be a positive integer"),
    ({"rope_theta": 0, "rope_parameters": None}, "rope_theta must be a positive number"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 0, "rope_theta": 1e4}}, "needs a positive factor"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "rope_theta": 1e4}},
     "needs low_freq_factor"),
    ({"rms_norm_eps": -1}, "rms_norm_eps must be a number in"),
    ({"layer_types": ["sliding_attention"]}, "layer_types must give"),
])
def test_values_transformers_refuses_or_that_make_nan_are_refused(tmp_path, edit, message):
    hf = MistralForCausalLM(MistralConfig(**SIZES, sliding_window=8)).eval()
    with pytest.raises(HeadpruneError, match=message):
        load_model(saved(hf, tmp_path, **edit))


def test_fp8_weights_are_checked_for_nan():
    finite = torch.tensor([1.0, -2.0, 0.5]).to(torch.float8_e4m3fn)
    assert all_finite(finite) and not all_finite(torch.tensor([1.0, float("nan")]).to(torch.float8_e4m3fn))


def test_forward_refuses_1d_ids_and_too_many_tokens(tiny_dir):
    model = load_model(tiny_dir)
    with pytest.raises(HeadpruneError, match=r"\(batch, T\) tensor"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(HeadpruneError, match="exceeds the model's n_positions"):
        model(torch.zeros(1, model.cfg.n_positions + 1, dtype=torch.long))


def test_score_heads_refuses_malformed_calls(tiny_dir):
    model = load_model(tiny_dir)
    ids = torch.randint(0, model.cfg.vocab_size, (200,), generator=torch.Generator().manual_seed(0))
    with pytest.raises(HeadpruneError, match="1-D int64 tensor, got list"):
        score_heads(model, ids.tolist(), "grad", show_progress=False)
    with pytest.raises(HeadpruneError, match="methods must be"):
        score_heads(model, ids, None, show_progress=False)  # type: ignore[arg-type]
    with pytest.raises(HeadpruneError, match="read data: pass token ids"):
        score_heads(model, None, "grad", show_progress=False)
    with pytest.raises(HeadpruneError, match="bootstrap 1"):
        score_heads(model, ids, "grad", options=ScoringOptions(bootstrap=1), show_progress=False)


def test_patching_refuses_a_zero_gap_and_bad_bound_options_before_work(tiny_dir):
    model = load_model(tiny_dir)
    tokens = torch.tensor([[5, 6, 7, 8]] * 2)
    same = PromptPairs(tokens, tokens.clone(), torch.tensor([4, 4]), torch.tensor([9, 9]), torch.tensor([10, 10]))
    with pytest.raises(HeadpruneError, match="gap 0 in every pair"):
        patch_study(model, same, StudyOptions(bootstrap=0))
    with pytest.raises(HeadpruneError, match="at least 32"):
        StudyOptions(bound_subsets=8).check()
    with pytest.raises(HeadpruneError, match="verifying 0 of"):
        patch_study(model, same, StudyOptions(verify=0, bootstrap=0))


def test_scores_html_keeps_a_head_whose_score_is_nan():
    """8 heads, one unscored: the summary lists all 8, the unscored one last as —."""
    import math

    import pandas as pd

    from headprune.scoring import HeadScores

    table = pd.DataFrame({"layer": [0] * 4 + [1] * 4, "head": list(range(4)) * 2,
                          "head_id": [f"L{l}H{h}" for l in (0, 1) for h in range(4)],
                          "model_fingerprint": ["f" * 16] * 8,
                          "grad": [0.3, math.nan, 0.1, 0.7, 0.2, 0.5, 0.4, 0.6]})
    page = HeadScores(table)._repr_html_()
    assert "top 8 heads by grad" in page
    assert page.index("L0H3") < page.index("L1H3") < page.index("L0H2") < page.index("L0H1")
    assert "<td>—</td>" in page


def test_a_prune_that_empties_a_layer_warns_nothing():
    """Building the emptied layer's zero-row projections on the meta device skips their initialisation quietly."""
    import warnings

    from headprune.models.llama import LlamaLike, LlamaLikeConfig
    from headprune.models.prune import prune_heads

    model = LlamaLike(LlamaLikeConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8,
                                      d_mlp=40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pruned = prune_heads(model, [(0, h) for h in range(4)])
    assert pruned.h[0].attn.n_heads == 0 and pruned.h[1].attn.n_heads == 4


def test_from_hf_refuses_weights_it_cannot_run():
    """On the meta device, an int8 weight, or fp32 and fp16 mixed: one HeadpruneError each, before any copy."""
    from headprune.io.read.in_memory import from_hf

    def llama():
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(**SIZES)).eval()

    with pytest.raises(HeadpruneError, match="meta device"):
        from_hf(llama().to("meta"))
    quantized = llama()
    quantized.model.layers[0].mlp.up_proj.weight = torch.nn.Parameter(
        torch.zeros_like(quantized.model.layers[0].mlp.up_proj.weight, dtype=torch.int8), requires_grad=False)
    with pytest.raises(HeadpruneError, match="int8, not floating point"):
        from_hf(quantized)
    mixed = llama()
    mixed.model.layers[1].half()
    with pytest.raises(HeadpruneError, match="mix dtypes"):
        from_hf(mixed)


def test_serving_rates_count_every_token_of_the_batch(tmp_path, monkeypatch):
    """With a clock that advances 0.25 s per reading, every timed call lasts 0.25 s: prefill = B·T / 0.25 tokens/s
    (not T / 0.25), decode = b / 0.25, the median of the repeats."""
    import itertools

    from headprune.pruning import serving

    torch.manual_seed(0)
    saved(LlamaForCausalLM(LlamaConfig(**SIZES)).eval(), tmp_path)
    clock = itertools.count(0.0, 0.25)
    monkeypatch.setattr(serving.time, "perf_counter", lambda: next(clock))
    work = serving.Workload(batch=3, seq_len=8, steps=2, prompt=4, decode_batches=(1, 2), prefills=3)
    result = serving.measure_serving(tmp_path, work)
    assert result["prefill_tokens_per_s"] == 3 * 8 / 0.25
    assert result["decode_b1_tokens_per_s"] == 1 / 0.25 and result["decode_b2_tokens_per_s"] == 2 / 0.25
