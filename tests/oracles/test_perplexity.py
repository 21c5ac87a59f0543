"""Sliding-window perplexity against the Hugging Face guide's loop run on GPT2LMHeadModel."""

import json

import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.cli.main import main
from headprune.io.read.loading import load_model
from headprune.perplexity import Windowing, evaluate, sliding_windows, window_batches

from helpers import TINY, guide_loop


@pytest.mark.parametrize("seq_len, stride, n", [(64, 64, 1000), (64, 24, 1000), (48, 48, 97), (64, 17, 300)])
def test_equals_guide_loop(tiny_dir, seq_len, stride, n):
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    ids = torch.randint(0, TINY["vocab_size"], (n,), generator=torch.Generator().manual_seed(n))
    want_nll, want_tokens = guide_loop(hf, ids, seq_len, stride)
    got = evaluate(load_model(tiny_dir), ids, Windowing(seq_len, stride, 3), progress=False)
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
    assert set(out) == {"model", "data", "split", "max_tokens", "seq_len", "stride", "tokens", "windows", "nll",
                        "nll_se", "ppl", "ppl_se", "bytes", "bits_per_byte"}
    assert (out["model"], out["data"], out["split"], out["seq_len"], out["stride"]) == (str(tiny_dir), str(corpus),
                                                                                       None, 32, 16)
    from headprune.data.tokens import tokenize_corpus
    from headprune.io.read.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_dir)
    ids = tokenize_corpus([corpus.read_text()], tok)
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    want, _ = guide_loop(hf, ids, 32, 16)
    assert out["nll"] == pytest.approx(want, rel=1e-5) and out["tokens"] == len(ids) - 1
    # the standard error over windows, from Hugging Face's per-window mean losses m_w over n_w scored tokens:
    # Var = W/(W-1) * sum_w n_w^2 (m_w - R)^2 / N^2 with R = sum_w n_w m_w / N (the ratio estimator's variance)
    means, counts, prev_end = [], [], 0
    for begin in range(0, len(ids), 16):
        end = min(begin + 32, len(ids))
        labels = ids[begin:end].clone().view(1, -1)
        labels[:, : -(end - prev_end)] = -100
        n = int((labels[:, 1:] != -100).sum())
        with torch.no_grad():
            means.append(hf(ids[begin:end].view(1, -1), labels=labels).loss.item())
        counts.append(n)
        prev_end = end
        if end == len(ids):
            break
    m, n = np.array(means), np.array(counts, float)
    ratio, W = (m * n).sum() / n.sum(), len(m)
    se = np.sqrt(W / (W - 1) * (n**2 * (m - ratio) ** 2).sum()) / n.sum()
    assert out["windows"] == W and out["nll_se"] == pytest.approx(se, rel=1e-4)
    assert out["ppl_se"] == pytest.approx(np.exp(ratio) * se, rel=1e-4)
    text = corpus.read_text()  # every byte but the first token's is scored
    assert out["bytes"] == len(text.encode()) - len(tok.decode(ids[:1].tolist()).encode())
    assert out["bits_per_byte"] == pytest.approx(want * out["tokens"] / (np.log(2) * out["bytes"]), rel=1e-5)


def test_cli_eval_prints_header_and_standard_error(tiny_dir, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    assert main(["eval", "--model", str(tiny_dir), "--data", str(corpus), "--seq-len", "32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"model: {tiny_dir}" and lines[1].startswith(f"data: {corpus}, ")
    assert lines[2] == "windows: seq_len 32, stride 32"
    assert " ± " in lines[4] and "standard error over" in lines[4] and lines[6].startswith("bits per byte: ")


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
