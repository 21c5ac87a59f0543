"""The report's context section, where the run's folder holds ``headprune context``'s output (``context/``, e.g.
``headprune context --model M --out RUN/context``): the largest share of KV heads that can stream within 1% and 5%
of the full model, per ranking with its interval, and the study's sentences (``context/summary.md``, generated
from the same tables). Torch-free: it reads the saved tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headprune.io.work.files import read_table
from headprune.report.render import Block, Paragraph, Section, Table

SECTION_TITLE = "Which KV heads need the whole context"
FOLDER = "context"


def shares_view(shares: pd.DataFrame) -> pd.DataFrame:
    """One row per ranking, one column per tolerance: 'share [lo, hi]'."""
    cells = shares.assign(cell=[f"{r.share:.0%} [{r.share_lo:.0%}, {r.share_hi:.0%}]" for r in shares.itertuples()],
                          within=[f"within {t:.0%}" for t in shares.tolerance])
    return cells.pivot(index="ranking", columns="within", values="cell").rename_axis(columns=None).reset_index()


def read_context_section(folder: Path) -> Section | None:
    """The section from ``folder``/context (None where there is none)."""
    ctx = folder / FOLDER
    if not (ctx / "summary.md").is_file():
        return None
    text = (ctx / "summary.md").read_text().splitlines()[1:]  # after the title
    sentences = [line for line in text if line.strip() and not line.startswith(("- ", "Largest share"))]
    blocks: list[Block] = [Paragraph(sentences[0]), Table(shares_view(read_table(ctx / "streaming_shares.csv"))),
                           *map(Paragraph, sentences[1:])]
    return Section(SECTION_TITLE, blocks)
