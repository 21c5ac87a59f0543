"""The long-context tasks (headprune.patching.long_tasks) on the shipped model against transformers' GPT2LMHeadModel
of the same weights: a prompt is right exactly when transformers' greedy generation reproduces its answer, also
with every KV head of two layers streaming (transformers given the streaming mask on those layers by pre-hooks);
the long-window NLLs equal transformers' cross-entropy on the same tokens. The prompts are built as specified."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

from headprune.data.long_docs import MIN_CODE_CHARS, MIN_PROSE_CHARS, long_documents
from headprune.data.sources import load_texts
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.read.sources import resolve_source
from headprune.io.read.tokenizer import load_tokenizer
from headprune.models.streaming import Streaming, kv_alpha, streaming
from headprune.patching.long_tasks import (
    LongTask,
    answer_predictions,
    check_performs,
    long_window_nll,
    long_windows,
    multikey_task,
    passkey_task,
    recall_task,
    run_task,
)
from headprune.schema import DEFAULT_MODEL

SINK, RECENT = 4, 32


@pytest.fixture(scope="module")
def shipped():
    model = load_model(DEFAULT_MODEL)
    hf = GPT2LMHeadModel.from_pretrained(resolve_source(DEFAULT_MODEL), dtype=torch.float32).eval()
    hf.set_attn_implementation("eager")
    return model, hf, load_tokenizer(DEFAULT_MODEL, model.cfg.vocab_size)


def streaming_hooks(hf, layers, T):
    allowed = torch.tensor([[s <= q and (s < SINK or q - s < RECENT) for s in range(T)] for q in range(T)])
    additive = torch.zeros(1, 1, T, T).masked_fill(~allowed, float("-inf"))
    return [hf.transformer.h[l].attn.register_forward_pre_hook(
        lambda _m, args, kwargs: (args, {**kwargs, "attention_mask": additive}), with_kwargs=True) for l in layers]


def test_prompts_are_built_as_specified(shipped):
    _, _, tok = shipped
    task = passkey_task(tok, lengths=(120, 200), depths=(0.0, 0.5, 1.0), per_cell=2, seed=3)
    assert len(task.prompts) == 12
    for p in task.prompts:
        assert p.tokens.shape[0] == p.length
        text = tok.decode(p.tokens.tolist())
        key = tok.decode(p.tokens[p.answer_start:].tolist()).strip()
        assert len(key) == 5 and key.isdigit()
        assert text.endswith(f"What is the pass key? The pass key is {key}")
        needle = tok(f" The pass key is {key}. Remember it. {key} is the pass key.")["input_ids"]
        tail = tok(" What is the pass key? The pass key is")["input_ids"]
        ids = p.tokens.tolist()
        at = next(i for i in range(len(ids)) if ids[i:i + len(needle)] == needle)
        n_hay = p.length - len(needle) - len(tail) - (p.length - p.answer_start)
        assert at == round(p.depth * n_hay)  # the needle after depth × the haystack's tokens
    recall = recall_task(tok, lengths=(150,), depths=(0.25, 0.75), per_cell=3, seed=5)
    assert len(recall.prompts) == 6 and {p.depth for p in recall.prompts} == {0.25, 0.75}
    for p in recall.prompts:
        text = tok.decode(p.tokens.tolist())
        key = tok.decode(p.tokens[p.answer_start:].tolist()).strip()
        assert len(key) == 5 and key.isdigit() and text.endswith(f" The pass key is {key}")
        assert text.count(f"The pass key is {key}.") == 1 and text.count("pass key") == 2  # one needle, one prompt
        needle, tail = tok(f" The pass key is {key}.")["input_ids"], tok(" The pass key is")["input_ids"]
        ids = p.tokens.tolist()
        at = next(i for i in range(len(ids)) if ids[i:i + len(needle)] == needle)
        n_hay = p.length - len(needle) - len(tail) - (p.length - p.answer_start)
        assert at == round(p.depth * n_hay)
    multi = multikey_task(tok, length=200, keys=3, n_prompts=4, seed=1)
    for p in multi.prompts:
        text = tok.decode(p.tokens.tolist())
        assert text.count("The pass key of the") == 4  # three needles and the question
        colour = text[text.rindex("What is the pass key of the ") + 28:].split()[0]
        key = tok.decode(p.tokens[p.answer_start:].tolist()).strip()
        assert f"The pass key of the {colour} box is {key}." in text


def test_right_means_greedy_generation_gives_the_answer(shipped):
    model, hf, tok = shipped
    passkey = passkey_task(tok, lengths=(96, 160), depths=(0.2, 0.8), per_cell=2, seed=0)
    recall = recall_task(tok, lengths=(120,), depths=(0.3, 0.9), per_cell=2, seed=2)
    task = LongTask("both", passkey.prompts + recall.prompts)
    for layers in (None, (2, 4)):
        spec = None if layers is None else {
            l: Streaming(kv_alpha(model, l, list(range(model.cfg.n_kv_heads))), SINK, RECENT) for l in layers}
        got = run_task(model, task, spec).right
        with streaming(model, spec or {}):
            predicted = [answer_predictions(model, [p])[0] for p in task.prompts]
        expected = []
        for p in task.prompts:
            handles = [] if layers is None else streaming_hooks(hf, layers, p.length)
            try:
                with torch.no_grad():  # teacher-forced: the answer's tokens are the model's top-1, one by one
                    top = hf(p.tokens[None]).logits[0, p.answer_start - 1:-1].argmax(-1)
                if layers is None:
                    n = len(p.tokens) - p.answer_start
                    generated = hf.generate(p.tokens[None, :p.answer_start], max_new_tokens=n, do_sample=False,
                                            pad_token_id=0)[0, p.answer_start:]
                    assert torch.equal(generated == p.tokens[p.answer_start:], top == p.tokens[p.answer_start:])
            finally:
                for h in handles:
                    h.remove()
            assert torch.equal(predicted[len(expected)], top)  # the same top-1 tokens, answer position by position
            expected.append(bool((top == p.tokens[p.answer_start:]).all()))
        assert got == expected


def test_a_task_the_model_fails_is_refused_in_one_line(shipped):
    model, _, tok = shipped
    result = run_task(model, passkey_task(tok, lengths=(200,), depths=(0.5,), per_cell=4, seed=1))
    if result.share >= 0.5:
        pytest.skip("the shipped model performs the passkey task")
    with pytest.raises(HeadpruneError, match=r"right on \d+% of 4 prompts .* does not perform the task"):
        check_performs(result)


def test_long_window_nll_is_transformers_cross_entropy(shipped):
    model, hf, tok = shipped
    windows = long_windows(tok, length=200, n_windows=3)
    assert windows.shape == (3, 200)
    got = long_window_nll(model, windows, tail=40, short=30)

    def ce(x):
        with torch.no_grad():
            logits = hf(x).logits[:, -41:-1].double()
        return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, -40:].reshape(-1)))

    assert got["long"] == pytest.approx(ce(windows), abs=1e-4)
    assert got["short"] == pytest.approx(ce(windows[:, -70:]), abs=1e-4)
    assert got["gain"] == pytest.approx(got["short"] - got["long"], abs=1e-12)
    with pytest.raises(HeadpruneError, match="less than the window"):
        long_window_nll(model, windows, tail=100, short=100)


def test_the_long_corpus():
    docs = long_documents()
    names = [n for n, _ in docs]
    assert names == sorted(names) and "license:python" in names
    assert all(len(t) >= (MIN_CODE_CHARS if n.startswith("code:") else MIN_PROSE_CHARS)
               for n, t in docs if n != "license:python")
    assert any(n.startswith("topic:") for n in names) and any(n.startswith("module:") for n in names)
    by_split = {s: load_texts("longdocs", s) for s in ("train", "validation", "test")}
    assert sum(len(v) for v in by_split.values()) == len(docs) and all(by_split.values())
