"""The report's first screen (issue 27, item 1): every sentence recomputed here from the scores and curves frames,
with scipy and a bootstrap of our own, to the precision it prints; its place on the page; the curves figures."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy import stats

from headprune.report import build_report
from headprune.report.headline import answers, best_layer_ranking
from headprune.report.plots.curves import PHONE_DPI, PHONE_FONT, plot_curves
from headprune.report.predictiveness import predictiveness

from report_tables import BASELINE, SETTINGS, curve_row, make_scores

LAYERS, HEADS = 4, 8
N = LAYERS * HEADS
FRACTIONS = [0.0, 3 / N, 10 / N, 16 / N]  # 30% is read at 31.25%, 50% at 50%


def scores_frame(seed=1):
    """taylor follows abl_zero closely (trust it), wo_fro is noise (do not)."""
    df = make_scores(LAYERS, HEADS, ["wo_fro", "taylor", "abl_zero", "abl_mean"], seed=seed)
    rng = np.random.default_rng(seed + 10)
    df["taylor"] = df["abl_zero"] + rng.normal(0, 0.05, N)
    df["abl_mean"] = df["abl_zero"] + rng.normal(0, 0.001, N)  # closer still, but an ablation: not a cheap score
    df["wo_fro"] = rng.normal(1.0, 0.3, N)
    return df


def curves_frame(layer_slope=1.5):
    slopes = {"taylor": 1.0, "wo_fro": 4.0, "wo_fro@layer": layer_slope, "random": 3.0}
    rows = [curve_row(m, "none", f, s * f, n_heads=N) for m, s in slopes.items() for f in FRACTIONS]
    return pd.DataFrame(rows).assign(model_fingerprint="0123456789")


def own_bootstrap(x, y, replicates=200, seed=0):
    """The 95% percentile interval of Spearman ρ over heads resampled with replacement."""
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(replicates):
        i = rng.integers(len(x), size=len(x))
        draws.append(stats.spearmanr(x[i], y[i]).statistic if np.ptp(x[i]) and np.ptp(y[i]) else np.nan)
    return np.nanpercentile(draws, [2.5, 97.5])


def pixels(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGB"), dtype=float)


def said(scores, curves):
    return dict(answers(scores, curves, predictiveness(scores), BASELINE))


def test_heads_named_and_the_layer_share_of_the_total():
    scores = scores_frame()
    text = said(scores, curves_frame())["Which heads matter?"]
    top = scores.sort_values("abl_zero", ascending=False)["head_id"].tolist()[:5]
    assert f"zero-ablated): {', '.join(top[:4])} and {top[4]}." in text
    sums = {layer: sum(v for lay, v in zip(scores["layer"], scores["abl_zero"]) if lay == layer)
            for layer in range(LAYERS)}
    best = max(sums, key=sums.get)
    total = sum(sums.values())
    assert f"Layer {best} holds {sums[best] / total:.0%} of abl_zero summed over all {N} heads ({sums[best]:.3f} " \
           f"of {total:.3f} nats/token; single ablations summed)." in text


def test_layer_share_left_out_when_a_layer_sums_below_zero():
    scores = scores_frame()
    scores.loc[scores["layer"] == 3, "abl_zero"] = -1.0
    text = said(scores, curves_frame())["Which heads matter?"]
    assert "of the total" not in text and "has the largest sum of abl_zero" in text


def test_trusted_score_with_rho_and_its_bootstrap_interval_and_the_untrusted_one():
    scores = scores_frame()
    text = said(scores, curves_frame())["Which cheap score to trust?"]
    truth = scores["abl_zero"].to_numpy()
    rho = {m: stats.spearmanr(scores[m], truth).statistic for m in ("taylor", "wo_fro")}
    ci = {m: own_bootstrap(scores[m].to_numpy(), truth) for m in rho}
    assert rho["taylor"] > rho["wo_fro"] and ci["taylor"][0] > 0 >= ci["wo_fro"][0]  # the data mean what we say
    assert (f"Trust taylor, the best of the cheap scores: Spearman ρ {rho['taylor']:.2f} (95% interval "
            f"{ci['taylor'][0]:.2f} to {ci['taylor'][1]:.2f}) with abl_zero over {N} heads.") in text
    assert (f"Do not trust wo_fro (ρ {rho['wo_fro']:.2f} (95% interval {ci['wo_fro'][0]:.2f} to "
            f"{ci['wo_fro'][1]:.2f})): the interval reaches 0 or below.") in text
    assert "abl_zero" not in text.split("Trust ")[0] and "abl_mean" not in text  # ablations are not cheap


def test_worse_than_random_and_where_the_layer_normalised_ranking_lies_against_the_band():
    scores = scores_frame()
    start = "wo_fro prune worse than random at 30% and 50% of heads; normalised per layer: wo_fro@layer "
    rescued = said(scores, curves_frame(layer_slope=1.5))["Which cheap score to trust?"]
    assert rescued.endswith(start + "better than random at 30% and 50%.")
    # the per-layer ranking inside the random band (slope 3.05: ΔNLL within ± 0.05 at both points)
    inside = said(scores, curves_frame(layer_slope=3.05))["Which cheap score to trust?"]
    assert inside.endswith(start + "within the random band at 30% and 50%.")
    # slope 3.2: above the band at 50% (1.6 > 1.5 + 0.05), inside it at 31.25% (1.000 < 0.9375 + 0.05 is false:
    # 3.2 * 10/32 = 1.000 > 0.9875): worse at both; slope 3.1: 0.969 within, 1.55 within
    worse = said(scores, curves_frame(layer_slope=3.2))["Which cheap score to trust?"]
    assert worse.endswith(start + "worse than random at 30% and 50%.")
    curves = curves_frame(layer_slope=3.05)
    at50 = (curves["method"] == "wo_fro@layer") & np.isclose(curves["fraction"], 0.5)
    curves.loc[at50, "delta_nll"] = 1.0  # random: 1.5 ± 0.05
    mixed = said(scores, curves)["Which cheap score to trust?"]
    assert mixed.endswith(start + "within the random band at 30%, better than random at 50%.")
    # the plain ranking no longer worse than random: no sentence
    curves = curves_frame()
    curves.loc[curves["method"] == "wo_fro", "delta_nll"] *= 0.5
    assert "worse than random" not in said(scores, curves)["Which cheap score to trust?"]


def test_perplexity_cost_at_30_and_50_percent_next_to_random():
    curves = curves_frame()
    text = said(scores_frame(), curves)["What does pruning cost?"]
    base = BASELINE["ppl"]

    def ppl(method, fraction):
        row = curves[(curves["method"] == method) & np.isclose(curves["fraction"], fraction)]
        return float(row["ppl"].iloc[0])

    def part(method, fraction):
        p = ppl(method, fraction)
        return f"{p:.1f}, {100 * (p / base - 1):+.1f}%"

    at30, at50 = 10 / N, 16 / N
    assert text.startswith(f"Perplexity {base:.1f} unpruned. ")
    assert (f"Pruning 30% (nearest point: 31.2%) of heads: taylor (best: lowest mean ΔNLL up "
            f"to 50%) {part('taylor', at30)}; wo_fro@layer (best @layer) {part('wo_fro@layer', at30)}; "
            f"random {part('random', at30)}.") in text
    assert (f"Pruning 50% of heads: taylor {part('taylor', at50)}; wo_fro@layer "
            f"{part('wo_fro@layer', at50)}; random {part('random', at50)}.") in text
    assert best_layer_ranking(curves) == "wo_fro@layer"


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """One report of the module's tables (its tests read different parts of it)."""
    out = tmp_path_factory.mktemp("first-screen") / "r"
    build_report(scores_frame(), curves_frame(), out, settings=SETTINGS, baseline=BASELINE)
    return out


def test_first_screen_comes_before_any_list_and_in_summary_md(report_dir):
    html = (report_dir / "report.html").read_text()
    first = html.index("Which heads matter?")
    assert first < html.index("<nav") and first < html.index("<ul") and first < html.index("<ol")
    assert html.index("What does pruning cost?") < html.index("<nav")
    md = (report_dir / "summary.md").read_text()
    assert md.index("**Which cheap score to trust?**") < md.index("## Findings")


def test_curves_figure_draws_the_best_layer_ranking_and_a_phone_version(report_dir):
    curves = curves_frame()
    with_layer = plot_curves(curves, BASELINE, N, keep=("wo_fro@layer",))
    without = pixels(plot_curves(curves, BASELINE, N))
    assert without.shape != pixels(with_layer).shape or np.abs(without - pixels(with_layer)).mean() > 1  # a line more
    html = (report_dir / "report.html").read_text()
    assert '<picture><source media="(max-width: 600px)" srcset="data:image/png;base64,' in html
    assert "the best (wo_fro@layer) is drawn too" in html
    drawn = pixels((report_dir / "curves.png").read_bytes())  # the report's figure is the one with it
    assert drawn.shape == pixels(with_layer).shape and np.abs(drawn - pixels(with_layer)).mean() < 1
    phone = (report_dir / "curves_phone.png").read_bytes()
    with Image.open(io.BytesIO(phone)) as im:
        width = im.width
    # shown 368 CSS px wide on a 400 px phone (page padding 2 x 16 px): its smallest text in CSS px
    smallest = (PHONE_FONT - 1) / 72 * PHONE_DPI * min(1.0, 368 / width)
    assert smallest >= 10, f"phone figure text {smallest:.1f} px tall"


def test_phone_curve_table_has_the_30_and_50_percent_columns_only(report_dir):
    html = (report_dir / "report.html").read_text()
    start = html.index('<div class="scroll phone">')
    table = html[start:html.index("</table>", start)]
    heads = [h for h in ("ranking", "ppl@30%", "ppl@50%", "ppl@10%", "compensation") if f">{h}<" in table]
    assert heads == ["ranking", "ppl@30%", "ppl@50%"]
    assert ".phone{display:none}" in html and "@media (max-width:600px){.phone{display:block}}" in html


@pytest.mark.parametrize("edit", ["no_truth", "no_random"])
def test_missing_numbers_leave_their_answer_out(edit):
    scores, curves = scores_frame(), curves_frame()
    if edit == "no_truth":
        scores = scores.drop(columns="abl_zero")
        got = dict(answers(scores, curves, predictiveness(scores), BASELINE))
        assert set(got) == {"What does pruning cost?"}
    else:
        curves = curves[curves["method"] != "random"]
        got = said(scores, curves)
        assert "random" not in got["What does pruning cost?"] and math.isfinite(BASELINE["ppl"])
