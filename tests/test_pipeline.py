"""End to end through the CLI: run, score, prune, curve, report on a tiny model and a small corpus."""

import json
import math
from html.parser import HTMLParser

import pandas as pd
import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.cli import main
from headprune.interventions import mask_gates
from headprune.loading import load_model
from headprune.outputs import read_scores
from headprune.schema import CURVE_COLUMNS, METHODS


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import pydoc_data.topics

    folder = tmp_path_factory.mktemp("corpus")
    (folder / "c.txt").write_text(" ".join(list(pydoc_data.topics.topics.values())[:30])[:12000])
    return folder / "c.txt"


@pytest.fixture(autouse=True)
def token_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))


@pytest.fixture(scope="module")
def run_dir(tiny_dir, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "report"
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))
    code = main(["run", "--model", str(tiny_dir), "--data", str(corpus), "--score-data", str(corpus), "--out", str(out),
                 "--max-tokens", "400", "--fractions", "0,0.25,0.5,0.75", "--seeds", "2", "--quiet"])
    mp.undo()
    assert code == 0
    return out


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs)["src"])


def test_run_writes_every_report_file(run_dir):
    names = {p.name for p in run_dir.iterdir()}
    for name in ["scores.parquet", "scores.csv", "curves.parquet", "curves.csv", "summary.md", "report.html",
                 "curves.png", "rank_correlation.png", "predictiveness.csv", "ledger.txt"]:
        assert name in names
    for m in METHODS:
        assert f"heatmap_{m}.png" in names
        assert m == "abl_zero" or f"scatter_{m}.png" in names
    assert not [n for n in names if n.endswith(".tmp")]


def test_run_tables(run_dir):
    scores = read_scores(run_dir / "scores.parquet")
    assert list(scores.columns) == ["layer", "head", "head_id", "model_fingerprint"] + list(METHODS)
    assert len(scores) == 12 and scores[list(METHODS)].notna().all().all()
    curves = pd.read_parquet(run_dir / "curves.parquet")
    assert list(curves.columns) == CURVE_COLUMNS
    baseline = json.loads((run_dir / "baseline.json").read_text())
    zero = curves[curves.fraction == 0]
    assert (zero.nll == baseline["nll"]).all() and (zero.delta_nll == 0).all()
    assert math.exp(baseline["nll"]) == pytest.approx(baseline["ppl"], rel=1e-12)
    for _, group in curves.groupby(["method", "compensation"]):
        assert group.sort_values("fraction").heads_pruned.is_monotonic_increasing
        assert group.heads_pruned.tolist() == [0, 3, 6, 9]
    assert set(curves.compensation) == {"none", "mean"}
    random = curves[curves.method == "random"]
    assert (random.n_seeds == 2).all() and (random[random.fraction > 0].nll_std > 0).all()
    summary = (run_dir / "summary.md").read_text()
    assert "validation split" in summary and "test split" in summary


def test_run_html_self_contained(run_dir):
    parser = _Images()
    parser.feed((run_dir / "report.html").read_text())
    assert len(parser.srcs) >= 2 * len(METHODS)
    for src in parser.srcs:
        assert src.startswith("data:image/png;base64,")


def test_run_is_resumable_without_recompute(run_dir, tiny_dir, corpus, capsys, monkeypatch):
    """A finished run's progress file answers every unit: rerunning recomputes nothing and gives equal tables."""
    before = pd.read_parquet(run_dir / "curves.parquet")
    from headprune import scoring

    monkeypatch.setattr(scoring.ablation, "ablate_layer", lambda *a, **k: pytest.fail("recomputed"))
    assert main(["run", "--model", str(tiny_dir), "--data", str(corpus), "--score-data", str(corpus), "--out",
                 str(run_dir), "--max-tokens", "400", "--fractions", "0,0.25,0.5,0.75", "--seeds", "2", "--quiet"]) == 0
    pd.testing.assert_frame_equal(before, pd.read_parquet(run_dir / "curves.parquet"))
    capsys.readouterr()
    assert main(["run", "--model", str(tiny_dir), "--data", str(corpus), "--out", str(run_dir), "--max-tokens", "300",
                 "--quiet"]) == 2
    assert "different run" in capsys.readouterr().err


def test_report_rebuilds_from_tables(run_dir, tmp_path):
    assert main(["report", "--scores", str(run_dir / "scores.parquet"), "--curves", str(run_dir / "curves.parquet"),
                 "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.html").is_file()


def test_prune_native_and_hf_exports(run_dir, tiny_dir, corpus, tmp_path, capsys):
    scores = str(run_dir / "scores.parquet")
    args = ["prune", "--model", str(tiny_dir), "--scores", scores, "--method", "abl_zero", "--fraction", "0.5",
            "--data", str(corpus), "--max-tokens", "300", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "native")]) == 0
    out = capsys.readouterr().out
    assert "heads removed (6)" in out and "perplexity on" in out
    # the 6 lowest abl_zero heads, as a hand sort of the table gives them
    table = read_scores(scores).sort_values(["abl_zero", "layer", "head"])
    removed = list(zip(table.layer[:6], table["head"][:6]))
    base = load_model(tiny_dir)
    native = load_model(tmp_path / "native")
    tokens = torch.randint(0, 50257, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        masked = base(tokens, gates=mask_gates(base, removed))
        assert (native(tokens) - masked).abs().max() <= 1e-4
        assert sorted(set(base.head_ids) - set(native.head_ids)) == sorted(removed)
    assert main(args + ["--out", str(tmp_path / "hf"), "--format", "hf"]) == 0
    with torch.no_grad():
        hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
        assert (hf(tokens).logits - masked).abs().max() <= 1e-4


def test_prune_mean_compensated_equals_mean_ablation(tiny_dir, corpus, tmp_path):
    from headprune.cli import data_from_args  # noqa: F401  (the CLI computes the means on --score-data)
    from headprune.corpus import load_texts, tokenize_corpus
    from headprune.interventions import fill_tensors
    from headprune.loading import load_tokenizer
    from headprune.perplexity import Windowing
    from headprune.scoring import head_means

    assert main(["prune", "--model", str(tiny_dir), "--heads", "L0H1,L2H3,L2H0", "--compensate", "mean",
                 "--score-data", str(corpus), "--max-tokens", "300", "--out", str(tmp_path / "m"), "--quiet"]) == 0
    base = load_model(tiny_dir)
    ids = tokenize_corpus(load_texts(str(corpus), "validation"), load_tokenizer(tiny_dir))[:300]
    means = head_means(base, ids, Windowing(64, 64, 8), show_progress=False)
    heads = [(0, 1), (2, 3), (2, 0)]
    tokens = torch.randint(0, 50257, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ablated = base(tokens, gates=mask_gates(base, heads), fills=fill_tensors(base, {h: means[h] for h in heads}))
        assert (load_model(tmp_path / "m")(tokens) - ablated).abs().max() <= 1e-5


def test_iterative_prune(run_dir, tiny_dir, corpus, tmp_path, capsys):
    assert main(["prune", "--model", str(tiny_dir), "--scores", str(run_dir / "scores.parquet"), "--method", "wo_fro",
                 "--count", "5", "--iterative", "3", "--out", str(tmp_path / "it"), "--quiet"]) == 0
    assert len(load_model(tmp_path / "it").head_ids) == 7
    assert "heads removed (5)" in capsys.readouterr().out


def test_curve_command(run_dir, tiny_dir, corpus, tmp_path):
    out = tmp_path / "curves.csv"
    args = ["curve", "--model", str(tiny_dir), "--data", str(corpus), "--scores", str(run_dir / "scores.parquet"),
            "--methods", "wo_fro,taylor", "--fractions", "0,0.5", "--seeds", "2", "--max-tokens", "300", "--quiet",
            "--out", str(out)]
    assert main(args) == 0
    curves = pd.read_csv(out)
    assert list(curves.columns) == CURVE_COLUMNS
    assert curves.method.tolist() == ["wo_fro", "wo_fro", "taylor", "taylor", "random", "random"]
    assert not out.with_name("curves.csv.progress.jsonl").exists()
    assert main(args) == 0  # deterministic: the same seed gives bit-identical curves
    pd.testing.assert_frame_equal(curves, pd.read_csv(out), check_exact=True)
