"""Each layer's heads removed together (``headprune.scoring.layers``) against transformers with that layer's attention
output projection zeroed (every head's z zeroed: GPT-2's attention then writes its bias b_O, Llama's and Gemma 3's
nothing), window by window; the intervals and shares against replicates made by hand from the same window counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2LMHeadModel

from headprune.bootstrap import window_counts
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.perplexity import Windowing
from headprune.schema import LAYER_SCORE
from headprune.scoring import ScoringOptions
from headprune.scoring.layers import layer_ablation

from helpers import TINY, save_gqa_family

SEQ, WINDOWS, REPLICATES, SEED = 16, 7, 300, 11
WINDOWING = Windowing(SEQ, SEQ, 3)  # non-overlapping windows, no BOS: each scores its last SEQ - 1 tokens


def window_nll_sums(hf, ids: torch.Tensor) -> np.ndarray:
    """[W] NLL sum of each window (tokens 1..SEQ-1 predicted from those before them), by transformers."""
    windows = ids.view(-1, SEQ)
    with torch.no_grad():
        logits = hf(windows).logits.double()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), windows[:, 1:], reduction="none")
    return nll.sum(1).numpy()


def output_projection(hf, layer: int) -> torch.nn.Module:
    if isinstance(hf, GPT2LMHeadModel):
        return hf.transformer.h[layer].attn.c_proj
    return hf.model.layers[layer].self_attn.o_proj


def hand_changes(load, folder, n_layers: int, ids: torch.Tensor) -> np.ndarray:
    """[L, W]: each window's NLL sum with layer l's output projection weight zeroed, minus the unablated one (``load``
    the transformers class that reads ``folder``)."""
    base = window_nll_sums(load.from_pretrained(folder).eval(), ids)
    rows = []
    for layer in range(n_layers):
        hf = load.from_pretrained(folder).eval()
        with torch.no_grad():
            output_projection(hf, layer).weight.zero_()  # the bias, where there is one, stays: z = 0 for every head
        rows.append(window_nll_sums(hf, ids) - base)
    return np.array(rows)


@pytest.fixture(scope="module", params=["gpt2", "llama", "gemma3"])
def measured(request, tmp_path_factory, tiny_dir):
    if request.param == "gpt2":
        folder, vocab, load = tiny_dir, TINY["vocab_size"], GPT2LMHeadModel
    else:
        folder, vocab, load = tmp_path_factory.mktemp(request.param), 131, AutoModelForCausalLM
        save_gqa_family(request.param, folder, vocab, seed=3)
    model = load_model(folder)
    ids = torch.randint(0, vocab, (SEQ * WINDOWS,), generator=torch.Generator().manual_seed(4))
    options = ScoringOptions(ablation_rows=4, bootstrap=REPLICATES, seed=SEED)
    table = layer_ablation(model, ids, WINDOWING, options=options, show_progress=False)
    return table, hand_changes(load, folder, model.cfg.n_layers, ids)


def test_each_layer_equals_transformers_with_its_output_projection_zeroed(measured):
    table, changes = measured
    tokens = WINDOWS * (SEQ - 1)
    assert table["layer"].tolist() == list(range(len(changes)))
    assert (table["windows"] == WINDOWS).all() and (table["tokens"] == tokens).all()
    np.testing.assert_allclose(table[LAYER_SCORE], changes.sum(1) / tokens, rtol=0, atol=2e-5)
    delta = changes.sum(1)
    if (delta >= 0).all():
        np.testing.assert_allclose(table["share"], delta / delta.sum(), rtol=1e-4, atol=0)
    else:  # a negative part: no share of a whole is stated
        assert table["share"].isna().all() and table["share_ci_lo"].isna().all()


def test_intervals_are_percentiles_of_window_replicates(measured):
    """The same counts as the library draws (seeded): the ΔNLL and share replicates recomputed from transformers'
    window sums, their 2.5th and 97.5th percentiles."""
    table, changes = measured
    counts = window_counts(WINDOWS, REPLICATES, SEED).numpy()
    replicates = counts @ changes.T / (counts.sum(1, keepdims=True) * (SEQ - 1))  # [B, L]
    lo, hi = np.percentile(replicates, [2.5, 97.5], axis=0)
    np.testing.assert_allclose(table[f"{LAYER_SCORE}_ci_lo"], lo, atol=2e-5)
    np.testing.assert_allclose(table[f"{LAYER_SCORE}_ci_hi"], hi, atol=2e-5)
    totals = replicates.sum(1, keepdims=True)
    shares = np.where(totals > 0, replicates / np.where(totals > 0, totals, 1), np.nan)
    share_lo, share_hi = np.nanpercentile(shares, [2.5, 97.5], axis=0)
    if (changes.sum(1) >= 0).all():
        np.testing.assert_allclose(table["share_ci_lo"], share_lo, atol=1e-3)
        np.testing.assert_allclose(table["share_ci_hi"], share_hi, atol=1e-3)
    assert (table[f"{LAYER_SCORE}_ci_lo"] <= table[LAYER_SCORE]).all()


def test_bad_input_is_one_clear_error(tiny_dir):
    model = load_model(tiny_dir)
    with pytest.raises(HeadpruneError, match="at least 2 are needed"):
        layer_ablation(model, torch.arange(1), WINDOWING, show_progress=False)
    with pytest.raises(HeadpruneError, match=r"bootstrap 1: give 0 \(no intervals\) or at least 2 replicates"):
        layer_ablation(model, torch.arange(SEQ * 2), WINDOWING, options=ScoringOptions(bootstrap=1),
                       show_progress=False)
    no_interval = layer_ablation(model, torch.arange(SEQ * 2), WINDOWING, options=ScoringOptions(bootstrap=0),
                                 show_progress=False)
    assert no_interval[f"{LAYER_SCORE}_ci_lo"].isna().all() and no_interval[LAYER_SCORE].notna().all()
