"""``verify --method ctx_stream``: the verified ranking over KV heads made streaming. Its exact values are the
``ctx_stream`` scores (themselves tested against transformers with an explicit streaming mask in
test_context_scores.py), read once per KV head; a set of KV heads streaming together, measured from the cached
residual stream, equals a full forward with those KV heads streaming; the command prints KV heads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from headprune.cli.main import main
from headprune.io.read.loading import load_model
from headprune.io.work.progress import NoProgress
from headprune.models.streaming import Streaming, streaming
from headprune.perplexity import Windowing, evaluate
from headprune.scoring import ScoringOptions, score_heads
from headprune.scoring.set_sweep import Intervention, SetSweep
from headprune.scoring.verified import Verification, exact_ranking, unit_values, verify_ranking, verify_units

from helpers import save_gqa_family

VOCAB, SEQ, WINDOWS, SINK, RECENT = 131, 24, 5, 2, 5
WINDOWING = Windowing.resolve(64, SEQ, SEQ, batch_size=3)
IDS = torch.randint(0, VOCAB, (SEQ * WINDOWS,), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    save_gqa_family("llama", folder, VOCAB, seed=5)
    model = load_model(folder)
    scored = score_heads(model, IDS, ["ctx_stream", "ctx_gate"], windowing=WINDOWING, show_progress=False,
                         options=ScoringOptions(ablation_rows=4, bootstrap=0, stream_sink=SINK, stream_recent=RECENT))
    return model, scored.table


def test_units_are_kv_heads_and_their_values_the_groups(setup):
    model, table = setup
    units = verify_units(model, "ctx_stream")
    assert len(units) == sum(model.h[layer].attn.n_kv_heads for layer in range(model.cfg.n_layers))
    assert len(units) < len(model.head_ids)  # grouped-query attention: fewer KV heads than query heads
    per_unit = unit_values(model, "ctx_stream", table["ctx_stream"].to_numpy(), "ctx_stream")
    for (layer, kv), value in zip(units, per_unit, strict=True):
        attn = model.h[layer].attn
        shared = {float(table.loc[(table.layer == layer) & (table["head"] == h), "ctx_stream"].iloc[0])
                  for i, (_, h) in enumerate((ly, hd) for ly, hd in model.head_ids if ly == layer)
                  if attn.kv_positions[i] == kv}
        assert shared == {value}  # every query head of the group holds the group's value
    summed = unit_values(model, "ctx_stream", np.ones(len(model.head_ids)), "taylor")
    assert summed.tolist() == [model.cfg.n_heads // model.cfg.n_kv_heads] * len(units)  # a query-head score sums


def test_verified_kv_heads_are_their_ctx_stream(setup):
    model, table = setup
    units = verify_units(model, "ctx_stream")
    exact = unit_values(model, "ctx_stream", table["ctx_stream"].to_numpy(), "ctx_stream")
    estimate = pd.Series(unit_values(model, "ctx_stream", table["ctx_gate"].to_numpy(), "ctx_gate"), name="ctx_gate")
    result = verify_ranking(model, IDS, estimate, "ctx_stream", windowing=WINDOWING, show_progress=False,
                            verification=Verification(verified=2, subsets=8, rounds=1, rows=4, stream=(SINK, RECENT)))
    verified = result.table[result.table.verified]
    assert len(verified) == 2 and set(result.table.head_id) == {f"L{la}G{g}" for la, g in units}
    for row in verified.itertuples():
        assert row.exact == pytest.approx(exact[units.index((row.layer, row.head))], abs=1e-6)
    assert np.isfinite(result.bound) and result.bound >= 0
    every = exact_ranking(model, IDS, estimate, "ctx_stream", windowing=WINDOWING, show_progress=False,
                          verification=Verification(verified=2, rows=4, stream=(SINK, RECENT)))
    assert every.table.exact.to_numpy() == pytest.approx(exact, abs=1e-12)


def test_kv_heads_streaming_together_equal_a_full_forward(setup):
    model, _ = setup
    chosen = [(0, 1), (1, 0)]
    how = Intervention([None] * model.cfg.n_layers, (SINK, RECENT))
    sweep = SetSweep(model, "ctx_stream", WINDOWING.batches(IDS), how, 4, NoProgress(), False)
    joint = float(sweep.measure({"pair": [chosen]}, "pair")["pair"][0])
    alphas = {layer: Streaming(torch.tensor([float(p != kv) for p in model.h[layer].attn.kv_positions]), SINK, RECENT)
              for layer, kv in chosen}
    plain = evaluate(model, IDS, WINDOWING, progress=False).nll
    with streaming(model, alphas):
        streamed = evaluate(model, IDS, WINDOWING, progress=False).nll
    assert joint == pytest.approx(streamed - plain, abs=1e-6)


def test_the_command_verifies_kv_heads(tiny_dir, corpus, tmp_path, capsys):
    out = tmp_path / "v.csv"
    assert main(["verify", "--model", str(tiny_dir), "--data", str(corpus), "--seq-len", "32", "--max-tokens", "256",
                 "--method", "ctx_stream", "--sink", "2", "--window", "8", "--verify", "2", "--bound-subsets", "8",
                 "--exact-sweep", "never", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "verified the 2 KV heads ctx_gate ranks first" in printed
    table = pd.read_csv(out)
    assert table.head_id.str.fullmatch(r"L\d+G\d+").all() and len(table) == 12  # GPT-2: a KV head per query head
