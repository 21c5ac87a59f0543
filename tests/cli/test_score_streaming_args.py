"""``score --sink S --window W``: the context scores of the command equal the library's with the same streaming
heads (and differ from the defaults'), and a window that covers the whole context is one line."""

from __future__ import annotations

import numpy as np

from headprune.cli.main import main
from headprune.data.tokens import corpus_ids
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.io.work.files import read_table
from headprune.perplexity import Windowing
from headprune.scoring import ScoringOptions, score_heads

WINDOW = ["--seq-len", "32", "--max-tokens", "128", "--methods", "ctx_stream", "--bootstrap", "0", "--quiet"]


def test_sink_and_window_reach_the_context_scores(tiny_dir, corpus, tmp_path):
    out = tmp_path / "s.csv"
    assert main(["score", "--model", str(tiny_dir), "--data", str(corpus), *WINDOW, "--sink", "2", "--window", "8",
                 "--out", str(out)]) == 0
    model = load_model(tiny_dir)
    ids = corpus_ids(str(corpus), "validation", model_tokenizer(model), 128)
    w = Windowing.resolve(model.cfg.n_positions, 32)

    def library(sink: int, recent: int) -> np.ndarray:
        options = ScoringOptions(bootstrap=0, stream_sink=sink, stream_recent=recent)
        return score_heads(model, ids, ["ctx_stream"], windowing=w, options=options,
                           show_progress=False).table["ctx_stream"].to_numpy()

    got = read_table(out)["ctx_stream"].to_numpy()
    np.testing.assert_allclose(got, library(2, 8), rtol=0, atol=1e-12)
    assert np.abs(got - library(4, 16)).max() > 1e-6  # another streaming head: other scores


def test_a_window_covering_the_context_is_one_line(tiny_dir, corpus, tmp_path, capsys):
    code = main(["score", "--model", str(tiny_dir), "--data", str(corpus), *WINDOW, "--sink", "4", "--window", "28",
                 "--out", str(tmp_path / "s.csv")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "sink 4 + window 28 cover the whole context of 32 tokens" in err and "--window" in err
    assert not (tmp_path / "s.csv").exists()
