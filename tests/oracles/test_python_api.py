"""The notebook API: ``from headprune import ...`` (lazy: no torch on ``import headprune``), ``from_hf`` / ``to_hf``
against transformers' own models, and the HTML results show in Jupyter.

- ``from_hf(m)`` of an in-memory ``GPT2LMHeadModel`` (trained a few steps in memory; tied and untied LM head)
  scores exactly as its ``save_pretrained`` copy loaded by ``load_model`` (every column, fingerprint included);
- ``to_hf(from_hf(m))`` gives m's logits; ``to_hf`` of a pruned, mean-compensated model gives the pruned model's
  logits and exactly the tensors ``export_hf`` writes;
- the other families: ``from_hf`` of their ``*ForCausalLM`` gives transformers' logits and the saved copy's scores;
- ``_repr_html_`` lists the top heads, computed here from the table with plain sorting.
"""

import math
import re
import subprocess
import sys

import pandas as pd
import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

import headprune
from headprune import (
    GateOptions,
    HeadpruneError,
    corpus_rows,
    from_hf,
    head_anatomy,
    head_means,
    learn_gates,
    load_model,
    prune_model,
    repeated_random_tokens,
    score_heads,
    to_hf,
    tokens,
)
from headprune.perplexity import Windowing
from headprune.scoring import HeadScores

from helpers import TINY

SEQ = 64
METHODS = "wo_fro,grad,abl_zero"
HEAD_ID = re.compile(r"<td>(L\d+H\d+)</td>")
FAMILY_SIZES = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
                "vocab_size": 300, "max_position_embeddings": 64}


def _trained_in_memory(seed: int, **config) -> GPT2LMHeadModel:
    """A tiny random GPT2LMHeadModel after 3 AdamW steps in train mode (dropout on), then eval: weights that
    exist only in memory."""
    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(GPT2Config(**TINY, **config))
    hf.train()
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-2)
    x = torch.randint(0, TINY["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(seed))
    for _ in range(3):
        hf(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    return hf.eval()


def _logits(model, x):
    with torch.no_grad():
        out = model(x)
    return out.logits if hasattr(out, "logits") else out


@pytest.fixture(scope="module")
def x():
    return torch.randint(0, TINY["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def ids(corpus):
    return tokens(str(corpus), "validation", load_model(), 256)  # the shipped model's GPT-2 BPE


# ---------------------------------------------------------------- the package's names


def test_import_headprune_loads_no_torch():
    code = "import headprune, sys; print('torch' in sys.modules, headprune.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", headprune.__version__]
    code = "from headprune import HeadpruneError; import sys; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_every_public_name_is_its_module_object():
    import importlib

    assert sorted(headprune.__all__) == sorted(["__version__", *headprune._EXPORTS])
    for name, module in headprune._EXPORTS.items():
        assert getattr(headprune, name) is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError):
        headprune.no_such_name  # noqa: B018


# ---------------------------------------------------------------- from_hf: GPT-2


@pytest.mark.parametrize("tied", [True, False])
def test_from_hf_scores_equal_the_saved_copy(tied, ids, tmp_path):
    hf = _trained_in_memory(seed=3, tie_word_embeddings=tied)
    hf.save_pretrained(tmp_path)
    w = Windowing.resolve(TINY["n_positions"], SEQ)
    ours = score_heads(from_hf(hf), ids, METHODS, windowing=w, show_progress=False)
    saved = score_heads(load_model(tmp_path), ids, METHODS, windowing=w, show_progress=False)
    pd.testing.assert_frame_equal(ours.table, saved.table, check_exact=True)
    assert ours.baseline == saved.baseline
    assert ours.table[["grad", "abl_zero"]].abs().min().min() > 0  # the data methods measured something


@pytest.mark.parametrize("tied", [True, False])
def test_from_hf_computes_transformers_logits_and_copies(tied, x):
    hf = _trained_in_memory(seed=4, tie_word_embeddings=tied)
    ours = from_hf(hf)
    assert ours.cfg.tie_word_embeddings is tied and (ours.lm_head is None) is tied
    torch.testing.assert_close(_logits(ours, x), _logits(hf, x), rtol=0, atol=1e-5)
    assert not ours.training and not any(p.requires_grad for p in ours.parameters())
    assert ours.wte.weight.data_ptr() != hf.transformer.wte.weight.data_ptr()  # a copy: hf stays as it was
    assert ours.origin.source == "in-memory GPT2LMHeadModel" and ours.origin.folder is None


def test_from_hf_keeps_an_lm_head_untied_in_memory(x):
    """Config says tied, but the head was given its own tensor (and trained apart): the head is kept."""
    hf = _trained_in_memory(seed=5)
    hf.lm_head.weight = torch.nn.Parameter(hf.transformer.wte.weight.detach() + 0.05 * torch.randn_like(
        hf.transformer.wte.weight))
    assert hf.config.tie_word_embeddings
    ours = from_hf(hf)
    assert not ours.cfg.tie_word_embeddings
    torch.testing.assert_close(_logits(ours, x), _logits(hf, x), rtol=0, atol=1e-5)


def test_from_hf_refuses_what_it_cannot_convert():
    with pytest.raises(HeadpruneError, match=r"GPT2LMHeadModel, LlamaForCausalLM.*got GPT2Model"):
        from_hf(GPT2Model(GPT2Config(**TINY)))
    with pytest.raises(HeadpruneError, match="got str"):
        from_hf("gpt2")
    with pytest.raises(HeadpruneError, match="activation_function 'relu'"):
        from_hf(GPT2LMHeadModel(GPT2Config(**TINY, activation_function="relu")))


# ---------------------------------------------------------------- to_hf


@pytest.mark.parametrize("tied", [True, False])
def test_to_hf_round_trip_gives_the_same_logits(tied, x):
    hf = _trained_in_memory(seed=6, tie_word_embeddings=tied)
    back = to_hf(from_hf(hf))
    assert isinstance(back, GPT2LMHeadModel) and not back.training
    assert (back.lm_head.weight is back.transformer.wte.weight) is tied
    torch.testing.assert_close(_logits(back, x), _logits(hf, x), rtol=0, atol=1e-5)


def test_to_hf_of_a_pruned_model_is_the_hf_export(ids, x, tmp_path):
    from headprune.io.write.export import export_hf

    model = from_hf(_trained_in_memory(seed=8))
    removed = [(0, 1), (1, 0), (1, 1), (1, 2), (1, 3), (2, 3)]  # layer 1 emptied
    w = Windowing.resolve(TINY["n_positions"], SEQ)
    means = head_means(model, ids, w, show_progress=False)
    pruned = prune_model(model, removed, {h: means[h] for h in removed})
    assert pruned.cfg.kept_heads == [[0, 2, 3], [], [0, 1, 2]]
    back = to_hf(pruned)
    assert back.transformer.h[1].attn.c_attn.weight.shape == (32, 96)  # the original shapes, zero-filled
    torch.testing.assert_close(_logits(back, x), _logits(pruned, x), rtol=0, atol=1e-5)
    assert (_logits(back, x) - _logits(model, x)).abs().max() > 1e-2  # the pruning changed something
    exported = GPT2LMHeadModel.from_pretrained(export_hf(pruned, tmp_path / "hf")).state_dict()
    ours = back.state_dict()
    assert sorted(ours) == sorted(exported)
    for key in ours:
        torch.testing.assert_close(ours[key], exported[key], rtol=0, atol=0, msg=key)


def test_to_hf_of_another_family_needs_its_folder_then_gives_transformers_logits(tmp_path):
    """to_hf is export_hf loaded back: a Llama converted in memory has no config.json to export with (refused);
    loaded from its folder, a uniform GQA prune comes back at smaller shapes, computing what headprune computes."""
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**FAMILY_SIZES, num_key_value_heads=2)).eval()
    with pytest.raises(HeadpruneError, match="needs the config.json it was loaded from"):
        to_hf(from_hf(hf))
    hf.save_pretrained(tmp_path)
    pruned = prune_model(load_model(tmp_path), [(0, 0), (0, 1), (1, 2), (1, 3)])  # one KV group per layer
    back = to_hf(pruned)
    assert back.config.num_attention_heads == 2 and back.config.num_key_value_heads == 1
    x = torch.randint(0, FAMILY_SIZES["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(back, x), _logits(pruned, x), rtol=0, atol=1e-5)


# ---------------------------------------------------------------- from_hf: the other families


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_from_hf_family_gives_transformers_logits_and_the_saved_scores(family, tmp_path):
    torch.manual_seed(0)
    if family == "llama":  # grouped-query attention, tied embedding
        hf = LlamaForCausalLM(LlamaConfig(**FAMILY_SIZES, num_key_value_heads=2, tie_word_embeddings=True)).eval()
    else:  # embed_out in a checkpoint, lm_head in memory (transformers 5)
        hf = GPTNeoXForCausalLM(GPTNeoXConfig(**FAMILY_SIZES)).eval()
    ours = from_hf(hf)
    ids = torch.randint(0, FAMILY_SIZES["vocab_size"], (256,), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(ours, ids[None, :40]), _logits(hf, ids[None, :40]), rtol=0, atol=1e-5)
    hf.save_pretrained(tmp_path)
    w = Windowing.resolve(FAMILY_SIZES["max_position_embeddings"], SEQ)
    pd.testing.assert_frame_equal(score_heads(ours, ids, METHODS, windowing=w, show_progress=False).table,
                                  score_heads(load_model(tmp_path), ids, METHODS, windowing=w,
                                              show_progress=False).table,
                                  check_exact=True)


# ---------------------------------------------------------------- what a notebook shows


def _expected_top(table: pd.DataFrame, column: str, n: int, highest: bool = True) -> list[str]:
    """The head ids of the n highest (lowest) ``column`` values, ties by (layer, head): plain sorting."""
    rows = [(float(v), int(l), int(h), i) for v, l, h, i in zip(table[column], table.layer, table["head"],
                                                                 table.head_id) if not math.isnan(v)]
    rows.sort(key=lambda r: ((-r[0] if highest else r[0]), r[1], r[2]))
    return [r[3] for r in rows[:n]]


def test_scores_html_lists_the_top_heads_and_the_key_numbers(ids):
    model = from_hf(_trained_in_memory(seed=9))
    w = Windowing.resolve(TINY["n_positions"], SEQ)
    scored = score_heads(model, ids, METHODS, windowing=w, show_progress=False)
    page = scored._repr_html_()
    assert HEAD_ID.findall(page) == _expected_top(scored.table, "abl_zero", 10)
    assert "top 10 heads by abl_zero" in page
    nll = scored.baseline["nll"]
    assert f"tokens: <b>{scored.baseline['tokens']:,}</b>" in page and scored.baseline["tokens"] > 200
    assert f"baseline NLL: <b>{nll:.4g}</b>" in page and f"perplexity: <b>{math.exp(nll):.4g}</b>" in page
    assert scored.table.model_fingerprint[0][:12] in page
    no_ablation = HeadScores(scored.table.drop(columns=["abl_zero", "abl_zero_ci_lo", "abl_zero_ci_hi"]))
    assert HEAD_ID.findall(no_ablation._repr_html_()) == _expected_top(scored.table, "grad", 10)  # grad before wo_fro
    weights_only = score_heads(model, None, "wo_fro", show_progress=False)._repr_html_()  # no data at all
    assert HEAD_ID.findall(weights_only) == _expected_top(scored.table, "wo_fro", 10)
    assert "tokens" not in weights_only


def test_print_scored_is_a_short_summary(ids):
    """print(scored) / repr: model, heads, methods, tokens read, seconds, and the top 5 heads by the preferred
    method with their values, in three lines; not the dataclass's fields."""
    model = from_hf(_trained_in_memory(seed=11))
    w = Windowing.resolve(TINY["n_positions"], SEQ)
    scored = score_heads(model, ids, "wo_fro,grad", windowing=w, show_progress=False)
    lines = str(scored).splitlines()
    assert repr(scored) == str(scored) and len(lines) == 3 and "table=" not in str(scored)
    assert lines[0].startswith(f"HeadScores(model: {scored.table.model_fingerprint[0][:12]} · heads: "
                               f"{TINY['n_layer'] * TINY['n_head']} · methods: wo_fro, grad · tokens: {len(ids):,}")
    top = _expected_top(scored.table, "grad", 5)
    grad = dict(zip(scored.table.head_id, scored.table.grad))
    assert lines[1] == "top 5 heads by grad: " + ", ".join(f"{h} {grad[h]:.4g}" for h in top)
    weights_only = str(score_heads(model, None, "wo_fro", show_progress=False))
    assert "tokens" not in weights_only and "top 5 heads by wo_fro: " in weights_only


def test_anatomy_html_lists_the_top_heads_per_role(ids):
    model = from_hf(_trained_in_memory(seed=10))
    anatomy = head_anatomy(model, repeated_random_tokens(TINY["vocab_size"], 16, 4), corpus_rows(ids, SEQ, 4))
    page = anatomy._repr_html_()
    for role, label in [("induction", "induction"), ("previous_token", "previous token"), ("dla", "direct logit")]:
        row = re.search(rf"<td>{label}[^<]*</td><td>([^<]*)</td>", page).group(1)
        assert re.findall(r"L\d+H\d+", row) == _expected_top(anatomy.heads, role, 3), role
    comp = anatomy.composition
    best = comp.loc[comp.v_comp.idxmax()]
    assert f"<td>v_comp</td><td>{best.head_a_id}</td><td>{best.head_b_id}</td>" in page


def test_gates_html_lists_the_heads_least_likely_open(ids):
    model = from_hf(_trained_in_memory(seed=11))
    w = Windowing.resolve(TINY["n_positions"], SEQ)
    options = GateOptions(steps=4, sparsity=0.25, checkpoint_every=2)
    result = learn_gates(model, w.batches(ids), options=options, show_progress=False)
    page = result._repr_html_()
    assert HEAD_ID.findall(page) == _expected_top(result.table, "gate", 10, highest=False)
    assert f"closed: <b>{len(result.closed)}</b>" in page and len(result.closed) == 3
    assert page.count("<td>closed</td>") == 3
