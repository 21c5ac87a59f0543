"""The report's context section, where the run's folder holds ``headprune context``'s output (``context/``, e.g.
``headprune context --model M --out RUN/context``): the largest share of KV heads that can stream within 1% and 5%
of the full model, per ranking with its interval, and the study's sentences (``context/summary.md``, generated
from the same tables). Torch-free: it reads the saved tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headprune.context import MAX_SEQ_LEN
from headprune.context.choice import with_measure
from headprune.io.work.files import read_table
from headprune.report.render import Block, Paragraph, Section, Table

SECTION_TITLE = "Which KV heads need the whole context"
FOLDER = "context"


def within_label(tolerance: float, measure: str) -> str:
    """A shares column's name: 'within 1%' (every measure) or 'within 1%, accuracy alone'."""
    return f"within {tolerance:.0%}" + ("" if measure == "all" else f", {measure} alone")


def shares_view(shares: pd.DataFrame) -> pd.DataFrame:
    """One row per ranking, one column per tolerance, every measure together and the accuracy alone where the task
    was measured: 'share [lo, hi]'."""
    shares = shares[shares.measure.isin(["all", "accuracy"])]
    cells = shares.assign(cell=[f"{r.share:.0%} [{r.share_lo:.0%}, {r.share_hi:.0%}]" for r in shares.itertuples()],
                          within=[within_label(t, str(m)) for t, m in zip(shares.tolerance, shares.measure)])
    return cells.pivot(index="ranking", columns="within", values="cell").rename_axis(columns=None).reset_index()


def pending_section(settings: dict) -> Section | None:
    """Where the run's model has a context of at least :data:`~headprune.context.MAX_SEQ_LEN` tokens
    (``settings["context_tokens"]``) and nothing measured it yet: how to measure it (None otherwise)."""
    n = settings.get("context_tokens")
    if n is None or n < MAX_SEQ_LEN:
        return None
    command = f"headprune context --model {settings.get('model', 'M')} --out {settings.get('out', 'RUN')}/{FOLDER}"
    return Section(SECTION_TITLE, [Paragraph(
        f"This model's context holds {n:,} tokens, long enough for the context question: `{command}` measures which "
        "of its KV heads need the whole context and which can keep only a few first and recent tokens (three scores, "
        "the streaming curve against the long-window perplexity and a recall task with the KV cache's bytes, and a "
        "pattern for kvpress and headprune; it prints its cost before it starts). Its findings then appear here "
        "(`headprune report`, or the next run into this folder).")])


def read_context_section(folder: Path, settings: dict | None = None) -> Section | None:
    """The section from ``folder``/context; where there is none, :func:`pending_section` of the run's
    ``settings``."""
    ctx = folder / FOLDER
    if not (ctx / "summary.md").is_file():
        return pending_section(settings or {})
    text = (ctx / "summary.md").read_text().splitlines()[1:]  # after the title
    sentences = [line for line in text if line.strip() and not line.startswith(("- ", "Largest share"))]
    shares = with_measure(read_table(ctx / "streaming_shares.csv"))
    blocks: list[Block] = [Paragraph(sentences[0]), Table(shares_view(shares)), *map(Paragraph, sentences[1:])]
    return Section(SECTION_TITLE, blocks)
