"""Issue 38: the serving figures are the median of timed repeats, and the spread of the repeats (the rate of the
slowest and of the fastest) is kept in serving.csv and printed wherever a rate is (the report's findings and
table)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from headprune.pruning import serving
from headprune.report.render import Findings, Table
from headprune.report.serving_section import serving_parts

SIZES = {"vocab_size": 97, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 48, "num_hidden_layers": 2, "max_position_embeddings": 64}
PREFILL = [0.5, 0.25, 2.0, 1.0, 0.5]  # seconds of the 5 timed prefills: median 0.5, fastest 0.25, slowest 2
DECODE = {1: [0.25, 0.5, 1.0], 2: [1.0, 1.0, 0.25]}  # seconds of the 3 decoding steps at each batch


def readings() -> list[float]:
    """perf_counter's readings, two per timed call, so that the calls last PREFILL then DECODE[1], DECODE[2]."""
    out, now = [], 0.0
    for seconds in PREFILL + DECODE[1] + DECODE[2]:
        out += [now, now + seconds]
        now += seconds + 1.0
    return out


@pytest.fixture
def measured(tmp_path, monkeypatch):
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SIZES)).eval().save_pretrained(tmp_path)
    clock = iter(readings())
    monkeypatch.setattr(serving.time, "perf_counter", lambda: next(clock))
    work = serving.Workload(batch=3, seq_len=8, steps=3, prompt=4, decode_batches=(1, 2), prefills=5)
    return serving.measure_serving(tmp_path, work)


def test_each_rate_has_the_median_and_the_slowest_and_fastest_repeat(measured):
    tokens = 3 * 8
    assert (measured["prefill_tokens_per_s"], measured["prefill_tokens_per_s_min"],
            measured["prefill_tokens_per_s_max"]) == (tokens / 0.5, tokens / 2.0, tokens / 0.25)
    assert (measured["decode_b1_tokens_per_s"], measured["decode_b1_tokens_per_s_min"],
            measured["decode_b1_tokens_per_s_max"]) == (1 / 0.5, 1 / 1.0, 1 / 0.25)
    assert (measured["decode_b2_tokens_per_s"], measured["decode_b2_tokens_per_s_min"],
            measured["decode_b2_tokens_per_s_max"]) == (2 / 1.0, 2 / 1.0, 2 / 0.25)


def test_the_report_prints_the_spread_beside_each_rate(measured):
    """The serving section's table cell and findings sentence of a rate: the median, then the slowest–fastest."""
    rates = {k.replace("b2", "b32"): v for k, v in measured.items() if "tokens_per_s" in k}
    row = {"fraction": 0.0, "removed": 0, "query_heads": 4, "kv_heads": 2, "layout": "compact", "parameters": 1,
           "ppl": 10.0, "kv_bytes_per_token": 256.0, "max_abs_logit_diff": 0.0, **rates}
    table = pd.DataFrame([row], columns=list(serving.SERVING_COLUMNS))
    section = serving_parts(table, {"serving": {"method": "grad", "workload": {"prefills": 5}}})
    shown = next(b for b in section.blocks if isinstance(b, Table)).df.iloc[0]
    assert shown["prefill tok/s"] == "48 (12–96)"
    assert shown["decode b1 tok/s"] == "2 (1–4)" and shown["decode b32 tok/s"] == "2 (2–8)"
    sentence = next(b for b in section.blocks if isinstance(b, Findings)).sentences[0]
    assert "48 prefill tokens/s (12–96 over the repeats)" in sentence
    assert "2.0 tokens/s at batch 1 (1.0–4.0 over the repeats)" in sentence


def test_a_table_without_the_spread_shows_the_median_alone():
    """serving.csv of a run made before the spread was kept still renders."""
    row = {"fraction": 0.0, "removed": 0, "query_heads": 4, "kv_heads": 2, "layout": "compact", "ppl": 10.0,
           "prefill_tokens_per_s": 48.0, "decode_b1_tokens_per_s": 2.0, "decode_b32_tokens_per_s": 2.0,
           "kv_bytes_per_token": 256.0, "max_abs_logit_diff": 0.0}
    section = serving_parts(pd.DataFrame([row]), {})
    assert next(b for b in section.blocks if isinstance(b, Table)).df.iloc[0]["prefill tok/s"] == "48"
