"""``headprune generate``: greedy decoding through the KV cache, with and without a streaming pattern, on the shipped
model (6 layers × 8 KV heads × d_k 32, fp32, no window). Its tokens are transformers' greedy tokens (the shipped
model saved in transformers' format and run by its generate); the bytes it reports are counted by hand; bad input is
one line."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.cli.main import main
from headprune.context.pattern import KVPattern, write_pattern
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.io.write.export import export_hf
from headprune.models.kv_cache import kv_heads
from headprune.schema import DEFAULT_MODEL

PROMPT = "Return the sum of two numbers. " * 6
PER_POSITION = 2 * 32 * 4  # K and V of one KV head at one position, fp32


def run_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["generate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_full_attention_tokens_are_transformers_greedy_ones(capsys, tmp_path):
    got = run_json(capsys, "--prompt", PROMPT, "--new-tokens", "9", "--chunk", "16")
    model = load_model(DEFAULT_MODEL)
    tokenizer = model_tokenizer(model)
    ids = torch.tensor([tokenizer(PROMPT, add_special_tokens=False)["input_ids"]])
    export_hf(model, tmp_path / "hf")
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=9, min_new_tokens=9,
                               do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
    assert got["text"] == tokenizer.decode(expected.tolist())
    n = ids.shape[1] + 9 - 1  # the last token is generated, not fed
    assert got["prompt_tokens"] == ids.shape[1] and got["streaming_kv_heads"] == 0
    assert got["kv_cache_bytes"] == got["full_attention_bytes"] == 48 * n * PER_POSITION


def test_a_pattern_holds_sinks_and_recent_window_only(capsys, tmp_path):
    model = load_model(DEFAULT_MODEL)
    order = kv_heads(model)
    write_pattern(KVPattern(model_fingerprint(model), 2, 8, order, 30, "test"), model, tmp_path / "p")
    got = run_json(capsys, "--prompt", PROMPT, "--new-tokens", "4", "--pattern", str(tmp_path / "p"))
    n = got["prompt_tokens"] + 4 - 1
    assert n > 2 + 8 and got["streaming_kv_heads"] == 30
    assert got["kv_cache_bytes"] == (30 * (2 + 8) + 18 * n) * PER_POSITION
    assert got["full_attention_bytes"] == 48 * n * PER_POSITION


@pytest.mark.parametrize("args, message", [
    (["--prompt", "word " * 300], "exceed the model's context of 256 tokens"),
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "x", "--new-tokens", "0"], "must be at least 1"),
    (["--prompt-file", "/no/such/prompt.txt"], "--prompt-file /no/such/prompt.txt: does not exist"),
    (["--prompt", "x", "--pattern", "reports/gemma-3-270m/context/pattern"], "made for another model"),
])
def test_bad_input_is_one_line(args, message, capsys):
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
