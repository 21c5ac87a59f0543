"""The llama.cpp serving table (issue 54, part 3): a tiny random Llama read from a GGUF file, its uniform and uneven
prunes written as GGUF files and run by llama.cpp; each row's perplexity equals headprune's on the same scored tokens
(overlapping windows: the masks matter), its KV bytes and padding match a count by hand, and its rates keep their
spread. The report section's sentences are recomputed from the table."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch

from headprune.io.read.loading import load_model
from headprune.io.write.gguf import export_gguf
from headprune.models.prune import prune_heads
from headprune.perplexity import Windowing, evaluate
from headprune.report.render import Findings, Note, Table
from headprune.report.serving_gguf_section import gguf_serving_findings, gguf_serving_parts, read_gguf_serving_file

from helpers import save_gqa_family, vocab_gguf

llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's binding is not installed (pip install '.[gguf]')")

from headprune.pruning.serving_gguf import (
    GgufWorkload,
    export_gguf_prunes,
    gguf_serving_blocker,
    serve_gguf_prunes,
)

N_LAYERS, N_HEADS, GROUP, D_HEAD = 2, 6, 2, 8  # save_gqa_family("llama"): d 48, 6 query / 3 KV heads


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny random Llama written as an f32 GGUF file with a byte-level tokenizer (its conversions cached in the
    module's own models folder)."""
    folder = tmp_path_factory.mktemp("tiny-served")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADPRUNE_MODELS", str(folder / "cache"))
    save_gqa_family("llama", folder / "hf", 300, seed=5)
    yield export_gguf(load_model(folder / "hf"), folder / "tiny.gguf", gguf_type="f32",
                      source=vocab_gguf(folder / "vocab.gguf", 300))
    mp.undo()


@pytest.fixture(scope="module")
def served(tiny_gguf):
    """(model read from its GGUF file, scores, evaluation ids, windowing, the table at f32, the refused shapes)."""
    source, folder = tiny_gguf, tiny_gguf.parent
    model = load_model(str(source))
    rng = np.random.default_rng(0)
    layers, heads = zip(*model.head_ids)
    scores = pd.DataFrame({"layer": layers, "head": heads, "head_id": [f"L{a}H{b}" for a, b in model.head_ids],
                           "x": rng.random(len(layers))})
    ids = torch.randint(0, 300, (120,), generator=torch.Generator().manual_seed(2))
    windowing = Windowing(seq_len=32, stride=16, batch_size=4)
    prunes, refused = export_gguf_prunes(model, scores, "x", ids, windowing, folder / "out", fractions=(0.0, 0.5),
                                         gguf_type="f32")
    table = serve_gguf_prunes(prunes, ids, windowing, GgufWorkload(prompt=16, steps=4, repeats=3), gguf_type="f32")
    return model, scores, ids, windowing, table, refused


def test_rows_are_the_unpruned_the_uniform_and_the_uneven_prune(served):
    *_, table, refused = served
    assert table["shape"].tolist() == ["unpruned", "uniform", "uneven"] and not refused
    assert table["arch"].tolist() == ["llama", "llama", "deci"]
    uneven = table.iloc[2]
    assert int(uneven["removed"]) == round(0.5 * N_LAYERS * N_HEADS)  # the ranking's own k heads
    assert int(uneven["query_heads"]) == N_LAYERS * N_HEADS - int(uneven["removed"])


def _removed(scores: pd.DataFrame, k: int) -> list[tuple[int, int]]:
    """The k lowest heads by ``x``, by hand."""
    low = scores.sort_values(["x", "layer", "head"]).head(k)
    return list(zip(low["layer"].astype(int), low["head"].astype(int), strict=True))


def test_each_row_s_perplexity_equals_headprune_s_on_the_same_scored_tokens(served):
    """f32 files: llama.cpp's perplexity over the masked tokens of overlapping windows = headprune's of the same
    prune, evaluated here independently (1e-4 relative); the table's headprune column = that evaluation."""
    model, scores, ids, windowing, table, _ = served
    uneven = prune_heads(model, _removed(scores, int(table.iloc[2]["removed"])))
    expected = [evaluate(model, ids, windowing, progress=False).ppl, None,
                evaluate(uneven, ids, windowing, progress=False).ppl]
    for row, ppl in zip(table.itertuples(), expected, strict=True):
        assert row.ppl == pytest.approx(row.headprune_ppl, rel=1e-4)
        if ppl is not None:
            assert row.headprune_ppl == pytest.approx(ppl, rel=1e-9)


def test_kv_bytes_and_padding_match_a_count_by_hand(served):
    """KV bytes per token: Σ_l 2 · kept KV heads · d_k · 2 (f16 cache); padded: per layer, each kept KV group filled
    to the largest group's count with zero query heads (an emptied layer 0 keeps one zero head over one KV head)."""
    _, scores, _, _, table, _ = served
    removed = set(_removed(scores, int(table.iloc[2]["removed"])))
    kv_heads, padded = 0, 0
    for layer in range(N_LAYERS):
        groups = [sum((layer, g * GROUP + i) not in removed for i in range(GROUP)) for g in range(N_HEADS // GROUP)]
        kept = [c for c in groups if c]
        if not kept:
            kv_heads, padded = kv_heads + (layer == 0), padded + (layer == 0)
            continue
        kv_heads += len(kept)
        padded += sum(max(kept) - c for c in kept)
    uneven = table.iloc[2]
    assert int(uneven["kv_bytes_per_token"]) == 2 * kv_heads * D_HEAD * 2
    assert int(uneven["padded_heads"]) == padded
    assert int(table.iloc[0]["kv_bytes_per_token"]) == 2 * N_LAYERS * (N_HEADS // GROUP) * D_HEAD * 2
    assert (table["file_bytes"] > 0).all() and table["file_bytes"].iloc[1] < table["file_bytes"].iloc[0]


def test_rates_keep_their_spread(served):
    table = served[4]
    for rate in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        assert ((table[f"{rate}_min"] <= table[rate]) & (table[rate] <= table[f"{rate}_max"])).all()
        assert (table[f"{rate}_min"] > 0).all()


def test_a_model_from_a_transformers_folder_is_skipped_with_the_reason(tmp_path):
    save_gqa_family("llama", tmp_path, 300, seed=1)
    assert "transformers folder" in gguf_serving_blocker(load_model(tmp_path))


def _table(prefill: tuple[tuple[float, float, float], ...], ppl: tuple[float, ...]) -> pd.DataFrame:
    """A hand-made table: unpruned, uniform and uneven rows at 50% with the given (median, min, max) prefill."""
    rows = []
    for (shape, removed, arch, padded), (rate, lo, hi), p in zip(
            (("unpruned", 0, "llama", 0), ("uniform", 6, "llama", 0), ("uneven", 6, "deci", 2)), prefill, ppl,
            strict=True):
        rows.append({"fraction": 0.0 if shape == "unpruned" else 0.5, "shape": shape, "removed": removed,
                     "query_heads": 12 - removed, "arch": arch, "padded_heads": padded, "gguf_type": "q8_0",
                     "file_bytes": 4 * 2**20 - removed * 2**16, "kv_bytes_per_token": 192 - removed * 8,
                     "ppl": p, "headprune_ppl": p - 0.01, "prefill_tokens_per_s": rate,
                     "prefill_tokens_per_s_min": lo, "prefill_tokens_per_s_max": hi, "decode_tokens_per_s": 50.0,
                     "decode_tokens_per_s_min": 45.0, "decode_tokens_per_s_max": 55.0})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("prefill, verdict", [
    (((100.0, 90.0, 110.0), (130.0, 120.0, 140.0), (105.0, 95.0, 115.0)), ["faster", "within the spread"]),
    (((100.0, 90.0, 110.0), (80.0, 70.0, 89.0), (111.0, 109.0, 130.0)), ["slower", "within the spread"]),
])
def test_a_rate_is_faster_or_slower_only_where_the_spreads_separate(prefill, verdict):
    table = _table(prefill, (20.0, 25.0, 22.0))
    sentences = gguf_serving_findings(table, "x@layer")
    for sentence, row, said in zip(sentences[1:3], table.iloc[1:].itertuples(), verdict, strict=True):
        ratio = row.prefill_tokens_per_s / prefill[0][0]
        assert f"prefill ×{ratio:.2f}" in sentence
        if said == "within the spread":
            assert "prefill" in sentence and "within the spread of the repeats" in sentence.split("; decode")[0]
        else:
            assert f"({said}: the repeats' spreads separate)" in sentence.split("; decode")[0]
        assert f"{row.file_bytes / table['file_bytes'][0]:.0%} of the unpruned one" in sentence
        assert f"KV cache {row.kv_bytes_per_token / 192:.0%}" in sentence
    assert "decode ×1.00, within the spread" not in sentences[1]  # decode's spreads overlap: no verdict word
    assert "decode ×1.00 (within the spread of the repeats: no measured difference)" in sentences[1]
    lower = "uneven" if table["ppl"][2] < table["ppl"][1] else "uniform"
    assert sentences[-1].endswith(f"the {lower} prune is lower.")
    assert re.search(r"2 zero-weight query heads", sentences[2])


def test_the_section_reads_back_and_refuses_a_foreign_table(tmp_path):
    table = _table(((100.0, 90.0, 110.0),) * 3, (20.0, 25.0, 22.0))
    table.to_csv(tmp_path / "serving_llama_cpp.csv", index=False)
    back = read_gguf_serving_file(tmp_path)
    section = gguf_serving_parts(back, {"serving_llama_cpp": {"ranking": "x", "workload": {"prompt": 16},
                                                              "refused": ["uneven at 50%: why"]}})
    shown = next(b for b in section.blocks if isinstance(b, Table)).df
    assert shown["prefill tok/s"].tolist() == ["100 (90–110)"] * 3 and shown["file MiB"][0] == "4.0"
    assert "Not exported: uneven at 50%: why." in next(b for b in section.blocks if isinstance(b, Note)).text
    assert len(next(b for b in section.blocks if isinstance(b, Findings)).sentences) == 4
    table.drop(columns=["ppl"]).to_csv(tmp_path / "serving_llama_cpp.csv", index=False)
    from headprune.errors import HeadpruneError

    with pytest.raises(HeadpruneError, match="not a llama.cpp serving table .lacks ppl"):
        read_gguf_serving_file(tmp_path)


@pytest.mark.slow
def test_run_on_a_gguf_model_serves_its_prunes_in_llama_cpp(tiny_gguf, corpus, tmp_path):
    """``headprune run`` on a model read from a GGUF file: the report's llama.cpp section beside transformers', its
    table read back by ``headprune report`` to the same summary."""
    import json
    import subprocess
    import sys

    from headprune.cli import main

    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "headprune", "run", "--model", str(tiny_gguf), "--data",
                           str(corpus), "--score-data", str(corpus), "--max-tokens", "256", "--seq-len", "32",
                           "--seeds", "2", "--bootstrap", "40", "--fractions", "0,0.5", "--methods", "wo_fro,abl_zero",
                           "--out", str(out), "--quiet"], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pd.read_csv(out / "serving_llama_cpp.csv")
    assert table["shape"].tolist() == ["unpruned", "uniform", "uneven", "uniform", "uneven"]
    assert table["fraction"].tolist() == [0, 0.25, 0.25, 0.5, 0.5] and set(table["gguf_type"]) == {"q8_0"}
    curves = pd.read_csv(out / "curves.csv")
    assert table["headprune_ppl"][0] == pytest.approx(curves[curves["fraction"] == 0]["ppl"].iloc[0], rel=1e-9)
    assert (abs(np.log(table["ppl"] / table["headprune_ppl"])) < 0.05).all()  # q8_0 against float32
    settings = json.loads((out / "settings.json").read_text())
    assert settings["serving_llama_cpp"]["ranking"] == settings["commands"]["ranking"]
    summary = (out / "summary.md").read_text()
    assert "Serving the pruned model in llama.cpp" in summary and "Serving the pruned model in stock" in summary
    rebuilt = tmp_path / "rebuilt"
    assert main(["report", "--scores", str(out / "scores.csv"), "--curves", str(out / "curves.csv"),
                 "--out", str(rebuilt)]) == 0
    assert (rebuilt / "summary.md").read_text() == summary
