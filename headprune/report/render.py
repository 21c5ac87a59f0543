"""The report's text: ONE list of sections (:func:`sections`), rendered to summary.md and to report.html.

A section is a title and blocks: facts (label: value), notes, paragraphs, tables and pictures. Markdown
leaves out what only a page can show (pictures, the full tables: ``html_only`` sections).
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import HeadpruneError
from ..schema import TRUTH
from .plots import Picture
from .tables import (
    BEST_MAX_FRACTION,
    FRACTION_TOL,
    TOP_HEADS,
    TOP_PERCENT,
    best_method,
    fraction_note,
    predictiveness,
    rank_stats,
    summary_table,
    top_heads,
)

SCORE_DATA_KEYS = ("score_data", "scoring_data", "data_score")
EVAL_DATA_KEYS = ("eval_data", "evaluation_data", "data_eval")
PRED_NOTE = (f"r2: R^2 of a linear fit of {TRUTH} on the score; spearman_rho, kendall_tau (tau-b): rank agreement; "
             f"roc_auc_top10: ROC-AUC of the score for the top {TOP_PERCENT}% heads by {TRUTH} (ceil, ties to the "
             "smaller layer/head). kind=description: not an importance, read its sign as a finding.")


@dataclass
class Content:
    """What summary.md and report.html both say."""

    scores: pd.DataFrame
    curves: pd.DataFrame
    settings: dict
    baseline: dict
    best: str | None
    summary: pd.DataFrame
    fraction_note: str
    predictiveness: pd.DataFrame
    top: pd.DataFrame
    facts: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- blocks and sections


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
class Table:
    df: pd.DataFrame


Block = Facts | Note | Paragraph | Table | Picture


@dataclass
class Section:
    title: str
    blocks: list[Block]
    html_only: bool = False


def _setting(settings: dict, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if settings.get(key) not in (None, ""):
            return _value_text(settings[key])
    return None


def _value_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


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


def make_content(scores, curves, settings, baseline) -> Content:
    try:
        best = best_method(curves)
    except HeadpruneError:
        best = None
    content = Content(scores, curves, settings, baseline, best, summary_table(curves), fraction_note(curves),
                      predictiveness(scores), top_heads(scores))
    score_data, eval_data = _setting(settings, SCORE_DATA_KEYS), _setting(settings, EVAL_DATA_KEYS)
    content.facts = [
        ("Model", f"{settings.get('model', 'not recorded')} (fingerprint {scores['model_fingerprint'].iloc[0]})"),
        ("Heads scored on", score_data or "not recorded in settings"),
        ("Curves (perplexity) measured on", eval_data or "not recorded in settings"),
        ("Heads", f"{len(scores)} ({scores['layer'].nunique()} layers)"),
        ("Baseline (unpruned)", (f"perplexity {number(baseline['ppl'])}, NLL {number(baseline['nll'])} nats/token, "
                                 f"{number(baseline['tokens'])} tokens")),
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


def _best_text(content: Content) -> str:
    if content.best is None:
        return "not determined (no non-random curve with compensation none and 0 < fraction <= 0.5)"
    c = content.curves
    sel = c[(c["method"] == content.best) & (c["compensation"] == "none") & (c["fraction"] > 0)
            & (c["fraction"] <= BEST_MAX_FRACTION + FRACTION_TOL)]
    return (f"{content.best} (lowest mean delta NLL over 0 < fraction <= 50%, compensation none: "
            f"{sel['delta_nll'].mean():.4g} nats/token)")


def _settings_frame(settings: dict) -> pd.DataFrame:
    return pd.DataFrame([(k, _value_text(v)) for k, v in sorted(settings.items())], columns=["setting", "value"])


def sections(c: Content, pictures: list[Picture]) -> list[Section]:
    """Everything the report says, in order."""
    settings: list[Block] = [Facts(c.facts), *map(Note, c.notes)]
    settings += [Table(_settings_frame(c.settings))] if c.settings else []
    perplexity: list[Block] = [Table(c.summary)]
    perplexity += [Paragraph(c.fraction_note)] if c.fraction_note else []
    predicts: list[Block] = ([Table(c.predictiveness), Paragraph(PRED_NOTE)] if len(c.predictiveness) else
                             [Paragraph(f"Not computed: the scores have no {TRUTH} column or no other method.")])
    top: list[Block] = [Table(c.top) if len(c.top) else
                        Paragraph(f"Not available: the scores have no {TRUTH} column.")]
    return [
        Section("Settings", settings),
        Section("Perplexity after pruning", perplexity),
        Section(f"How well each score predicts {TRUTH}", predicts),
        Section(f"Top {TOP_HEADS} heads by {TRUTH}", top),
        Section("Pictures", list(pictures), html_only=True),
        Section("Scores (one row per head)", [Table(c.scores)], html_only=True),
        Section("Curves (one row per method, compensation, fraction)", [Table(c.curves)], html_only=True),
    ]


# ---------------------------------------------------------------- markdown


def markdown_table(df: pd.DataFrame) -> str:
    def cell(v) -> str:
        return number(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _markdown_block(block: Block) -> list[str]:
    if isinstance(block, Facts):
        return [f"- **{label}**: {value}" for label, value in block.items]
    if isinstance(block, Note):
        return [f"- Note: {block.text}"]
    if isinstance(block, Table):
        return ["", markdown_table(block.df)]
    if isinstance(block, Paragraph):
        return ["", block.text]
    raise TypeError(f"markdown cannot show {type(block).__name__}")


def render_markdown(secs: list[Section]) -> str:
    out = ["# headprune report"]
    for sec in secs:
        if sec.html_only:
            continue
        body = [line for block in sec.blocks for line in _markdown_block(block)]
        out += ["", f"## {sec.title}", *([""] if body and body[0] else []), *body]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- html

_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.85em}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}figure{margin:1em 0}img{max-width:100%}
figcaption{font-size:.85em;color:#555}.note{color:#8a4b00}"""


def _html_table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, border=0, na_rep="n/a", float_format=lambda v: f"{v:.6g}")


def _html_block(block: Block) -> str:
    e = html.escape
    if isinstance(block, Facts):
        return "<ul>\n" + "\n".join(f"<li><b>{e(label)}</b>: {e(value)}</li>" for label, value in block.items) + "\n</ul>"
    if isinstance(block, Note):
        return f'<p class="note">Note: {e(block.text)}</p>'
    if isinstance(block, Table):
        return _html_table(block.df)
    if isinstance(block, Paragraph):
        return f"<p>{e(block.text)}</p>"
    uri = "data:image/png;base64," + base64.b64encode(block.png).decode("ascii")
    return (f'<figure><img src="{uri}" alt="{e(block.name)}"><figcaption>{e(block.name)}: {e(block.caption)}'
            "</figcaption></figure>")


def render_html(secs: list[Section]) -> str:
    body = ["<h1>headprune report</h1>"]
    for sec in secs:
        body += [f"<h2>{html.escape(sec.title)}</h2>", *map(_html_block, sec.blocks)]
    head = f'<meta charset="utf-8"><title>headprune report</title><style>{_CSS}</style>'
    page = "\n".join(body)
    return f'<!DOCTYPE html>\n<html lang="en">\n<head>{head}</head>\n<body>\n{page}\n</body>\n</html>\n'
