"""The context scores (headprune.scoring.context) against independent computations:

- ctx_stream: transformers' own model, eager, with the streamed KV head's query heads given the streaming mask by
  a pre-hook on their layer's attention (the oracle of tests/oracles/test_streaming_heads.py), its mean NLL minus
  the plain one, per KV head, on a GQA Llama and on Gemma 3 (sliding and global layers), to <= 1e-5 nats;
- ctx_gate: a central finite difference of the corpus NLL in the group's α (all its query heads together);
- ctx_retrieval: a plain-Python count over the shipped model's explicit attention probabilities on stdlib text.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headprune.data.sources import load_texts
from headprune.data.tokens import tokenize_corpus
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import load_tokenizer
from headprune.models.hooks import Capture
from headprune.models.streaming import Streaming, streaming
from headprune.perplexity import Windowing
from headprune.schema import DEFAULT_MODEL, parse_methods
from headprune.scoring import ScoringOptions, score_heads

from helpers import save_gqa_family

VOCAB, SEQ, WINDOWS, SINK, RECENT = 131, 24, 5, 2, 5
WINDOWING = Windowing.resolve(64, SEQ, SEQ, batch_size=3)  # 2 batches: 3 windows, then 2
IDS = torch.randint(0, VOCAB, (SEQ * WINDOWS,), generator=torch.Generator().manual_seed(0))
OPTIONS = ScoringOptions(ablation_rows=4, bootstrap=20, stream_sink=SINK, stream_recent=RECENT)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_gqa_family(request.param, folder, VOCAB, seed=5)
    hf.set_attn_implementation("eager")
    return hf, load_model(folder)


def hf_nll(hf, layer: int | None = None, query_heads: tuple[int, ...] = (), window: int | None = None) -> float:
    """transformers' mean NLL over the windows, ``query_heads`` of ``layer`` streaming."""
    handle = None
    if layer is not None:
        n_heads = hf.config.num_attention_heads
        usual = torch.tensor([[s <= q and (window is None or q - s < window) for s in range(SEQ)]
                              for q in range(SEQ)])
        allowed = usual.expand(n_heads, SEQ, SEQ).clone()
        allowed[list(query_heads)] &= torch.tensor([[s < SINK or q - s < RECENT for s in range(SEQ)]
                                                    for q in range(SEQ)])
        additive = torch.zeros(1, n_heads, SEQ, SEQ).masked_fill(~allowed, float("-inf"))
        handle = hf.model.layers[layer].self_attn.register_forward_pre_hook(
            lambda _m, args, kwargs: (args, {**kwargs, "attention_mask": additive}), with_kwargs=True)
    try:
        with torch.no_grad():
            x = IDS.view(WINDOWS, SEQ)
            logits = hf(x).logits.double()
            return float(F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1)))
    finally:
        if handle is not None:
            handle.remove()


def test_ctx_stream_is_transformers_nll_change(models):
    hf, ours = models
    table = score_heads(ours, IDS, ["ctx_stream"], windowing=WINDOWING, options=OPTIONS, show_progress=False).table
    base = hf_nll(hf)
    r = hf.config.num_attention_heads // hf.config.num_key_value_heads
    for layer in range(2):
        window = ours.h[layer].attn.window
        for g in range(hf.config.num_key_value_heads):
            heads = tuple(range(g * r, (g + 1) * r))
            expected = hf_nll(hf, layer, heads, window) - base
            got = table[(table.layer == layer) & table["head"].isin(heads)]["ctx_stream"]
            assert len(got) == r and (got - expected).abs().max() <= 1e-5, (layer, g, list(got), expected)
    assert (table.ctx_stream_ci_lo <= table.ctx_stream + 1e-12).all()
    assert (table.ctx_stream.abs() > 1e-4).any()  # streaming changed the loss somewhere: the check has teeth


def corpus_nll(model, alphas: dict[int, torch.Tensor]) -> float:
    x = IDS.view(WINDOWS, SEQ)
    with torch.no_grad(), streaming(model, {l: Streaming(a, SINK, RECENT) for l, a in alphas.items()}):
        logits = model(x).double()
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1)))


def test_ctx_gate_is_the_derivative_in_the_group_gate(models):
    _, ours = models
    table = score_heads(ours, IDS, ["ctx_gate"], windowing=WINDOWING, options=OPTIONS, show_progress=False).table
    eps = 1e-2
    for layer in range(2):
        attn = ours.h[layer].attn
        for g in range(attn.n_kv_heads):
            direction = torch.tensor([float(p == g) for p in attn.kv_positions])  # the group's query heads
            plus = corpus_nll(ours, {layer: 1 + eps * direction})
            minus = corpus_nll(ours, {layer: 1 - eps * direction})
            expected = (minus - plus) / (2 * eps)  # −d/dα_g of the corpus NLL
            heads = [h for h, p in zip(ours.cfg.kept_heads[layer], attn.kv_positions) if p == g]
            got = table[(table.layer == layer) & table["head"].isin(heads)]["ctx_gate"]
            assert (got - expected).abs().max() <= 2e-4 * max(1.0, abs(expected)), (layer, g, list(got), expected)


def test_context_scores_are_opt_in_and_refuse_a_window_covering_the_context(models):
    _, ours = models
    assert not {"ctx_stream", "ctx_gate", "ctx_retrieval"} & set(parse_methods("all"))
    with pytest.raises(HeadpruneError, match="cover the whole context"):
        score_heads(ours, IDS, ["ctx_gate"], windowing=WINDOWING,
                    options=ScoringOptions(stream_sink=4, stream_recent=SEQ), show_progress=False)


def test_ctx_retrieval_counts_top_attention_on_the_copied_token(tmp_path_factory):
    model = load_model(DEFAULT_MODEL)
    tok = load_tokenizer(DEFAULT_MODEL, model.cfg.vocab_size)
    ids = tokenize_corpus(load_texts("code", "validation"), tok, tmp_path_factory.mktemp("ctx-tokens"))[:4 * 128]
    sink, recent = 2, 16
    windowing = Windowing.resolve(model.cfg.n_positions, 128, 128, batch_size=2)
    table = score_heads(model, ids, ["ctx_retrieval"], windowing=windowing, options=ScoringOptions(stream_sink=sink,
                        stream_recent=recent, bootstrap=0), show_progress=False).table
    hits, events = torch.zeros(len(table)), 0
    for x in ids.view(4, 128):
        capture = Capture()
        with torch.no_grad():
            predicted = model(x[None], capture=capture, need_weights=True)[0].argmax(-1)
        for t in range(127):
            y = int(x[t + 1])
            sources = [s for s in range(t + 1) if int(x[s]) == y]
            if int(predicted[t]) != y or not sources or any(s < sink or s > t - recent for s in sources):
                continue
            events += 1
            column = 0
            for layer in range(model.cfg.n_layers):
                top = capture.attn[layer][0, :, t].argmax(-1)  # (h,)
                hits[column:column + len(top)] += torch.tensor([float(int(x[int(s)]) == y) for s in top])
                column += len(top)
    assert events >= 10
    assert torch.allclose(torch.tensor(table.ctx_retrieval.values, dtype=torch.float32), hits / events, atol=1e-6)
    assert table.ctx_retrieval.max() > 0.2  # some heads of the trained model do retrieve
