"""The report's section on long documents (:mod:`headprune.stages.window_length`): perplexity at each window length
on the same tokens, and how far the heads' ``taylor`` ranking moves with the window length and with the corpus. Its
sentences are computed from the two tables alone."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headprune.report.render import Paragraph, Section, Table

SECTION_TITLE = "Long documents: what longer windows change"
WINDOWS_FILE, RANKS_FILE, TAYLOR_FILE = "long_windows.csv", "long_ranks.csv", "long_taylor.csv"


def read_long(folder: str | Path) -> dict[str, pd.DataFrame] | None:
    """The stage's tables in ``folder`` by file name (None where the run has none)."""
    paths = {name: Path(folder) / name for name in (WINDOWS_FILE, RANKS_FILE, TAYLOR_FILE)}
    if not all(p.is_file() for p in paths.values()):
        return None
    return {name: pd.read_csv(p) for name, p in paths.items()}


def side(lo: float, hi: float) -> str:
    """Where an interval of a difference lies against 0."""
    return "lower" if hi < 0 else "higher" if lo > 0 else "not told apart"


def length_sentence(windows: pd.DataFrame) -> str:
    """Perplexity at the run's length, then at each longer one with the paired change."""
    first, longest = windows.iloc[0], windows.iloc[-1]
    longer = [f"in windows of {r['seq_len']:,}: {r['ppl']:.2f} [{r['ppl_ci_lo']:.2f}, {r['ppl_ci_hi']:.2f}], ΔNLL "
              f"{r['delta_nll']:+.3f} [{r['delta_ci_lo']:+.3f}, {r['delta_ci_hi']:+.3f}] nats/token "
              f"({side(r['delta_ci_lo'], r['delta_ci_hi'])})" for r in windows.iloc[1:].to_dict("records")]
    return (f"On {int(first.tokens):,} tokens of the long documents (test split; {int(first.spans)} spans of "
            f"{int(longest.seq_len):,} tokens, the bootstrap's units), perplexity in windows of {int(first.seq_len)} "
            f"tokens is {first.ppl:.2f} [{first.ppl_ci_lo:.2f}, {first.ppl_ci_hi:.2f}]; " + "; ".join(longer) + ".")


def _agreement(r) -> str:
    return (f"ρ {r.spearman_rho:+.2f} [{r.spearman_ci_lo:+.2f}, {r.spearman_ci_hi:+.2f}], {r.top_shared:.0%} "
            f"[{r.top_shared_ci_lo:.0%}, {r.top_shared_ci_hi:.0%}] of the top {int(r.top)} in common")


def moves(window: pd.Series, corpus: pd.Series) -> str:
    """Whether the longest window moves the ranking less or more than the change of corpus does: from the ρ
    intervals (a higher ρ moves it less)."""
    if window["spearman_ci_lo"] > corpus["spearman_ci_hi"]:
        return "less than"
    return "more than" if window["spearman_ci_hi"] < corpus["spearman_ci_lo"] else "not told apart from"


def rank_sentence(ranks: pd.DataFrame) -> str:
    """Each longer length's agreement with the run's, the corpora's, and which moves the ranking more."""
    lengths = ranks[ranks["x_len"] != ranks["y_len"]]
    corpus = ranks[ranks["x_len"] == ranks["y_len"]].iloc[0]
    first = corpus.to_dict()["x_len"]
    said = "; ".join(f"{r.y_len:,} against {first} tokens on the same text: {_agreement(r)}"
                     for r in lengths.itertuples())
    longest = lengths.iloc[-1]
    verdict = moves(longest, corpus)
    how = (f"moves the ranking {verdict} the change of corpus does" if verdict != "not told apart from"
           else "is not told apart from the change of corpus in how far it moves the ranking")
    return (f"The heads' taylor ranking (Spearman ρ over heads and spans resampled together): {said}; the run's "
            f"corpus against the long documents, both in windows of {first}: {_agreement(corpus)}. Going from {first} "
            f"to {int(longest.y_len):,} tokens {how}.")


def long_section(tables: dict[str, pd.DataFrame]) -> Section:
    """The section: what was measured, both tables, the two sentences."""
    windows, ranks = tables[WINDOWS_FILE], tables[RANKS_FILE]
    lead = ("The same tokens of the long-document corpus (whole standard-library modules, the language reference's "
            "long chapters and CPython's licence; PSF-2.0) scored in windows of each length: every length scores the "
            "same targets, so the changes are paired. The taylor score is the first-order NLL change from "
            "zero-ablating a head, from one forward and backward per window.")
    view = pd.DataFrame({"window (tokens)": windows["seq_len"], "windows": windows["windows"],
                         "perplexity [95%]": [f"{r.ppl:.2f} [{r.ppl_ci_lo:.2f}, {r.ppl_ci_hi:.2f}]"
                                              for r in windows.itertuples()],
                         "ΔNLL from the first [95%]": [f"{r.delta_nll:+.3f} [{r.delta_ci_lo:+.3f}, "
                                                       f"{r.delta_ci_hi:+.3f}]" for r in windows.itertuples()]})
    agree = pd.DataFrame({"taylor on": ranks["x"], "against": ranks["y"],
                          "Spearman ρ [95%]": [f"{r.spearman_rho:+.2f} [{r.spearman_ci_lo:+.2f}, "
                                               f"{r.spearman_ci_hi:+.2f}]" for r in ranks.itertuples()],
                          "top 10% in common [95%]": [f"{r.top_shared:.0%} [{r.top_shared_ci_lo:.0%}, "
                                                      f"{r.top_shared_ci_hi:.0%}]" for r in ranks.itertuples()]})
    return Section(SECTION_TITLE, [Paragraph(lead), Table(view), Paragraph(length_sentence(windows)), Table(agree),
                                   Paragraph(rank_sentence(ranks))])
