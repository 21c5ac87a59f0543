"""The report's figures (issue 39, items 3-5): PNGs that record their smallest text, the main curves figure and
every ranking's, patching maps in the unit of their findings, the attention grid's titles clear of the row above,
captions on one line, no "n/a tokens", every figure readable on a 400 px phone."""

from __future__ import annotations

import base64
import io
import itertools
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from headprune.report import build_report, rebuild_report
from headprune.report import patching_section as patching_module
from headprune.report.anatomy import AnatomyReport, Thumbnail, anatomy_parts, one_line, thumbnails_figure
from headprune.report.page import MIN_TEXT_PX, PHONE_CONTENT_PX
from headprune.report.patching_section import EFFECT_UNIT, PatchingReport, patching_parts
from headprune.report.plots.common import render_png, text_scale
from headprune.report.plots.curves import shown_methods
from headprune.report.plots.maps import heatmaps_figure

from report_tables import BASELINE, SETTINGS, make_curves, make_scores


def test_png_records_the_smallest_text_it_shows():
    fig = Figure(figsize=(4, 3))
    ax, hidden = fig.subplots(1, 2)
    ax.set_title("title", fontsize=12)
    ax.tick_params(labelsize=6.5)
    ax.text(0.5, 0.5, "not shown", fontsize=3).set_visible(False)
    hidden.set_title("in a hidden axes", fontsize=2)
    hidden.set_visible(False)
    png = render_png(fig, dpi=90)
    with Image.open(io.BytesIO(png)) as image:
        image.verify()  # the added chunk keeps the PNG valid (CRC checked)
    assert text_scale(png) == {"smallest_pt": 6.5, "dpi": 90}


def patching_table(seed=0):
    rng = np.random.default_rng(seed)
    rows = [{"layer": layer, "head": head, "head_id": f"L{layer}H{head}"} for layer in range(3) for head in range(4)]
    table = pd.DataFrame(rows)
    table["patch_z"] = np.round(rng.uniform(-0.03, 0.15, len(table)), 4)
    table.loc[table["patch_z"].abs() < 0.006, "patch_z"] = 0.05  # no cell that rounds to -0.00 or 0.00
    table["atp_z"] = table["patch_z"] * 0.9
    return table


def test_patching_maps_give_the_fraction_of_the_gap_the_findings_give(monkeypatch):
    figures = []

    def spy(*args, **kwargs):
        figures.append(heatmaps_figure(*args, **kwargs))
        return render_png(figures[-1])

    monkeypatch.setattr(patching_module, "plot_heatmaps", spy)
    table = patching_table()
    info = {"pairs": 8, "task": "brackets", "metric": "logit_diff", "metric_clean": 3.5, "metric_corrupt": -0.7,
            "gap": 4.2, "direction": "denoising"}
    section, _ = patching_parts(PatchingReport(table, info=info), make_scores(3, 4))
    wide = figures[0]  # then the phone version
    for ax, method in zip(wide.axes, ("patch_z", "atp_z")):
        grid = table.pivot(index="layer", columns="head", values=method).to_numpy()
        assert [t.get_text() for t in ax.texts] == [f"{v:.2f}" for v in grid.ravel()]
    labels = [a.get_ylabel() for a in wide.axes if a.get_label() == "<colorbar>"]
    assert labels == [EFFECT_UNIT, EFFECT_UNIT]  # no power of ten left out of the numbers
    top = table.sort_values("patch_z", ascending=False).iloc[0]
    sentence = section.blocks[0].sentences[1]
    assert f"{top['head_id']} ({top['patch_z']:+.2f})" in sentence
    cell = wide.axes[0].texts[int(top["layer"]) * 4 + int(top["head"])].get_text()
    assert f"({top['patch_z']:+.2f})".replace("+", "") == f"({cell})"  # the cell and the sentence: one number


def thumbs(n=9, size=24):
    pattern = np.tril(np.ones((size, size))) / np.arange(1, size + 1)[:, None]
    return [Thumbnail(f"L{i}H0", f"#{i + 1} by abl_zero", "corpus", pattern.tolist()) for i in range(n)]


@pytest.mark.parametrize("phone", [False, True])
def test_attention_grid_titles_clear_of_the_row_above(phone):
    fig = thumbnails_figure(thumbs(), phone)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    shown = [ax for ax in fig.axes if ax.get_visible()]
    rows: dict[float, list] = {}
    for ax in shown:
        rows.setdefault(round(ax.get_position().y0, 3), []).append(ax)
    tops = sorted(rows, reverse=True)
    assert len(tops) >= 2
    for upper, lower in itertools.pairwise(tops):
        lowest_tile = min(ax.get_window_extent(renderer).y0 for ax in rows[upper])
        highest_title = max(ax.title.get_window_extent(renderer).y1 for ax in rows[lower])
        assert highest_title < lowest_tile, "a title sits on the tiles of the row above"


def test_attention_caption_on_one_line():
    heads = make_scores(2, 4, ["abl_zero"])[["layer", "head", "head_id"]].assign(induction=0.1)
    info = {"corpus_text": "the first 32 scoring tokens: 'state.\\n\\nSendfile  syscall'", "probe_text": "probe"}
    _, pics = anatomy_parts(AnatomyReport(heads, pd.DataFrame(), thumbs(2), info), make_scores(2, 4))
    caption = next(p.caption for p in pics if p.name == "anatomy_attention.png")
    assert "\\n" not in caption and "\n" not in caption and "'state. Sendfile syscall'" in caption
    assert one_line("a\n\n b\tc") == "a b c"


def test_a_report_rebuilt_without_a_baseline_leaves_the_token_count_out(tmp_path):
    build_report(make_scores(), make_curves(), tmp_path / "run", settings=SETTINGS, baseline=BASELINE)
    with_baseline = (tmp_path / "run" / "report.html").read_text()
    assert f"{BASELINE['tokens']:,} tokens" in with_baseline
    shutil.copytree(tmp_path / "run", tmp_path / "recipes")
    (tmp_path / "recipes" / "baseline.json").unlink()  # score, curve, report: no baseline file
    rebuilt = rebuild_report(tmp_path / "recipes" / "scores.csv", tmp_path / "recipes" / "curves.csv",
                             tmp_path / "out")
    for text in (rebuilt.read_text(), (tmp_path / "out" / "summary.md").read_text()):
        assert "n/a tokens" not in text and "n/a" not in re.findall(r"Baseline \(unpruned\)[^\n]*", text)[0]
        assert f"perplexity {math.exp(3.0):.4g}, NLL 3 nats/token" in text


def test_main_curves_draw_the_best_three_and_curves_all_every_ranking():
    rows = make_curves()
    extra = rows[rows["method"] == "wo_fro"].assign(method="grad", delta_nll=lambda d: 1.2 * d["fraction"])
    curves = pd.concat([rows, extra, extra.assign(method="wo_fro@layer")], ignore_index=True)
    plain = curves[(curves["compensation"] == "none") & (curves["fraction"] > 0) & (curves["fraction"] <= 0.5)]
    means = plain[plain["method"] != "random"].groupby("method")["delta_nll"].mean()
    global_ = [m for m in means.sort_values().index if "@" not in m]
    assert global_[:3] == ["taylor", "grad", "abl_mean"]  # wo_fro, the worst, is left out
    assert shown_methods(curves, 3) == global_[:3]
    assert shown_methods(curves, 3, keep=("wo_fro@layer",)) == [*global_[:3], "wo_fro@layer"]
    assert set(shown_methods(curves, None)) == {"taylor", "grad", "abl_mean", "wo_fro"}


def png_of(uri: str) -> bytes:
    return base64.b64decode(uri.split(",", 1)[1])


def test_every_figure_text_at_least_9px_on_a_phone(tmp_path):
    """The arithmetic the browser test does with the real widths, from the page's own data- attributes: a phone
    version shown 368 px wide, or a figure without one at the width its box keeps."""
    page = build_report(make_scores(4, 8), make_curves(), tmp_path / "r", settings=SETTINGS,
                        baseline=BASELINE).read_text()
    imgs = re.findall(r"<img ([^>]*)>", page)
    assert len(imgs) >= 5
    for attrs in imgs:
        a = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs))
        if "data-phone-smallest-pt" in a:
            pt, dpi, width, shown = (float(a["data-phone-smallest-pt"]), float(a["data-phone-dpi"]),
                                     float(a["data-phone-width"]), PHONE_CONTENT_PX)
        else:
            pt, dpi, width = float(a["data-smallest-pt"]), float(a["data-dpi"]), float(a["data-width"])
            readable = re.search(r"--readable:(\d+)px", a.get("style", ""))
            shown = max(float(readable.group(1)), 0) if readable else min(PHONE_CONTENT_PX, width)
        assert pt / 72 * dpi * shown / width >= MIN_TEXT_PX, f"{a['alt']}: text under 9 px on a phone"
        natural = Image.open(io.BytesIO(png_of(a["src"]))).width
        assert natural == float(a["data-width"])
