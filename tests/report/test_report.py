"""The report: files, tables, self-contained HTML, predictiveness against independent formulas, CLI helpers."""

from __future__ import annotations

import base64
import json
import math
import shutil
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import headprune.report as report_module
from headprune.errors import HeadpruneError
from headprune.io.work.files import read_scores, read_table
from headprune.report import build_report, rebuild_report
from headprune.report.choice import best_method
from headprune.report.plots.common import head_grid
from headprune.report.predictiveness import PREDICTIVENESS_COLUMNS, predictiveness
from headprune.report.render import make_content
from headprune.report.tables import summary_table, top_heads_mask
from headprune.schema import CURVE_COLUMNS, CURVE_HALVES, METHOD_UNITS
from headprune.schema import ID_COLUMNS as SCORE_COLUMNS
from headprune.table_checks import check_curves, check_scores

from report_tables import (
    BASELINE,
    FRACTIONS,
    METHODS,
    PNG,
    SETTINGS,
    auc_by_ranks,
    curve_row,
    make_curves,
    make_scores,
)


def pictures_for(methods):
    return ({"curves.png", "curves_phone.png", "curves_all.png", "curves_all_phone.png", "rank_correlation.png",
             "rank_correlation_phone.png", "pruning_order.png", "pruning_order_phone.png", "heatmaps.png"}
            | ({"scatters.png", "scatters_phone.png"} if "abl_zero" in methods and len(set(methods) - {"abl_zero"})
               else set()))


TABLES = {"scores.parquet", "scores.csv", "curves.parquet", "curves.csv", "predictiveness.csv", "summary.md",
          "report.html", "settings.json", "baseline.json"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    html_path = build_report(make_scores(), make_curves(), out, settings=SETTINGS, baseline=BASELINE)
    return out, html_path


def no_temporaries(folder):
    return not [p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".")]


def test_every_file_written_and_nothing_half_written(report):
    out, html_path = report
    assert html_path == out / "report.html"
    assert {p.name for p in out.iterdir()} == TABLES | pictures_for(METHODS)
    assert no_temporaries(out)
    for name in pictures_for(METHODS):
        assert (out / name).read_bytes().startswith(PNG)


def test_tables_have_documented_columns(report):
    out, _ = report
    for name in ("scores.parquet", "scores.csv"):
        assert list(read_table(out / name).columns) == [*SCORE_COLUMNS, *METHODS]
    for name in ("curves.parquet", "curves.csv"):
        curves = read_table(out / name)
        # made-up curves without the halves: written without them (a run's have them: test_end_to_end)
        assert list(curves.columns) == [c for c in CURVE_COLUMNS if c not in CURVE_HALVES]
        assert len(curves) == len(make_curves())
    pred = read_table(out / "predictiveness.csv")
    assert list(pred.columns) == list(PREDICTIVENESS_COLUMNS)
    assert list(pred["method"]) == [m for m in METHODS if m != "abl_zero"]
    assert dict(zip(pred["method"], pred["kind"]))["entropy"] == "description"
    assert json.loads((out / "settings.json").read_text()) == SETTINGS
    assert read_scores(out / "scores.csv")["model_fingerprint"].eq("0123456789").all()  # not the int 123456789


class Page(HTMLParser):
    VOID = frozenset({"meta", "img", "br", "hr", "link", "input", "source", "wbr"})

    def __init__(self):
        super().__init__()
        self.stack, self.images, self.tags, self.errors = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)


def test_html_is_self_contained_and_well_formed(report):
    out, html_path = report
    text = html_path.read_text()
    page = Page()
    page.feed(text)
    page.close()
    assert text.startswith("<!DOCTYPE html>") and not page.errors and not page.stack
    assert page.tags.count("script") == 1 and "<script>" in text and "src=" not in text.split("<script>")[1]
    assert "link" not in page.tags and "http" not in text
    prefix = "data:image/png;base64,"
    # inline SVG; <source>
    shown = {p for p in pictures_for(METHODS) if not p.endswith("_phone.png")} - {"heatmaps.png"}
    assert {img["alt"] for img in page.images} == shown
    for img in page.images:
        assert img["src"].startswith(prefix)
        data = base64.b64decode(img["src"][len(prefix):], validate=True)
        assert data.startswith(PNG) and data == (out / img["alt"]).read_bytes()
    for needle in ("corpus-A:train", "corpus-B:test", "L0H0", "ppl@30%", "roc_auc_top10", "Best method"):
        assert needle in text


def test_heatmaps_on_the_page_give_every_heads_value_and_rank_on_hover(report):
    import re

    from scipy.stats import rankdata

    out, html_path = report
    text = html_path.read_text()
    scores = make_scores()
    titles = re.findall(r"<rect [^>]*><title>([^<]*)</title></rect>", text)
    assert len(titles) == len(METHODS) * len(scores)
    for method in METHODS:
        values = scores[method].to_numpy(float)
        ok = np.isfinite(values)
        ranks = dict(zip(scores["head_id"][ok], rankdata(-values[ok], method="average")))
        for row in scores.itertuples():
            value = getattr(row, method)
            want = (f"{row.head_id} {method} = {value:.4g} {METHOD_UNITS[method]}; rank {ranks[row.head_id]:g} of "
                    f"{len(scores)}" if row.head_id in ranks else f"{row.head_id}: no score")
            assert want in titles
    assert (out / "heatmaps.png").read_bytes().startswith(PNG)


def test_score_intervals_show_on_hover_and_as_scatter_bars():
    """A scores table with bootstrap columns: every heatmap cell's hover names the head's interval, and the
    scatter's bars reach exactly from the interval's low to its high end (hand-computed offsets)."""
    from headprune.report.plots.maps import error_bars, heatmap_svg, score_interval

    scores = make_scores()
    width = np.linspace(0.01, 0.2, len(scores))
    scores["abl_zero_ci_lo"], scores["abl_zero_ci_hi"] = scores.abl_zero - width, scores.abl_zero + 2 * width
    scores.loc[3, "abl_zero_ci_lo"] = np.nan  # a head whose interval could not be drawn
    svg = heatmap_svg(scores, "abl_zero")
    row = scores.iloc[0]
    assert f"(95% CI {row.abl_zero_ci_lo:.4g} to {row.abl_zero_ci_hi:.4g})" in svg
    assert svg.count("95% CI") == len(scores) - 1
    bars = error_bars(scores.abl_zero.to_numpy(float), score_interval(scores, "abl_zero"))
    np.testing.assert_allclose(bars[0], np.where(np.arange(len(scores)) == 3, 0.0, width), atol=1e-12)
    np.testing.assert_allclose(bars[1], 2 * width, atol=1e-12)
    assert score_interval(scores, "taylor") is None and error_bars(scores.taylor.to_numpy(float), None) is None
    assert "95% CI" not in heatmap_svg(scores, "taylor")


def test_summary_markdown_says_data_baseline_best_and_top_heads(report):
    out, _ = report
    text = (out / "summary.md").read_text()
    assert "**Heads scored on**: corpus-A:train" in text
    assert "**Curves (perplexity) measured on**: corpus-B:test" in text
    assert f"perplexity {math.exp(3.0):.4g}" in text
    assert "**Best method**: taylor " in text
    assert "10% read at 8.3%" in text and "30% read at 25.0%" in text
    scores = make_scores()
    top = scores.sort_values("abl_zero", ascending=False)["head_id"].head(10)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "| L" in line]
    assert [line.split(" | ")[1] for line in rows] == list(top)


def tau_b_by_pairs(x, y):
    conc = disc = tie_x = tie_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            conc += dx * dy > 0
            disc += dx * dy < 0
            tie_x += dx == 0 and dy != 0
            tie_y += dy == 0 and dx != 0
    return (conc - disc) / math.sqrt((conc + disc + tie_x) * (conc + disc + tie_y))


def test_predictiveness_equals_independent_computations():
    scores = make_scores(layers=4, heads=5, seed=3)  # 20 heads: 2 positives
    scores.loc[7, "wo_fro"] = scores.loc[8, "wo_fro"]  # a tie in a score
    pred = predictiveness(scores).set_index("method")
    truth = scores["abl_zero"].to_numpy()
    positive = np.zeros(len(truth), bool)
    positive[np.argsort(-truth)[:2]] = True
    for method in ("wo_fro", "entropy", "taylor", "abl_mean"):
        x = scores[method].to_numpy()
        ok = np.isfinite(x)
        row = pred.loc[method]
        assert row["n"] == ok.sum()
        assert row["r2"] == pytest.approx(np.corrcoef(x[ok], truth[ok])[0, 1] ** 2, abs=1e-12)
        rho = np.corrcoef(stats.rankdata(x[ok]), stats.rankdata(truth[ok]))[0, 1]
        assert row["spearman_rho"] == pytest.approx(rho, abs=1e-12)
        assert row["kendall_tau"] == pytest.approx(tau_b_by_pairs(x[ok], truth[ok]), abs=1e-12)
        assert row["roc_auc_top10"] == pytest.approx(auc_by_ranks(x[ok], positive[ok]), abs=1e-12)
    assert pred.loc["entropy", "kind"] == "description" and pred.loc["taylor", "kind"] == "importance"


def test_top_heads_ceil_and_deterministic_ties():
    scores = make_scores(methods=["abl_zero"])  # 12 heads: ceil(1.2) = 2 positives
    scores["abl_zero"] = 1.0
    scores.loc[scores.head_id == "L2H3", "abl_zero"] = 5.0
    scores.loc[scores.head_id.isin(["L1H0", "L0H1"]), "abl_zero"] = 4.0  # tie at the cut: smaller layer wins
    assert list(scores.loc[top_heads_mask(scores), "head_id"]) == ["L0H1", "L2H3"]
    thirty = make_scores(layers=5, heads=6, methods=["abl_zero"])  # 0.1 * 30 is 3.0000000000000004 in floats
    assert top_heads_mask(thirty).sum() == 3


def test_auc_nan_with_one_class_and_no_truth_skips():
    one = make_scores(layers=1, heads=1)
    assert predictiveness(one)[["r2", "spearman_rho", "kendall_tau", "roc_auc_top10"]].isna().all().all()
    scores = make_scores(methods=["wo_fro", "abl_zero"])
    scores.loc[~top_heads_mask(scores), "wo_fro"] = np.nan  # only positives keep a score: refused (issue 26)
    with pytest.raises(HeadpruneError, match="must be a finite number"):
        predictiveness(scores)
    empty = predictiveness(make_scores(methods=["wo_fro", "entropy"]))
    assert empty.empty and list(empty.columns) == list(PREDICTIVENESS_COLUMNS)


def test_report_without_abl_zero(tmp_path):
    methods = ["wo_fro", "taylor"]
    build_report(make_scores(methods=methods), make_curves(), tmp_path, settings={}, baseline=BASELINE)
    assert {p.name for p in tmp_path.iterdir()} == TABLES | pictures_for(methods)
    assert not any(p.name.startswith("scatters") for p in tmp_path.iterdir())
    assert list(pd.read_csv(tmp_path / "predictiveness.csv").columns) == list(PREDICTIVENESS_COLUMNS)
    text = (tmp_path / "summary.md").read_text()
    assert "no abl_zero column" in text and "**Heads scored on**: not recorded in settings" in text


def test_best_method_ignores_random_compensation_and_large_fractions():
    assert best_method(make_curves()) == "taylor"
    curves = make_curves()
    curves.loc[curves.method == "random", "delta_nll"] = -1.0  # random never counts
    curves = pd.concat([curves, pd.DataFrame([curve_row("wo_fro", "mean", f, 0.0) for f in FRACTIONS])])
    curves.loc[(curves.method == "abl_mean") & (curves.fraction > 0.5), "delta_nll"] = -100.0
    curves = pd.concat([curves, pd.DataFrame([curve_row("abl_mean", "none", 0.75, -100.0)])])
    assert best_method(curves) == "taylor"
    curves.loc[(curves.method == "abl_mean") & (curves.fraction == 0.25), "delta_nll"] = -1.0
    assert best_method(curves) == "abl_mean"
    with pytest.raises(HeadpruneError, match="no non-random method"):
        best_method(make_curves().query("method == 'random'"))


def test_summary_table_values_are_curve_rows():
    curves = make_curves()
    table = summary_table(curves)
    assert list(table.columns) == ["method", "compensation", "ppl@10%", "ppl@30%", "ppl@50%"]
    assert list(zip(table.method, table.compensation)) == [
        ("wo_fro", "none"), ("taylor", "none"), ("taylor", "mean"), ("abl_mean", "none"), ("random", "none")]
    for row in table.itertuples(index=False):
        at = curves[(curves.method == row.method) & (curves.compensation == row.compensation)].set_index("fraction")
        assert list(row[2:]) == [at.loc[1 / 12, "ppl"], at.loc[3 / 12, "ppl"], at.loc[6 / 12, "ppl"]]
    even = pd.DataFrame([curve_row("taylor", "none", f, f) for f in (0.2, 0.4, 0.6)])
    assert summary_table(even)["ppl@30%"].iloc[0] == even.loc[0, "ppl"]  # equally near: the smaller fraction


def test_head_grid_has_nan_for_missing_heads():
    scores = make_scores()
    scores = scores[scores.head_id != "L1H2"]
    grid = head_grid(scores, "abl_zero")
    assert grid.shape == (3, 4) and math.isnan(grid.loc[1, 2])
    assert grid.loc[2, 3] == scores.loc[scores.head_id == "L2H3", "abl_zero"].item()


@pytest.mark.parametrize("table, drop", [("scores", "head_id"), ("scores", "layer"), ("curves", "ppl_std"),
                                         ("curves", "delta_nll")])
def test_missing_columns_raise_and_write_nothing(tmp_path, table, drop):
    scores, curves = make_scores(), make_curves()
    if table == "scores":
        scores = scores.drop(columns=[drop, "model_fingerprint"])
    else:
        curves = curves.drop(columns=[drop, "n_seeds"])
    with pytest.raises(HeadpruneError, match=f"{table} table lacks column.*{drop}") as err:
        build_report(scores, curves, tmp_path / "out", settings=SETTINGS, baseline=BASELINE)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit, message", [
    (lambda s, c: (s.drop(columns=METHODS), c), "no method column"),
    (lambda s, c: (pd.concat([s, s.iloc[:1]]), c), "L0H0 more than once"),
    (lambda s, c: (s.assign(model_fingerprint=["a", "b"] * 6), c), "mixes 2 models"),
    (lambda s, c: (s.assign(head_id="L9H9"), c), "does not match"),
    (lambda s, c: (s.assign(taylor="x"), c), "taylor must hold numbers"),
    (lambda s, c: (s, c.assign(compensation="median")), "'median'"),
    (lambda s, c: (s, pd.concat([c, c.iloc[:1]])), "two rows for taylor/none at fraction 0.0"),
    (lambda s, c: (s, c.iloc[:0]), "curves table has no rows"),
])
def test_bad_inputs_raise_one_line_errors(tmp_path, edit, message):
    scores, curves = edit(make_scores(), make_curves())
    with pytest.raises(HeadpruneError, match=message) as err:
        build_report(scores, curves, tmp_path, settings=SETTINGS, baseline=BASELINE)
    assert "\n" not in str(err.value) and not list(tmp_path.iterdir())


@pytest.mark.parametrize("baseline", [{}, {"nll": "x", "ppl": 3.0}, {"ppl": 0.0}, None])
def test_bad_baseline_raises(tmp_path, baseline):
    with pytest.raises(HeadpruneError, match="baseline"):
        build_report(make_scores(), make_curves(), tmp_path, settings=SETTINGS, baseline=baseline)


def test_same_scoring_and_evaluation_data_is_flagged():
    settings = {"score_data": "corpus-A:test", "eval_data": "corpus-A:test"}
    content = make_content(check_scores(make_scores()), check_curves(make_curves()), settings, BASELINE)
    assert any("in-sample" in note for note in content.notes)
    assert ("Heads scored on", "corpus-A:test") in content.facts


def test_rebuild_reads_tables_settings_and_baseline_beside_scores(report, tmp_path, monkeypatch):
    out, _ = report
    seen = {}
    monkeypatch.setattr(report_module, "build_report", lambda *args, **kw: seen.setdefault("args", (args, kw)))
    rebuild_report(out / "scores.parquet", out / "curves.parquet", tmp_path, "rank")
    (scores, curves, out_dir), given = seen["args"]
    settings, baseline, extra, scale = given["settings"], given["baseline"], given["extra"], given["scale"]
    anatomy, patching, serving = extra.anatomy, extra.patching, extra.serving
    assert anatomy is None and patching is None and serving is None and scale == "rank"  # none in the folder
    pd.testing.assert_frame_equal(scores, read_table(out / "scores.parquet"))
    pd.testing.assert_frame_equal(curves, read_table(out / "curves.parquet"))
    assert out_dir == tmp_path and settings == SETTINGS and baseline == BASELINE


def test_run_report_command_from_bare_csv_derives_baseline(report, tmp_path):
    out, _ = report
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("scores.csv", "curves.csv"):
        shutil.copy(out / name, bare / name)
    html_path = rebuild_report(bare / "scores.csv", bare / "curves.csv", tmp_path / "rebuilt")
    assert html_path.is_file() and no_temporaries(tmp_path / "rebuilt")
    baseline = json.loads((tmp_path / "rebuilt" / "baseline.json").read_text())
    assert baseline == {"tokens": None, "nll": 3.0, "ppl": pytest.approx(math.exp(3.0))}
    assert json.loads((tmp_path / "rebuilt" / "settings.json").read_text()) == {}
    assert "fingerprint 0123456789" in (tmp_path / "rebuilt" / "summary.md").read_text()
    with pytest.raises(HeadpruneError, match="does not exist"):
        rebuild_report(bare / "missing.csv", bare / "curves.csv", tmp_path / "x")


def test_layer_normalized_rankings_get_their_own_small_multiples(tmp_path):
    """<method>@layer curves: kept out of curves.png's lines, drawn beside their global ranking in
    curves_layer_normalized.png, and linked from the curves section of the page."""
    curves = make_curves()
    normalized = curves[curves["method"] == "wo_fro"].assign(method="wo_fro@layer")
    html_path = build_report(make_scores(), pd.concat([curves, normalized], ignore_index=True), tmp_path,
                             settings=SETTINGS, baseline=BASELINE)
    assert (tmp_path / "curves_layer_normalized.png").read_bytes().startswith(PNG)
    html = html_path.read_text()
    assert html.index('alt="curves_layer_normalized.png"') < html.index('alt="pruning_order.png"')
    assert "wo_fro@layer" in (tmp_path / "summary.md").read_text()


def test_rank_scale_report_and_a_bad_scale(tmp_path):
    from headprune.report.plots.common import display_exponent, importance_rank
    from headprune.report.plots.scatters import layer_groups

    assert importance_rank(np.array([0.3, np.nan, 0.1, 0.3])).tolist()[::2] == [1.5, 3.0]
    assert display_exponent(np.array([0.0118, -0.002])) == -2 and display_exponent(np.array([3.0])) == 0
    assert display_exponent(np.array([250.0, np.nan])) == 2
    assert [g[0] for g in layer_groups(6)] == [f"L{i}" for i in range(6)]
    assert [g[0] for g in layer_groups(48)][:2] == ["L0-3", "L4-7"] and len(layer_groups(48)) == 12
    build_report(make_scores(), make_curves(), tmp_path / "rank", settings=SETTINGS, baseline=BASELINE,
                 scale="rank")
    assert (tmp_path / "rank" / "heatmaps.png").read_bytes().startswith(PNG)
    with pytest.raises(HeadpruneError, match="scale 'log' must be one of value, rank"):
        build_report(make_scores(), make_curves(), tmp_path / "bad", settings=SETTINGS, baseline=BASELINE,
                     scale="log")
    assert not (tmp_path / "bad").exists()
