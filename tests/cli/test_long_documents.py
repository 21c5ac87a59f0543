"""``run``'s long-documents stage on a model whose context holds 1,024 tokens (a random Llama): each length's
perplexity against transformers on the same windows, the report's section and its sentences from the tables,
``headprune long`` on the finished folder giving the same tables, and bad input in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from headprune.cli.main import main
from headprune.report.window_length_section import length_sentence, rank_sentence
from tests.cli.test_families_cli import save_tokenizer
from tests.helpers import save_gqa_family, write_corpus

RUN_LEN = 32


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long-llama")
    corpus = write_corpus(tmp_path_factory.mktemp("corpus") / "c.txt")
    hf = save_gqa_family("llama", folder, vocab=300, seed=3)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 1024  # rotary positions: no table to grow
    (folder / "config.json").write_text(json.dumps(config))
    save_tokenizer(folder, corpus.read_text())
    hf.config.max_position_embeddings = 1024
    return folder, hf, corpus


@pytest.fixture(scope="module")
def finished(long_llama, tmp_path_factory):
    folder, _, corpus = long_llama
    out = tmp_path_factory.mktemp("run") / "report"
    proc = subprocess.run([sys.executable, "-m", "headprune", "run", "--model", str(folder), "--data", str(corpus),
                           "--score-data", str(corpus), "--max-tokens", "256", "--seq-len", str(RUN_LEN), "--seeds",
                           "2", "--bootstrap", "40", "--fractions", "0,0.5", "--patch-task", "none", "--out",
                           str(out)], check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc.stderr


def test_run_measures_each_length_as_transformers_does(long_llama, finished):
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.loading import load_model
    from headprune.io.read.tokenizer import model_tokenizer

    folder, hf, _ = long_llama
    out, log = finished
    assert "long documents: lengths 32, 128, 512 on 8 spans of 512 tokens" in log  # its cost said first
    windows = pd.read_csv(out / "long_windows.csv")
    assert windows["seq_len"].tolist() == [32, 128, 512] and windows["windows"].tolist() == [128, 32, 8]
    ids = corpus_ids("longdocs", "test", model_tokenizer(load_model(folder)), 8 * 512)
    assert len(ids) == 8 * 512
    for r in windows.itertuples():
        total, count = 0.0, 0
        for begin in range(0, len(ids), r.seq_len):
            window = ids[begin:begin + r.seq_len].unsqueeze(0)
            with torch.no_grad():
                logp = torch.log_softmax(hf(window).logits[0, :-1].double(), -1)
            nll = -logp.gather(1, window[0, 1:, None])[:, 0]
            keep = (torch.arange(begin + 1, begin + r.seq_len) % RUN_LEN) != 0  # the targets every length scores
            total, count = total + nll[keep].sum().item(), count + int(keep.sum())
        assert count == r.tokens
        assert r.nll == pytest.approx(total / count, abs=2e-5)
        assert r.ppl_ci_lo <= r.ppl <= r.ppl_ci_hi
    taylor = pd.read_csv(out / "long_taylor.csv")
    assert list(taylor.columns) == ["head_id", "taylor_32", "taylor_128", "taylor_512"] and len(taylor) == 12


def test_the_section_says_what_its_tables_say(finished):
    out, _ = finished
    windows, ranks = pd.read_csv(out / "long_windows.csv"), pd.read_csv(out / "long_ranks.csv")
    summary = (out / "summary.md").read_text()
    assert "## Long documents: what longer windows change" in summary
    assert length_sentence(windows) in summary and rank_sentence(ranks) in summary
    assert ranks["x"].tolist() == ["longdocs, 32", "longdocs, 32", "the run's corpus, 32"]
    first = windows.iloc[0]
    for r in windows.iloc[1:].itertuples():  # each length's change read back from the sentence
        side = "lower" if r.delta_ci_hi < 0 else "higher" if r.delta_ci_lo > 0 else "not told apart"
        assert (f"in windows of {r.seq_len:,}: {r.ppl:.2f} [{r.ppl_ci_lo:.2f}, {r.ppl_ci_hi:.2f}], ΔNLL "
                f"{r.nll - first.nll:+.3f} [{r.delta_ci_lo:+.3f}, {r.delta_ci_hi:+.3f}] nats/token ({side})") in summary
    settings = json.loads((out / "settings.json").read_text())
    assert settings["seconds_long"] > 0


def test_long_on_the_finished_folder_gives_the_same_tables(finished, tmp_path):
    import shutil

    out, _ = finished
    again = tmp_path / "again"
    shutil.copytree(out, again)
    for name in ("long_windows.csv", "long_ranks.csv", "long_taylor.csv"):
        (again / name).unlink()
    assert main(["long", "--out", str(again), "--quiet"]) == 0
    for name in ("long_windows.csv", "long_ranks.csv", "long_taylor.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(again / name), pd.read_csv(out / name), rtol=1e-9, atol=1e-12)
    assert (again / "summary.md").read_text() == (out / "summary.md").read_text()
    assert not (again / ".long-progress.jsonl").exists()


def test_bad_input_is_one_line(tmp_path, capsys):
    import shutil
    from pathlib import Path

    assert main(["long", "--out", str(tmp_path / "nothing")]) != 0
    assert capsys.readouterr().err.strip().count("\n") == 0
    shipped = Path(__file__).resolve().parents[2] / "reports" / "stdlib-gpt2-mini"
    short = tmp_path / "short"
    short.mkdir()
    for name in ("settings.json", "scores.parquet", "curves.parquet"):
        shutil.copy(shipped / name, short / name)
    assert main(["long", "--out", str(short)]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no long-documents stage" in err
    assert sorted(p.name for p in short.iterdir()) == ["curves.parquet", "scores.parquet", "settings.json"]
