"""The report's text: ONE list of sections (:func:`sections`), rendered to summary.md (here) and report.html
(:mod:`.page`).

A section is a title and blocks: findings (the headline sentences), facts (label: value), notes, paragraphs,
tables and pictures. Markdown leaves out what only a page can show (the full tables and the gallery of
pictures: ``html_only`` sections) and links the pictures it keeps; ``collapsed`` sections fold on the page.
Order: the first screen (three questions answered in words, :mod:`.headline`), findings, the curves, the top
heads, the pruning order, predictiveness, the rest; settings last.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from headprune.errors import HeadpruneError
from headprune.report.choice import ODD, Choice, choose
from headprune.report.findings import findings
from headprune.report.headline import answers
from headprune.report.numbers import column_decimals, fixed, format_table
from headprune.report.plots import Picture
from headprune.report.predictiveness import predictiveness
from headprune.report.tables import (
    BEST_MAX_FRACTION,
    FRACTION_TOL,
    SUMMARY_FRACTIONS,
    TOP_HEADS,
    bpb_factor,
    fraction_note,
    layer_counts,
    rank_stats,
    summary_table,
    top_heads,
)
from headprune.report.views import (
    per_row,
    phone_summary,
    pred_note,
    predictiveness_view,
    settings_frame,
    value_text,
)
from headprune.schema import TRUTH

SCORE_DATA_KEYS = ("score_data", "scoring_data", "data_score")
EVAL_DATA_KEYS = ("eval_data", "evaluation_data", "data_eval")


@dataclass
class Content:
    """What summary.md and report.html both say."""

    scores: pd.DataFrame
    curves: pd.DataFrame
    settings: dict
    baseline: dict
    choice: Choice | None  # how the best ranking was chosen (None: no ranking has points up to 50%)
    summary: pd.DataFrame
    fraction_note: str
    predictiveness: pd.DataFrame
    top: pd.DataFrame
    layer_counts: pd.DataFrame
    findings: list[str] = field(default_factory=list)
    answers: list[tuple[str, str]] = field(default_factory=list)  # the first screen (:mod:`.headline`)
    facts: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- blocks and sections


@dataclass
class Findings:
    sentences: list[str]


@dataclass
class Answers:
    items: list[tuple[str, str]]  # (question, answer)


@dataclass
class Facts:
    items: list[tuple[str, str]]  # (label, value)


@dataclass
class Note:
    text: str


@dataclass
class Paragraph:
    text: str


@dataclass
class Commands:
    lines: list[str]  # shell command lines, shown as a code block


@dataclass
class Table:
    df: pd.DataFrame
    phone: bool = False  # a compact copy shown only on narrow screens (not in markdown)


@dataclass
class Fold:
    """Secondary blocks: folded on the page under ``title`` (``<details>``), shown as they are in markdown."""

    title: str
    blocks: list


Block = Answers | Findings | Facts | Note | Paragraph | Commands | Table | Picture | Fold


@dataclass
class Section:
    title: str
    blocks: list[Block]
    html_only: bool = False
    collapsed: bool = False
    lead: bool = False  # on the page before the table of contents: the first screen


def _setting(settings: dict, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if settings.get(key) not in (None, ""):
            return value_text(settings[key])
    return None


def number(value) -> str:
    """One number format for every table cell and fact."""
    if value is None:
        return "n/a"
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return f"{value:,}"
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            return "n/a" if np.isnan(value) else str(value)
        return f"{value:,.1f}" if abs(float(value)) >= 1e4 else f"{value:.4g}"
    return str(value)


def make_content(scores, curves, settings, baseline, layers: pd.DataFrame | None = None,
                 replicates: Mapping[str, np.ndarray] | None = None) -> Content:
    """What both pages say, from the checked tables (``layers``: each layer's heads removed together, where the run
    measured that; ``replicates``: the scores on resampled windows, for the rank statistics' intervals)."""
    try:
        choice: Choice | None = choose(curves)
    except HeadpruneError:
        choice = None
    pred = predictiveness(scores, replicates)
    content = Content(scores, curves, settings, baseline, choice, summary_table(curves, bpb_factor(baseline)),
                      fraction_note(curves), pred, top_heads(scores), layer_counts(scores),
                      findings(scores, curves, pred, layers), answers(scores, curves, pred, baseline, layers))
    score_data, eval_data = _setting(settings, SCORE_DATA_KEYS), _setting(settings, EVAL_DATA_KEYS)
    content.facts = [
        ("Model", f"{settings.get('model', 'not recorded')} (fingerprint {scores['model_fingerprint'].iloc[0]})"
                  + (f"; {settings['family']}, {settings['attention']}; unit: {settings['unit']}"
                     if "family" in settings else "")),
        ("Heads scored on", score_data or "not recorded in settings"),
        ("Curves (perplexity) measured on", eval_data or "not recorded in settings"),
        ("Heads", f"{len(scores)} ({scores['layer'].nunique()} layers)"),
        ("Baseline (unpruned)", baseline_text(baseline)),
        ("Best method", _best_text(content)),
    ]
    if score_data is not None and score_data == eval_data:
        content.notes.append("The heads were scored on the same data the curves were measured on: the curves are "
                             "in-sample and flatter the importance scores.")
    if TRUTH not in scores.columns:
        content.notes.append(f"The scores have no {TRUTH} column: predictiveness and scatter plots are skipped.")
    if "entropy" in scores.columns:
        content.notes.append("entropy is a description of a head (mean attention entropy), not an importance score.")
    if {"abl_zero", "abl_zero_folded"} <= set(scores.columns):
        rho, _ = rank_stats(scores["abl_zero"].to_numpy(float), scores["abl_zero_folded"].to_numpy(float))
        content.notes.append(
            f"Zero ablation with and without the value-bias share: Spearman rho(abl_zero, abl_zero_folded) = "
            f"{number(rho)} over {len(scores)} heads (abl_zero also removes the constant b_V W_O of each head; "
            "abl_zero_folded removes only what the head computes).")
    return content


def baseline_text(baseline: dict) -> str:
    bpb = bpb_factor(baseline)
    bits = f", {baseline['nll'] * bpb:.4g} bits/byte" if bpb else ""
    tokens = baseline.get("tokens")  # unknown where the baseline was read off the curves: left out
    count = "" if tokens is None else f", {number(tokens)} tokens" + (f" ({number(baseline['bytes'])} bytes)"
                                                                       if bpb else "")
    return f"perplexity {number(baseline['ppl'])}{bits}, NLL {number(baseline['nll'])} nats/token{count}"


def _best_text(content: Content) -> str:
    if content.choice is None:
        return "not determined (no non-random curve with compensation none and 0 < fraction <= 0.5)"
    choice, c = content.choice, content.curves
    sel = c[(c["method"] == choice.pick) & (c["compensation"] == "none") & (c["fraction"] > 0)
            & (c["fraction"] <= BEST_MAX_FRACTION + FRACTION_TOL)]
    rule = "lowest mean delta NLL over 0 < fraction <= 50%, compensation none"
    if not choice.held_out:
        return f"{choice.pick} ({rule}, chosen on the curves that measure it: {sel['delta_nll'].mean():.4g} nats/token)"
    if choice.agree:
        return (f"{choice.pick} ({rule}, on the even windows and on the odd ones alike: "
                f"{sel['delta_nll'].mean():.4g} nats/token on every window)")
    return (f"{choice.pick} ({rule}, on the even windows; the odd windows chose {choice.on_odd}; held out, on the "
            f"odd windows: {sel[ODD].mean():.4g} nats/token)")


def score_tables(scores: pd.DataFrame) -> list[Block]:
    """The scores table for the page in two that fit 1400 px: the values, then the 95% intervals (if any), one
    column "lo to hi" per method at one precision (:mod:`.numbers`)."""
    df = per_row(scores)
    ci = [c for c in df.columns if c.endswith(("_ci_lo", "_ci_hi"))]
    if not ci:
        return [Table(df)]
    ids = [c for c in ("head_id",) if c in df.columns]
    spans = pd.DataFrame({c: df[c] for c in ids})
    for lo in (c for c in ci if c.endswith("_ci_lo") and c[:-3] + "_hi" in df.columns):
        hi, method = lo[:-3] + "_hi", lo[: -len("_ci_lo")]
        d = column_decimals(np.concatenate([df[lo].to_numpy(float), df[hi].to_numpy(float)]))
        spans[method] = [f"{fixed(a, d)} to {fixed(b, d)}"
                         for a, b in zip(df[lo].to_numpy(float), df[hi].to_numpy(float))]
    return [Table(df.drop(columns=ci)), Paragraph("95% bootstrap intervals of the scores over the scoring windows:"),
            Table(spans)]


def reproduce_blocks(c: Content) -> list[Block]:
    """The commands that reproduce one point of the curves (written by `run` into its settings), with its
    perplexity, so a reader can check the table with the single commands."""
    commands = c.settings.get("commands")
    if not commands:
        return []
    ranking, fraction = commands["ranking"], float(commands["fraction"])
    row = c.curves[(c.curves["method"] == ranking) & (c.curves["compensation"] == "none")
                   & ((c.curves["fraction"] - fraction).abs() <= FRACTION_TOL)]
    ppl = f" (perplexity {number(float(row['ppl'].iloc[0]))})" if len(row) else ""
    return [Paragraph(f"The {ranking} point at {fraction:.0%}{ppl}, reproduced with single commands (each reads "
                      "the same default token budget, windows and splits as run):"), Commands(commands["lines"])]


def sections(c: Content, pictures: list[Picture]) -> list[Section]:
    """Everything the report says, in order: the headline first, settings and timings last."""
    by_name = {p.name: p for p in pictures}
    curves_pic, order_pic = by_name.get("curves.png"), by_name.get("pruning_order.png")
    normalized_pic, all_pic = by_name.get("curves_layer_normalized.png"), by_name.get("curves_all.png")
    gallery: list[Block] = [p for p in pictures if p not in (curves_pic, order_pic, normalized_pic, all_pic)]
    headline: list[Block] = [Findings(c.findings)] if c.findings else [Paragraph("No finding: see the tables.")]
    headline += [*map(Note, c.notes)]
    curves: list[Block] = [Paragraph(f"Unpruned: {baseline_text(c.baseline)}. Best method: {_best_text(c)}.")]
    curves += [Table(phone_summary(c.summary), phone=True), Table(c.summary)]
    curves += [Fold("Every ranking's curves (curves_all.png)", [all_pic])] if all_pic else []
    curves += [Paragraph(c.fraction_note)] if c.fraction_note else []
    curves += reproduce_blocks(c)
    curves += [Fold("Rankings normalised per layer (curves_layer_normalized.png)", [Paragraph(
        "Rankings named <method>@layer divide each layer's scores by their layer's norm first (Michel et al. 2019): "
        "does a score fail within layers, or only across them?"), normalized_pic])] if normalized_pic else []
    order: list[Block] = [Fold("The order in which each method removes heads (pruning_order.png)", [order_pic])
                          ] if order_pic else []
    fractions = " / ".join(f"{f:.0%}" for f in SUMMARY_FRACTIONS)
    order += ([Paragraph(f"Heads removed from each layer at {fractions} of all heads pruned:"), Table(c.layer_counts)]
              if len(c.layer_counts) else [Paragraph("No method could rank the heads.")])
    predicts: list[Block] = ([Table(predictiveness_view(c.predictiveness)), Paragraph(pred_note(c.predictiveness))]
                             if len(c.predictiveness) else
                             [Paragraph(f"Not computed: the scores have no {TRUTH} column or no other method.")])
    top: list[Block] = [Table(c.top) if len(c.top) else
                        Paragraph(f"Not available: the scores have no {TRUTH} column.")]
    settings: list[Block] = [Facts(c.facts)]
    settings += [Table(settings_frame(c.settings, str(c.scores["model_fingerprint"].iloc[0])))] if c.settings else []
    first: list[Block] = [Answers(c.answers)] if c.answers else []
    first += [curves_pic] if curves_pic else []  # the findings, then the curves: both on the first screen
    lead = [Section("In short", first, lead=True)] if first else []
    return [
        *lead,
        Section("Findings", headline),
        Section("Perplexity after pruning", curves),
        Section(f"Top {TOP_HEADS} heads by {TRUTH}", top),
        Section("Pruning order", order),
        Section(f"How well each score predicts {TRUTH}", predicts),
        Section("Pictures", gallery, html_only=True, collapsed=True),
        Section("Scores (one row per head)", score_tables(c.scores), html_only=True, collapsed=True),
        Section("Curves (one row per method, compensation, fraction)", [Table(per_row(c.curves))], html_only=True,
                collapsed=True),
        Section("Settings and timings", settings, collapsed=True),
    ]


# ---------------------------------------------------------------- markdown


def markdown_table(df: pd.DataFrame) -> str:
    """``df`` as a markdown table, one precision per float column (:func:`.numbers.format_table`)."""
    text = format_table(df)
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(v.replace("|", "\\|") for v in row) + " |" for row in text.itertuples(index=False)]
    return "\n".join(lines)


def _markdown_block(block: Block) -> list[str]:
    if isinstance(block, Answers):
        return [line for q, a in block.items for line in ("", f"**{q}** {a}")]
    if isinstance(block, Table) and block.phone:
        return []
    if isinstance(block, Findings):
        return ["", *(f"> - {sentence}" for sentence in block.sentences), ""]
    if isinstance(block, Picture):
        return ["", f"![{block.caption}]({block.name})"]
    if isinstance(block, Facts):
        return [f"- **{label}**: {value}" for label, value in block.items]
    if isinstance(block, Note):
        return [f"- Note: {block.text}"]
    if isinstance(block, Table):
        return ["", markdown_table(block.df)]
    if isinstance(block, Paragraph):
        return ["", block.text]
    if isinstance(block, Commands):
        return ["", "```bash", *block.lines, "```"]
    if isinstance(block, Fold):
        return [line for inner in block.blocks for line in _markdown_block(inner)]
    raise TypeError(f"markdown cannot show {type(block).__name__}")


def render_markdown(secs: list[Section]) -> str:
    out = ["# headprune report"]
    for sec in secs:
        if sec.html_only:
            continue
        body = [line for block in sec.blocks for line in _markdown_block(block)]
        out += ["", f"## {sec.title}", *([""] if body and body[0] else []), *body]
    return "\n".join(out) + "\n"
