"""The report's headline (findings), pruning order, bits per byte and page structure, checked against numbers
computed here from the tables, independently of headprune.report."""

from __future__ import annotations

import html
import math
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from headprune.errors import HeadpruneError
from headprune.report import build_report
from headprune.report.findings import findings
from headprune.report.predictiveness import predictiveness
from headprune.report.tables import layer_counts, pruning_order, summary_table
from headprune.report.views import flatten
from headprune.schema import method_family
from headprune.table_checks import check_curves, check_scores

from report_tables import BASELINE, FRACTIONS, SETTINGS, curve_row, make_curves, make_scores

METHODS = ["wo_fro", "ov_spec", "taylor", "abl_zero", "abl_mean"]
SLOPES = {"taylor": 1.0, "abl_mean": 1.5, "wo_fro": 3.02, "ov_spec": 4.0, "random": 3.0}  # wo_fro: in the band


def scores_frame():
    df = make_scores(methods=METHODS)
    df["ov_spec"] = -df["abl_zero"] + 0.01 * np.arange(len(df))  # ranks heads inversely
    df.loc[5, "taylor"] = 0.3  # no NaN: every method ranks
    return check_scores(df)


def curves_frame():
    rows = [curve_row(m, "none", f, s * f) for m, s in SLOPES.items() for f in FRACTIONS]
    rows += [curve_row("taylor", "mean", f, 0.4 * f) for f in FRACTIONS]
    return check_curves(pd.DataFrame(rows))


def nearest(fractions, target):
    return min(fractions, key=lambda f: (round(abs(f - target), 12), f))


def test_findings_sentences_match_numbers_computed_here():
    scores, curves = scores_frame(), curves_frame()
    sentences = findings(scores, curves, predictiveness(scores))
    assert 3 <= len(sentences) <= 6

    totals = {}
    for layer, value in zip(scores["layer"], scores["abl_zero"]):
        totals[layer] = totals.get(layer, 0.0) + value
    top = max(totals, key=lambda k: (totals[k], -k))
    assert sentences[0].startswith(f"Layer {top} matters most")
    assert f"sum to {totals[top]:.3f} nats/token" in sentences[0]
    assert f"{totals[top] / sum(totals.values()):.0%} of all heads' total" in sentences[0]

    for sentence, target in zip(sentences[1:3], (0.3, 0.5)):
        f = nearest(FRACTIONS, target)
        rand, std = SLOPES["random"] * f, 0.05
        assert sentence.startswith(f"At {target:.0%} of heads pruned")
        assert f"random band (ΔNLL {rand:.3f} ± {std:.3f} nats/token, mean ± 1 std over 5 seeds)" in sentence
        beat = sorted((m for m in SLOPES if m != "random" and SLOPES[m] * f < rand - std),
                      key=lambda m: SLOPES[m])
        assert beat == ["taylor", "abl_mean"]
        listed = ", ".join(f"{m} {SLOPES[m] * f:.3f} ({rand - SLOPES[m] * f:.3f} below random)" for m in beat)
        assert "2 scores beat the random band" in sentence and f"seeds), with ΔNLL: {listed}" in sentence
        assert sentence.endswith("ov_spec is worse than random.")  # wo_fro sits inside the band
        assert "wo_fro" not in sentence

    # the pick, taylor (slope 1, the lowest), has ΔNLL = f: 1/12 at or below 0.1 nats/token, 0.25 above it
    assert sentences[3] == ("taylor breaks (ΔNLL above 0.1 nats/token, perplexity +10.5%) between 8.3% and 25.0% of "
                            "heads removed (1 and 3 heads).")
    rho = stats.spearmanr(scores["ov_spec"], scores["abl_zero"]).statistic
    assert rho < 0
    assert sentences[4].startswith(f"ov_spec (ρ {rho:.2f}, ROC-AUC 0.00) ranks heads inversely to abl_zero")
    for other in ("wo_fro", "taylor", "abl_mean"):
        assert other not in sentences[4]

    parts = [f"at {t:.0%} {nearest(FRACTIONS, t):.3f}" for t in (0.3, 0.5)]
    plain = [SLOPES["taylor"] * nearest(FRACTIONS, t) for t in (0.3, 0.5)]
    comp = [0.4 * nearest(FRACTIONS, t) for t in (0.3, 0.5)]
    assert parts  # the fractions are read at the nearest point
    for a, b, t in zip(plain, comp, (0.3, 0.5)):
        assert f"at {t:.0%} {a:.3f} → {b:.3f} nats/token (saves {a - b:.3f})" in sentences[5]


def test_optimal_compensation_gets_its_own_sentence_after_mean():
    """An optimal-compensated curve gets a sentence of its own after the mean one, with the hand-computed numbers,
    and says 'costs' where it is worse than no compensation (here ΔNLL 1.2 x fraction against taylor's 1.0 x)."""
    scores = scores_frame()
    rows = [curve_row(m, "none", f, s * f) for m, s in SLOPES.items() for f in FRACTIONS]
    rows += [curve_row("taylor", "mean", f, 0.4 * f) for f in FRACTIONS]
    rows += [curve_row("taylor", "optimal", f, 1.2 * f) for f in FRACTIONS]  # worse than none: it "costs"
    sentences = findings(scores, check_curves(pd.DataFrame(rows)), predictiveness(scores))
    assert sentences[-2].startswith("Mean compensation") and sentences[-1].startswith("Optimal compensation")
    for t in (0.3, 0.5):
        f = nearest(FRACTIONS, t)
        a, b = SLOPES["taylor"] * f, 1.2 * f
        assert f"at {t:.0%} {a:.3f} → {b:.3f} nats/token (costs {b - a:.3f})" in sentences[-1]


def test_findings_without_truth_random_or_compensation_leave_sentences_out():
    scores = check_scores(make_scores(methods=["wo_fro", "taylor"]).fillna(0.1))
    curves = check_curves(pd.DataFrame([curve_row("taylor", "none", f, f) for f in FRACTIONS]))
    # ΔNLL = f: 1/12 is at or below 0.1 nats/token, 0.25 above it
    assert findings(scores, curves, predictiveness(scores)) == [
        ("taylor breaks (ΔNLL above 0.1 nats/token, perplexity +10.5%) between 8.3% and 25.0% of heads removed (1 and "
         "3 heads).")]
    curves = check_curves(make_curves())
    assert [s[:20] for s in findings(scores, curves, predictiveness(scores))] == [
        "At 30% of heads prun", "At 50% of heads prun", "taylor breaks (ΔNLL ", "Mean compensation (t"]


def test_pruning_order_is_the_ascending_score_order():
    scores = scores_frame()
    n = len(scores)
    for method in ("wo_fro", "ov_spec", "taylor", "abl_zero"):
        grid = pruning_order(scores, method)
        order = sorted(range(n), key=lambda i: (scores[method][i], scores["layer"][i], scores["head"][i]))
        for step, i in enumerate(order, 1):
            assert grid.loc[scores["layer"][i], scores["head"][i]] == step
    with_nan = make_scores()
    with_nan.loc[5, "taylor"] = float("nan")  # a NaN score is refused, never silently left out of the order
    with pytest.raises(HeadpruneError, match="must be a finite number"):
        check_scores(with_nan)


def test_layer_counts_count_the_lowest_heads_per_layer():
    scores = scores_frame()
    table = layer_counts(scores).set_index("method")
    assert list(table.index) == ["wo_fro", "ov_spec", "taylor", "abl_zero", "abl_mean"]
    assert list(table.columns) == ["layer 0", "layer 1", "layer 2"]
    for method in table.index:
        order = sorted(range(len(scores)), key=lambda i: (scores[method][i], scores["layer"][i], scores["head"][i]))
        for layer in range(3):
            counts = [sum(scores["layer"][i] == layer for i in order[:round(f * len(scores))]) for f in (0.1, 0.3, 0.5)]
            assert table.loc[method, f"layer {layer}"] == " / ".join(map(str, counts))


BYTES = 4100


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """One report of the module's tables, its baseline with bytes and its settings nested."""
    out = tmp_path_factory.mktemp("findings-report")
    build_report(make_scores(), make_curves(), out, settings=SETTINGS | {"nested": {"k": 1}},
                 baseline=BASELINE | {"bytes": BYTES})
    return out


def test_bits_per_byte_from_baseline_bytes(report_dir):
    curves = check_curves(make_curves())
    tokens, n_bytes = 1000, BYTES
    table = summary_table(curves, tokens / (math.log(2) * n_bytes)).set_index(["method", "compensation"])
    for label, target in (("bpb@10%", 0.1), ("bpb@50%", 0.5)):
        f = nearest(FRACTIONS, target)
        nll = 3.0 + 1.0 * f  # taylor's slope in test_report
        assert table.loc[("taylor", "none"), label] == pytest.approx(nll * tokens / (math.log(2) * n_bytes))
    assert "bpb@30%" not in summary_table(curves).columns
    text = (report_dir / "summary.md").read_text()  # the report of the baseline with bytes: BYTES
    assert f"{3.0 * tokens / (math.log(2) * n_bytes):.4g} bits/byte" in text and "| bpb@30% |" in text


def test_settings_are_flattened_key_value_rows():
    rows = flatten({"b": {"x": 1, "y": {"z": "deep"}}, "a": [0.1, 0.2], "c": None, "d": "text"})
    assert rows == [("a", "0.1, 0.2"), ("b.x", "1"), ("b.y.z", "deep"), ("c", "n/a"), ("d", "text")]


class Tree(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.tables_outside, self.ids, self.links, self.meta, self.order = [], 0, [], [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and not any(t == "div" and "scroll" in (c or "").split() for t, c in self.stack):
            self.tables_outside += 1
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "a":
            self.links.append(a.get("href"))
        if tag == "meta":
            self.meta.append(a)
        if tag in ("details", "img") or (tag == "div" and a.get("class") == "findings"):
            self.order.append((tag if tag != "div" else "findings", a.get("alt")))
        if tag not in ("meta", "img", "br", "source", "wbr"):
            self.stack.append((tag, a.get("class")))

    def handle_endtag(self, tag):
        self.stack.pop()


def test_page_has_viewport_toc_scrolling_tables_and_headline_first(report_dir):
    text = (report_dir / "report.html").read_text()
    tree = Tree()
    tree.feed(text)
    assert {"name": "viewport", "content": "width=device-width, initial-scale=1"} in tree.meta
    assert tree.tables_outside == 0 and text.count("<table") >= 6
    assert tree.links and {link[1:] for link in tree.links} <= set(tree.ids)
    # the first screen: the answers, then the main curves figure (issue 39, item 4), then the findings
    assert tree.order[0] == ("img", "curves.png") and tree.order[1] == ("findings", None)
    assert text.index("What does pruning cost?") < text.index('alt="curves.png"') < text.index("<nav")
    assert tree.order[-1] == ("details", None)
    details = text[text.index("<details"):]
    assert "nested.k" in details and '{"k"' not in details and "timings.score_s" in details
    assert text.index("<h2>Top 10 heads") < text.index('alt="pruning_order.png"') < text.index("<h2>How well each")
    md = (report_dir / "summary.md").read_text()
    heads = re.findall(r"^## (.+)$", md, re.MULTILINE)
    assert heads[:2] == ["In short", "Findings"] and heads[-1] == "Settings and timings"
    for sentence in findings(check_scores(make_scores()), check_curves(make_curves()),
                             predictiveness(check_scores(make_scores()))):
        assert f"> - {sentence}" in md and f"<li>{html.escape(sentence)}</li>" in text


def test_method_families():
    assert [method_family(m) for m in ("wo_fro", "ov_spec", "out_norm", "fluct", "grad", "taylor", "abl_zero",
                                       "abl_zero_folded", "random", "mystery")] == [
        "weights", "weights", "activations", "activations", "gradients", "gradients", "ablation", "ablation",
        "random", "other"]


def test_many_inverse_scores_are_summarised_as_ranges_and_tiny_changes_as_none():
    from report_tables import auc_by_ranks

    df = make_scores(methods=METHODS)
    rng = np.random.default_rng(3)
    for m in ("wo_fro", "ov_spec", "taylor"):
        df[m] = -df["abl_zero"] + rng.normal(0, 0.2, len(df))
    scores = check_scores(df)
    truth = scores["abl_zero"].to_numpy()
    top = np.zeros(len(truth), bool)
    top[np.argsort(-truth, kind="stable")[:2]] = True  # ceil(10% of 12)
    rho = [stats.spearmanr(scores[m], truth).statistic for m in ("wo_fro", "ov_spec", "taylor")]
    auc = [auc_by_ranks(scores[m].to_numpy(), top) for m in ("wo_fro", "ov_spec", "taylor")]
    sentence = findings(scores, check_curves(make_curves()), predictiveness(scores))
    inverse = next(s for s in sentence if "inversely" in s)
    assert inverse.startswith("wo_fro, ov_spec and taylor rank heads inversely to abl_zero")
    def span(v):
        return f"{min(v):.2f}" if f"{min(v):.2f}" == f"{max(v):.2f}" else f"{min(v):.2f} to {max(v):.2f}"

    assert f"{min(rho):.2f} to {max(rho):.2f}" == span(rho)
    assert f"here ρ {span(rho)}, ROC-AUC {span(auc)})" in inverse
    rows = [curve_row("taylor", c, f, 0.2 * f + (1e-4 if c == "mean" else 0)) for c in ("none", "mean")
            for f in FRACTIONS]
    comp = findings(scores, check_curves(pd.DataFrame(rows)), predictiveness(scores))[-1]
    assert comp.endswith("at 30% 0.050 → 0.050 nats/token (no change) and at 50% 0.100 → 0.100 nats/token "
                         "(no change).")
