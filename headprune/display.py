"""How results show themselves in a notebook: short HTML summaries (the key numbers, then the top heads).

Torch-free. ``HeadScores._repr_html_`` (:mod:`headprune.scoring`), ``Anatomy._repr_html_`` (:mod:`headprune.anatomy`)
and ``GateResult._repr_html_`` (:mod:`headprune.pruning.gates`) call these; each function also takes ``top``, the
number of heads listed, for a longer list than Jupyter's default.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any, Protocol

import pandas as pd

from headprune.schema import (
    ABLATION_METHODS,
    ACTIVATION_METHODS,
    GRADIENT_METHODS,
    IMPORTANCE_METHODS,
    METHOD_SPECS,
    TRUTH,
    WEIGHT_METHODS,
    ci_columns,
    method_columns,
)

#: The anatomy columns listed, with what a high value means.
ANATOMY_ROLES = {"induction": "induction", "previous_token": "previous token", "duplicate_token": "duplicate token",
                 "dla": "direct logit attribution", "copying": "copying"}


class ScoredHeads(Protocol):
    """What :func:`scores_html` reads (``headprune.scoring.HeadScores`` has it)."""

    @property
    def table(self) -> pd.DataFrame: ...

    @property
    def baseline(self) -> dict | None: ...

    @property
    def seconds(self) -> dict[str, float]: ...


class HeadAnatomy(Protocol):
    """What :func:`anatomy_html` reads (``headprune.anatomy.Anatomy`` has it)."""

    @property
    def heads(self) -> pd.DataFrame: ...

    @property
    def composition(self) -> pd.DataFrame: ...


class LearnedGates(Protocol):
    """What :func:`gates_html` reads (``headprune.pruning.gates.GateResult`` has it)."""

    @property
    def table(self) -> pd.DataFrame: ...

    @property
    def closed(self) -> list[tuple[int, int]]: ...

    @property
    def history(self) -> list[dict]: ...


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.4g}"
    return html.escape(str(value))


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _page(title: str, facts: Sequence[tuple[str, Any]], sections: Sequence[tuple[str, str]]) -> str:
    """A title, one line of ``label: value`` facts, then each (caption, table)."""
    line = " · ".join(f"{html.escape(k)}: <b>{_cell(v)}</b>" for k, v in facts)
    parts = [f"<div class='headprune'><b>{html.escape(title)}</b><p>{line}</p>"]
    parts += [f"<p>{html.escape(caption)}</p>{table}" for caption, table in sections]
    return "".join(parts) + "</div>"


#: The order a summary prefers its ranking column in: abl_zero (what the cheap scores are judged against), then
#: the most direct measures first (ablation, gradients, activations, weights).
PREFERENCE = (TRUTH, *(m for m in ABLATION_METHODS + GRADIENT_METHODS + ACTIVATION_METHODS + WEIGHT_METHODS
                       if m in IMPORTANCE_METHODS and m != TRUTH))


def main_method(table: pd.DataFrame) -> str | None:
    """The importance column a summary ranks by: the first of :data:`PREFERENCE` in ``table`` (None without one)."""
    return next((m for m in PREFERENCE if m in table.columns), None)


def top_heads(table: pd.DataFrame, column: str, top: int, keep_nan: bool = False) -> pd.DataFrame:
    """The ``top`` rows with the highest ``column`` (ties in (layer, head) order). A head whose value is NaN is left
    out, or with ``keep_nan`` listed after every scored head (shown as —), so a table of n heads lists min(n, top)."""
    rows = table if keep_nan else table.dropna(subset=[column])
    return rows.sort_values(["layer", "head"]).sort_values(column, ascending=False, kind="stable",
                                                           na_position="last").head(top)


def _fingerprint(table: pd.DataFrame) -> str:
    return str(table["model_fingerprint"].iloc[0])[:12] if "model_fingerprint" in table and len(table) else "?"


def _score_facts(scores: ScoredHeads) -> list[tuple[str, Any]]:
    """model, heads, methods, tokens (those the ablation baseline predicted where ablation ran, else those read),
    baseline NLL and perplexity (where ablation ran), seconds."""
    table = scores.table
    facts: list[tuple[str, Any]] = [("model", _fingerprint(table)), ("heads", len(table)),
                                    ("methods", ", ".join(method_columns(table)))]
    tokens = scores.baseline["tokens"] if scores.baseline is not None else getattr(scores, "tokens", None)
    facts += [("tokens", f"{int(tokens):,}")] if tokens is not None else []
    if scores.baseline is not None:
        nll = float(scores.baseline["nll"])
        facts += [("baseline NLL", nll), ("perplexity", math.exp(nll))]
    if scores.seconds:
        facts.append(("seconds", round(sum(scores.seconds.values()), 1)))
    return facts


def scores_text(scores: ScoredHeads, top: int = 5) -> str:
    """``print(scored)``: one line of :func:`_score_facts`, then the ``top`` heads by :func:`main_method`, then
    where the full table is."""
    facts = " · ".join(f"{k}: {_cell(v) if isinstance(v, float) else v}" for k, v in _score_facts(scores))
    lines = [f"HeadScores({facts})"]
    if (method := main_method(scores.table)) is not None:
        best = top_heads(scores.table, method, top)
        lines.append(f"top {len(best)} heads by {method}: "
                     + ", ".join(f"{r['head_id']} {float(r[method]):.4g}" for _, r in best.iterrows()))
    lines.append(".table: one row per head, a column per method (and its 95% interval)")
    return "\n".join(lines)


def scores_html(scores: ScoredHeads, top: int = 10) -> str:
    """The model's fingerprint, heads, methods, tokens and baseline NLL / perplexity (where ablation ran), then the
    ``top`` heads by :func:`main_method` with their 95% intervals."""
    table = scores.table
    facts = _score_facts(scores)
    method = main_method(table)
    if method is None:
        return _page("headprune scores", facts, [])
    best = top_heads(table, method, top, keep_nan=True)  # a head without a score is still a head
    lo, hi = ci_columns(method)
    header = ["rank", "head", method] + (["95% interval"] if lo in best else [])
    rows = [[i + 1, r["head_id"], float(r[method])] + ([f"[{r[lo]:.4g}, {r[hi]:.4g}]"] if lo in best else [])
            for i, (_, r) in enumerate(best.iterrows())]
    caption = f"top {len(rows)} heads by {method}: {METHOD_SPECS[method].label if method in METHOD_SPECS else method}"
    return _page("headprune scores", facts, [(caption, _table(header, rows))])


def anatomy_html(anatomy: HeadAnatomy, top: int = 3) -> str:
    """Per role (induction, previous token, duplicate token, DLA, copying): the ``top`` heads with the highest
    score; then the strongest composition of each kind."""
    heads = anatomy.heads
    facts: list[tuple[str, Any]] = [("heads", len(heads)), ("layers", heads["layer"].nunique()),
                                    ("pairs composed", len(anatomy.composition))]
    rows = []
    for column, label in ANATOMY_ROLES.items():
        best = top_heads(heads, column, top)
        rows.append([label, ", ".join(f"{r['head_id']} ({r[column]:.3g})" for _, r in best.iterrows())])
    sections = [(f"the top {top} heads per role", _table(["role", "heads (score)"], rows))]
    comp = anatomy.composition
    kinds = [k for k in ("q_comp", "k_comp", "v_comp") if k in comp and len(comp)]
    if kinds:
        best_rows = [comp.sort_values(k, ascending=False, kind="stable").iloc[0] for k in kinds]
        strongest = [[k, r["head_a_id"], r["head_b_id"], float(r[k])] for k, r in zip(kinds, best_rows)]
        sections.append(("the strongest composition of each kind (writer → reader)",
                         _table(["kind", "writer", "reader", "score"], strongest)))
    return _page("headprune anatomy", facts, sections)


def gates_html(result: LearnedGates, top: int = 10) -> str:
    """Steps, the last logged loss / NLL / open fraction, the closed heads, and the ``top`` heads least likely
    to stay open."""
    facts: list[tuple[str, Any]] = [("model", _fingerprint(result.table)), ("heads", len(result.table)),
                                    ("closed", len(result.closed))]
    if result.history:
        last = result.history[-1]
        facts += [("step", last["step"]), ("loss", float(last["loss"])), ("NLL", float(last["nll"])),
                  ("open", float(last["open"]))]
    closed = set(result.closed)
    least = result.table.sort_values(["layer", "head"]).sort_values("gate", kind="stable").head(top)
    rows = [[i + 1, r["head_id"], float(r["gate"]), "closed" if (r["layer"], r["head"]) in closed else ""]
            for i, (_, r) in enumerate(least.iterrows())]
    caption = f"the {len(rows)} heads least likely open: P(gate open)"
    return _page("headprune gates", facts, [(caption, _table(["rank", "head", "gate", ""], rows))])
