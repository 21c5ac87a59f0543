"""Report tables (issue 27, item 6): one precision per column, float noise at zero printed as 0, the model
fingerprint once on the page, the scores' intervals in a table of their own, pruning-order colours that follow
the heatmaps' "bright = important"."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from headprune.report import build_report
from headprune.report.numbers import format_table
from headprune.report.plots.maps import _color_limits, order_colors
from headprune.report.render import markdown_table
from headprune.report.tables import pruning_order

from report_tables import BASELINE, SETTINGS, make_curves, make_scores


def decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def test_mixed_magnitudes_print_one_precision_per_column():
    df = pd.DataFrame({"method": ["a", "b", "c"], "ppl": [199.72, 192.5, 1.9849], "tiny": [0.0162, 0.000101, 0.0093],
                       "heads": [1, 22, 333]})
    text = format_table(df)
    assert list(text["ppl"]) == ["199.7", "192.5", "2.0"]  # median 192.5: 4 significant digits
    assert list(text["tiny"]) == ["0.016200", "0.000101", "0.009300"]  # median 0.0093
    assert list(text["heads"]) == ["1", "22", "333"]
    md = markdown_table(df)
    assert "| a | 199.7 | 0.016200 | 1 |" in md and "1.9849" not in md and "192.50" not in md


def test_float_noise_at_zero_prints_as_0_and_nan_as_na():
    df = pd.DataFrame({"nll_std": [2.84217e-14, 0.0213, 0.0311, np.nan], "x": [-1e-12, 5.0, 6.5, 7.25]})
    text = format_table(df)
    assert list(text["nll_std"]) == ["0", "0.02130", "0.03110", "n/a"]
    assert text["x"].iloc[0] == "0"  # never "-0.000"
    assert len({decimals(t) for t in text["x"].iloc[1:]}) == 1


def test_page_tables_one_precision_per_column_and_no_exponent(tmp_path):
    curves = make_curves()
    zero = (curves["method"] == "random") & (curves["fraction"] == 0)
    curves.loc[zero, "nll_std"] = 2.84217e-14
    page = build_report(make_scores(), curves, tmp_path / "r", settings=SETTINGS, baseline=BASELINE).read_text()
    assert "e-14" not in page and "2.84217" not in page
    start = page.index("<h2>Curves (one row per method")
    table = page[start:page.index("</table>", start)]
    header = [h.replace("<wbr>", "") for h in re.findall(r"<th>(.*?)</th>", table)]
    rows = [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", table, re.DOTALL)[1:]]
    std = [r[header.index("nll_std")] for r in rows]
    assert "0" in std  # random at 0%
    for name in ("ppl", "delta_nll", "nll"):
        cells = [r[header.index(name)] for r in rows if r[header.index(name)] not in ("0", "n/a")]
        assert len({decimals(c) for c in cells}) == 1, (name, cells)


def test_fingerprint_once_on_the_page(tmp_path):
    settings = SETTINGS | {"model_fingerprint": "0123456789"}
    page = build_report(make_scores(), make_curves(), tmp_path / "r", settings=settings, baseline=BASELINE).read_text()
    assert page.count("0123456789") == 1
    assert "model_fingerprint" not in page  # neither a column of the scores / curves tables nor a settings row
    written = pd.read_csv(tmp_path / "r" / "scores.csv", dtype={"model_fingerprint": str})
    assert (written["model_fingerprint"] == "0123456789").all()  # the files keep the column


def test_score_intervals_in_their_own_table(tmp_path):
    scores = make_scores()
    scores["taylor_ci_lo"], scores["taylor_ci_hi"] = scores["taylor"] - 0.1, scores["taylor"] + 0.1
    page = build_report(scores, make_curves(), tmp_path / "r", settings=SETTINGS, baseline=BASELINE).read_text()
    start = page.index("<h2>Scores (one row per head)")
    section = page[start:page.index("</details>", start)]  # a folded section (issue 39)
    values, spans = section.split("95% bootstrap intervals")
    assert "ci_<wbr>lo" not in values and ">taylor<" in spans
    first = re.search(r"<td>L0H0</td>\s*<td>(\S+) to (\S+)</td>", spans)
    assert first is not None
    a, b = first.groups()
    assert decimals(a) == decimals(b) and abs(float(a) - scores["taylor_ci_lo"].iloc[0]) <= 0.5 * 10.0 ** -decimals(a)
    assert abs(float(b) - scores["taylor_ci_hi"].iloc[0]) <= 0.5 * 10.0 ** -decimals(b)


def luminance(rgba) -> float:
    r, g, b = np.asarray(rgba)[..., :3].T
    return 0.299 * r + 0.587 * g + 0.114 * b


def test_pruning_order_bright_means_important_like_the_heatmaps():
    scores = make_scores()
    n = len(scores)
    order = pruning_order(scores, "abl_zero")
    top = scores.loc[scores["abl_zero"].idxmax()]
    low = scores.loc[scores["abl_zero"].idxmin()]
    step_top, step_low = order.loc[top["layer"], top["head"]], order.loc[low["layer"], low["head"]]
    assert step_top == n and step_low == 1  # removed last / first
    assert luminance(order_colors(np.array([step_top]), n)) > 0.7  # removed last: bright
    assert luminance(order_colors(np.array([1]), n)) < 0.3  # removed first: dark
    from matplotlib import colormaps

    vmin, vmax, name = _color_limits(scores["abl_zero"].to_numpy())  # the heatmap of abl_zero: brightest at its top
    bright = colormaps[name]((top["abl_zero"] - vmin) / (vmax - vmin))
    assert luminance(bright) > 0.7
