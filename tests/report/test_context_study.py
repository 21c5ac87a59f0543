"""The committed context studies (reports/<model>/context/): every sentence of summary.md and study.md recomputed from
the tables they cite (the study's KV-head table rebuilt here from the query-head tables by another path)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from context_claims import check_summary
from scipy.stats import spearmanr

from headprune.io.work.files import read_table
from headprune.stages.context import load_context

REPORTS = Path(__file__).resolve().parents[2] / "reports"
STUDIES = [p.parents[1] for p in sorted(REPORTS.glob("*/context/summary.md"))]


def kv_heads(run: Path) -> pd.DataFrame:
    """Per KV head: ctx_stream and its interval, the cheap scores, induction and abl_zero (the largest over its
    query heads), from the tables, query heads grouped by their ctx_stream's group (equal within a KV group)."""
    result = load_context(run / "context")
    q = result.scores.set_index("head_id")
    q = q.join(read_table(run / "anatomy.csv").set_index("head_id")[["induction"]])
    q = q.join(read_table(run / "scores.csv").set_index("head_id")[["abl_zero"]])
    per_layer = result.settings["n_kv_heads"] // q.layer.nunique()
    heads = q.groupby("layer")["head"].transform("count")
    q["kv"] = q["head"] * per_layer // heads
    return q.groupby(["layer", "kv"]).max(numeric_only=True).reset_index()


@pytest.mark.parametrize("folder", STUDIES, ids=[p.name for p in STUDIES])
def test_summary_sentences(folder):
    assert check_summary(folder / "context") >= 12


@pytest.mark.parametrize("folder", STUDIES, ids=[p.name for p in STUDIES])
def test_study_sentences(folder):
    text = (folder / "context" / "study.md").read_text()
    kv = kv_heads(folder)
    # the 5 KV heads that cost most, with their ctx_stream and interval
    named = re.findall(r"- L(\d+)G(\d+): ctx_stream ([+-][\d.]+) \[([+-][\d.]+), ([+-][\d.]+)\] nats/token; "
                       r"induction rank (\d+), abl_zero rank (\d+) of (\d+)", text)
    top = kv.sort_values("ctx_stream", ascending=False).head(5)
    assert [(int(a), int(b)) for a, b, *_ in named] == list(zip(top.layer, top.kv))
    for (_, _, value, lo, hi, ind, abl, n), r in zip(named, top.itertuples()):
        assert (value, lo, hi) == (f"{r.ctx_stream:+.4f}", f"{r.ctx_stream_ci_lo:+.4f}", f"{r.ctx_stream_ci_hi:+.4f}")
        assert int(ind) == int((kv.induction > r.induction).sum() + 1)  # no ties among these scores
        assert int(abl) == int((kv.abl_zero > r.abl_zero).sum() + 1) and int(n) == len(kv)
    certified = re.search(r"(\d+) of (\d+) KV heads cost NLL when streaming", text)
    assert certified and int(certified[1]) == int((kv.ctx_stream_ci_lo > 0).sum())
    # rank correlations (points) and the top-5 overlaps
    for other in ("induction", "abl_zero", "ctx_gate", "ctx_retrieval"):
        rho = re.search(rf"{other}\b[^\n]*?Spearman ρ (?:with ctx_stream )?([+-][\d.]+) \[", text)
        assert rho and rho[1] == f"{spearmanr(kv.ctx_stream, kv[other]).statistic:+.2f}", other
    for other in ("induction", "abl_zero"):
        both = re.search(rf"against {other} [^\n]*?(\d+) of the top 5 in both", text)
        expected = set(zip(top.layer, top.kv)) & set(zip(*kv.sort_values(other, ascending=False).head(5)[
            ["layer", "kv"]].to_numpy().T))
        assert both and int(both[1]) == len(expected)
    # what streams within each tolerance, and the bytes it saves
    result = load_context(folder / "context")
    curve, shares = result.curve, result.shares
    full = curve[curve.n_streaming == 0].iloc[0]
    task, prompts = result.settings["task"], result.settings["n_prompts"]
    alone = f" of the {task} accuracy alone"
    assert len(re.findall(r"^- within \d+%: ", text, re.MULTILINE)) == shares.tolerance.nunique()
    assert len(re.findall(rf"^- within \d+%{alone}: ", text, re.MULTILINE)) == shares.tolerance.nunique() * (
        prompts > 0)
    if prompts:
        assert f"The full model gets {task} right on {full.accuracy:.0%} of {prompts} prompts" in text
    for measure, label in (("all", ""), ("accuracy", alone)):
        for tol in shares.tolerance.unique():
            best = shares[(shares.tolerance == tol) & (shares.measure == measure)
                          & shares.ranking.isin(result.settings["methods"])].share.max()
            assert (f"- within {tol:.0%}{label}: no score's order streams" in text) == (best == 0)
    for tol, label, ranking, share, before, after, less in re.findall(
            rf"within (\d+)%({alone})?: (\w+) streams (\d+)% [^\n]*?cache at 8,192 tokens ([\d,.]+) → ([\d,.]+) "
            r"MiB \((\d+)% less\)", text):
        rows = shares[(shares.tolerance.round(2) == int(tol) / 100) & shares.ranking.isin(result.settings["methods"])
                      & (shares.measure == ("accuracy" if label else "all"))]
        assert f"{rows.share.max():.0%}" == f"{share}%"
        row = rows[rows.ranking == ranking].iloc[0]
        point = curve[(curve.ranking == ranking) & (curve.n_streaming == row.n_streaming)].iloc[0]
        assert (before, after) == (f"{full.kv_bytes_8192 / 2**20:,.1f}", f"{point.kv_bytes_8192 / 2**20:,.1f}")
        assert f"{1 - point.kv_bytes_8192 / full.kv_bytes_8192:.0%}" == f"{less}%"


@pytest.mark.parametrize("folder", STUDIES, ids=[p.name for p in STUDIES])
def test_the_run_report_shows_the_context_section(folder):
    """The run's report (headprune report over the run's folder) holds the section: each ranking's largest share
    within each tolerance, as streaming_shares.csv has it, and the summary's sentences."""
    from headprune.report.context_section import SECTION_TITLE, read_context_section
    from headprune.report.render import Table

    section = read_context_section(folder)
    assert section is not None and section.title == SECTION_TITLE
    table = next(b for b in section.blocks if isinstance(b, Table)).df.set_index("ranking")
    shares = load_context(folder / "context").shares
    assert len(table) == shares.ranking.nunique()
    shown = shares[shares.measure != "perplexity"]
    assert table.shape[1] == len(shown.groupby(["measure", "tolerance"]))
    for r in shown.itertuples():
        cell = f"{r.share:.0%} [{r.share_lo:.0%}, {r.share_hi:.0%}]"
        column = f"within {r.tolerance:.0%}" + ("" if r.measure == "all" else ", accuracy alone")
        assert table.loc[r.ranking, column] == cell
    report = (folder / "summary.md").read_text()
    assert f"## {SECTION_TITLE}" in report
    context_summary = (folder / "context" / "summary.md").read_text()
    for line in context_summary.splitlines()[1:]:
        if line.strip() and not line.startswith(("- ", "Largest share")):
            assert line in report


def test_a_run_without_the_context_study_says_how_to_measure_it_where_the_context_is_long(tmp_path):
    """No context/ folder: a model whose context holds at least the default window of 1,024 tokens gets the
    section with the command that fills it; a shorter context (the shipped model's 256) or settings without the
    context's length (tables written before it was recorded) get none."""
    from headprune.report.context_section import SECTION_TITLE, read_context_section
    from headprune.report.render import Paragraph

    settings = {"model": "smollm2-135m-instruct", "out": "runs/smol", "context_tokens": 8192}
    section = read_context_section(tmp_path, settings)
    assert section is not None and section.title == SECTION_TITLE
    (text,) = [b.text for b in section.blocks if isinstance(b, Paragraph)]
    assert text.startswith("This model's context holds 8,192 tokens")
    assert "`headprune context --model smollm2-135m-instruct --out runs/smol/context`" in text
    assert read_context_section(tmp_path, settings | {"context_tokens": 1024}) is not None
    assert read_context_section(tmp_path, settings | {"context_tokens": 1023}) is None
    assert read_context_section(tmp_path, {"model": "m", "out": "o"}) is None
    assert read_context_section(tmp_path) is None
