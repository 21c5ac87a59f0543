"""Sliding-window perplexity against the Hugging Face guide's loop run on GPT2LMHeadModel."""

import json

import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.cli import main
from headprune.loading import load_model
from headprune.perplexity import evaluate, sliding_windows, window_batches

from helpers import TINY, guide_loop


@pytest.mark.parametrize("seq_len, stride, n", [(64, 64, 1000), (64, 24, 1000), (48, 48, 97), (64, 17, 300)])
def test_equals_guide_loop(tiny_dir, seq_len, stride, n):
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    ids = torch.randint(0, TINY["vocab_size"], (n,), generator=torch.Generator().manual_seed(n))
    want_nll, want_tokens = guide_loop(hf, ids, seq_len, stride)
    got = evaluate(load_model(tiny_dir), ids, seq_len, stride, batch_size=3, progress=False)
    assert got.tokens == want_tokens
    # stride < seq_len: every token but the first is scored once; else each window's first token has no context
    assert got.tokens == (n - 1 if stride < seq_len else n - -(-n // seq_len))
    assert got.nll == pytest.approx(want_nll, rel=1e-5)
    assert got.ppl == pytest.approx(torch.exp(torch.tensor(want_nll, dtype=torch.float64)).item(), rel=1e-5)


def test_each_token_scored_once_with_full_context_up_to_window():
    windows = sliding_windows(100, 32, 10)
    scored = [t for w in windows for t in range(w.first_scored, w.end)]
    assert scored == list(range(1, 100))
    assert windows[-1].end == 100 and all(w.end - w.begin <= 32 for w in windows)
    batches = window_batches(torch.arange(100), 32, 10, 4)
    assert sum(int(b.mask.sum()) for b in batches) == 99


def test_cli_eval_json_matches_python(tiny_dir, tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    assert main(["eval", "--model", str(tiny_dir), "--data", str(corpus), "--seq-len", "32", "--stride", "16",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"tokens", "nll", "ppl"}
    from headprune.corpus import tokenize_corpus
    from headprune.loading import load_tokenizer

    ids = tokenize_corpus([corpus.read_text()], load_tokenizer(tiny_dir))
    want, _ = guide_loop(GPT2LMHeadModel.from_pretrained(tiny_dir).eval(), ids, 32, 16)
    assert out["nll"] == pytest.approx(want, rel=1e-5) and out["tokens"] == len(ids) - 1


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--seq-len", "65"], "exceeds the model's n_positions 64"),
        (["--stride", "0"], "--stride 0 must be in"),
        (["--seq-len", "32", "--stride", "33"], "--stride 33 must be in"),
    ],
)
def test_bad_window_options(tiny_dir, tmp_path, capsys, monkeypatch, extra, words):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text " * 50)
    assert main(["eval", "--model", str(tiny_dir), "--data", str(corpus)] + extra) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_short_corpus_scores_what_there_is(tiny_dir, tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a short text")
    assert main(["eval", "--model", str(tiny_dir), "--data", str(corpus), "--json"]) == 0
    captured = capsys.readouterr()
    assert "shorter than one window" in captured.err
    assert json.loads(captured.out)["tokens"] == 2  # "a short text" is 3 GPT-2 tokens


@pytest.mark.parametrize("content", [b"", b"  \n\t ", b"caf\xe9 au lait"])
def test_empty_or_non_utf8_corpus(tiny_dir, tmp_path, capsys, monkeypatch, content):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(content)
    assert main(["eval", "--model", str(tiny_dir), "--data", str(corpus)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("empty" in err or "UTF-8" in err)
