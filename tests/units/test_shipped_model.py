"""The shipped default model: its model card's perplexity, far below a unigram model, and heads that matter."""

import json
import platform

import pytest
import torch

from headprune.cli.main import main
from headprune.data.sources import load_texts
from headprune.data.tokens import tokenize_corpus
from headprune.io.read.loading import load_model
from headprune.io.read.model_names import ZOO
from headprune.io.read.tokenizer import load_tokenizer
from headprune.perplexity import Windowing, evaluate
from headprune.schema import DEFAULT_MODEL

CARD = ZOO / DEFAULT_MODEL


@pytest.fixture(scope="module")
def metrics():
    return json.loads((CARD / "metrics.json").read_text())


@pytest.fixture(scope="module")
def model():
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def test_ids(model):
    return tokenize_corpus(load_texts("default", "test"), load_tokenizer(DEFAULT_MODEL, model.cfg.vocab_size))


def test_shipped_files_small_and_architecture_is_gpt2(model):
    size = sum(p.stat().st_size for p in CARD.iterdir())
    assert size <= 25 * 2**20
    assert json.loads((CARD / "config.json").read_text())["model_type"] == "gpt2"
    assert len(model.head_ids) >= 48 and model.dtype == torch.float32


CARD_PYTHON = "3.11.7"  # the card's corpus is the documentation of this Python's standard library (MODEL_CARD.md)


@pytest.mark.skipif(platform.python_version() != CARD_PYTHON,
                    reason=f"the default corpus is this Python's stdlib docs; the card's numbers are for {CARD_PYTHON}")
def test_test_perplexity_equals_model_card_and_beats_unigram(model, test_ids, metrics):
    result = evaluate(model, test_ids, Windowing(metrics["seq_len"], metrics["stride"], 16), progress=False)
    assert result.ppl == pytest.approx(metrics["test_ppl"], rel=0.005)
    assert result.ppl < metrics["unigram_test_ppl"] / 3
    card = (CARD / "MODEL_CARD.md").read_text()
    assert f"Python {CARD_PYTHON} standard library" in card
    assert f"{metrics['test_ppl']:.3f}" in card and f"{metrics['unigram_test_ppl']:.3f}" in card


def test_zero_ablating_any_layer_raises_nll(model, test_ids):
    ids = test_ids[:8192]
    base = evaluate(model, ids, Windowing(256, 256, 16), progress=False).nll
    for layer in range(model.cfg.n_layers):
        gates = model.ones_gates()
        gates[layer][:] = 0
        assert evaluate(model, ids, Windowing(256, 256, 16), progress=False, gates=gates).nll > base + 1e-3


def test_info_runs_on_the_default(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert DEFAULT_MODEL in out and "heads_kept=48/48" in out
