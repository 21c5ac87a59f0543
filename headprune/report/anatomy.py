"""The report's head-anatomy section: role scores next to importance, composition among the important heads, and
attention-pattern thumbnails (torch-free: :mod:`headprune.anatomy.for_report` computes the inputs).

- a head × role table of the top heads by ``abl_zero``;
- Spearman ρ of every anatomy column with ``abl_zero`` over heads, with a 95% percentile bootstrap interval
  (heads resampled with replacement, seeded), and one scatter per column;
- Q/K/V-composition heatmaps among the top heads (writer rows, reader columns; only earlier → later layers);
- one small-multiples PNG of attention patterns: the strongest head of each role (induction and duplicate-token on
  the repeated random-token probe, previous-token on a fixed scoring example) and the top heads by importance
  (on the same scoring example).

Files: anatomy.csv, composition.csv, attention_examples.json (so ``headprune report`` rebuilds the section),
anatomy_roles.png, anatomy_composition.png, anatomy_attention.png.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from headprune.errors import HeadpruneError
from headprune.io.work.files import read_table, write_table, write_text
from headprune.report.head_bootstrap import spearman_rows
from headprune.report.plots.common import DPI, PHONE_DPI, PHONE_FONTS, PHONE_WIDTH, Picture, render_png
from headprune.report.plots.maps import plot_heatmaps
from headprune.report.render import Block, Findings, Fold, Note, Paragraph, Section, Table
from headprune.report.tables import rank_stats
from headprune.schema import TRUTH

ROLE_COLUMNS = ("previous_token", "duplicate_token", "induction")
#: The anatomy columns compared with importance (roles, then what a head writes).
COMPARED = ("previous_token", "duplicate_token", "induction", "previous_token_corpus", "dla", "copying",
            "wo_eff_rank", "wo_overlap_rest")
TOP_ANATOMY = 10  # heads in the head × role table
TOP_COMPOSITION = 12  # heads in the composition heatmaps
BOOTSTRAP = 1000
SECTION_TITLE = "Head anatomy: what the important heads do"


@dataclass
class Thumbnail:
    """One attention pattern (queries × keys) of one head on one example."""

    head_id: str
    label: str  # why it is shown: "strongest induction", "top 1 by abl_zero"
    example: str  # "probe" or "corpus"
    pattern: list[list[float]]


@dataclass
class AnatomyReport:
    """heads: one row per head (layer, head, head_id, anatomy columns); composition: one row per pair; thumbnails;
    info: how it was measured (probe, corpus rows, the induction score of uniform attention and of an ideal head,
    the examples' text, seconds)."""

    heads: pd.DataFrame
    composition: pd.DataFrame
    thumbnails: list[Thumbnail] = field(default_factory=list)
    info: dict = field(default_factory=dict)


def write_anatomy_files(out: Path, a: AnatomyReport) -> None:
    write_table(a.heads, out / "anatomy.csv")
    write_table(a.composition, out / "composition.csv")
    write_text(out / "attention_examples.json",
               json.dumps({"info": a.info, "thumbnails": [asdict(t) for t in a.thumbnails]}, sort_keys=True) + "\n")


def read_anatomy_files(folder: Path) -> AnatomyReport | None:
    """The anatomy of a saved report folder, or None when it has none."""
    if not (folder / "anatomy.csv").is_file():
        return None
    try:
        extra = json.loads((folder / "attention_examples.json").read_text())
        thumbs = [Thumbnail(**t) for t in extra["thumbnails"]]
        return AnatomyReport(read_table(folder / "anatomy.csv"), read_table(folder / "composition.csv"), thumbs,
                             dict(extra["info"]))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise HeadpruneError(f"cannot read the head anatomy in {folder} ({type(err).__name__}); fix or remove "
                             "anatomy.csv") from None


# ---------------------------------------------------------------- numbers


def joined(a: AnatomyReport, scores: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in a.heads.columns if c not in ("layer", "head")]
    return scores[["layer", "head", "head_id", TRUTH]].merge(a.heads[cols], on="head_id", how="inner")


def bootstrap_spearman(x: np.ndarray, y: np.ndarray, n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float, float]:
    """Spearman ρ of paired values and its 95% percentile bootstrap interval over pairs (NaN where undefined)."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    rho, _ = rank_stats(x, y)
    if math.isnan(rho):
        return rho, math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n, len(x)))  # one resample of the pairs per row
    r = spearman_rows(x[idx], y[idx])
    r = r[np.isfinite(r)]
    return rho, float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))


def role_correlations(j: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for col in COMPARED:
        if col in j.columns:
            rho, lo, hi = bootstrap_spearman(j[col].to_numpy(float), j[TRUTH].to_numpy(float))
            rows.append({"anatomy": col, "spearman_rho": rho, "ci95_low": lo, "ci95_high": hi})
    return pd.DataFrame(rows)


def top_table(j: pd.DataFrame, n: int = TOP_ANATOMY) -> pd.DataFrame:
    top = j.sort_values([TRUTH, "layer", "head"], ascending=[False, True, True]).head(n)
    cols = ["head_id", TRUTH, *[c for c in (*ROLE_COLUMNS, "previous_token_corpus", "duplicate_token_corpus", "dla",
                                            "copying", "wo_eff_rank", "wo_overlap_rest") if c in j.columns]]
    out = top[cols].reset_index(drop=True)
    out.insert(0, "rank", range(1, len(out) + 1))
    return out


def strongest(df: pd.DataFrame, column: str) -> int:
    """Position of the row with the largest finite ``column`` (the first of ties)."""
    return int(np.nanargmax(df[column].to_numpy(float)))


def anatomy_findings(j: pd.DataFrame, info: dict) -> list[str]:
    """Sentences from the numbers: induction heads or not, and where the role heads rank by importance."""
    ranks = j[TRUTH].rank(ascending=False, method="min").to_numpy()
    out = []
    ideal, uniform = info.get("induction_ideal"), info.get("induction_uniform")
    at = strongest(j, "induction")
    best, rank = j.iloc[at], int(ranks[at])
    if ideal:
        share = best["induction"] / ideal
        verdict = ("has induction heads" if share >= 0.3 else "has no induction head (no head reaches 30% of it)")
        out.append(f"On repeated random tokens the strongest induction score is {best['induction']:.3f} "
                   f"({best['head_id']}, "
                   f"{share:.0%} of the {ideal:.3f} an ideal induction head scores; uniform attention scores "
                   f"{uniform:.3f}): the model {verdict}. {best['head_id']} ranks #{rank} of {len(j)} heads "
                   f"by {TRUTH}.")
    for role in ("previous_token_corpus", "duplicate_token_corpus"):
        if role in j.columns:
            at = strongest(j, role)
            b = j.iloc[at]
            out.append(f"Strongest {role.replace('_corpus', '').replace('_', '-')} head on the corpus: {b['head_id']} "
                       f"(score {b[role]:.3f}), #{int(ranks[at])} of {len(j)} by {TRUTH}.")
    return out


# ---------------------------------------------------------------- pictures


def plot_roles(j: pd.DataFrame, corr: pd.DataFrame, phone: bool = False) -> bytes:
    """Each anatomy measure against importance, one scatter per measure (``phone``: two per row, in
    :data:`.plots.common.PHONE_FONTS`)."""
    n = len(corr)
    fonts = PHONE_FONTS if phone else None
    cols = min(2 if phone else 4, n)
    rows = math.ceil(n / cols)
    size = (PHONE_WIDTH, 2.6 * rows) if phone else (3.2 * cols, 2.8 * rows)
    fig = Figure(figsize=size, layout="constrained" if phone else None)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, r in zip(axes, corr.itertuples()):
        ax.scatter(j[r.anatomy], j[TRUTH], c=j["layer"], cmap="viridis", s=14)
        rho = f"ρ {r.spearman_rho:.2f} [{r.ci95_low:.2f}, {r.ci95_high:.2f}]"
        ax.set_title(f"{r.anatomy}\n{rho}" if phone else f"{r.anatomy}: {rho}",
                     fontsize=fonts.tick if fonts else 8)
        ax.set_xlabel(r.anatomy, fontsize=fonts.tick if fonts else 8)
        ax.set_ylabel(TRUTH, fontsize=fonts.tick if fonts else 8)
        ax.tick_params(labelsize=fonts.tick if fonts else 7)
        if phone:
            ax.xaxis.set_major_locator(MaxNLocator(3))
            ax.yaxis.set_major_locator(MaxNLocator(4))
    for ax in axes[n:]:
        ax.set_visible(False)
    if not phone:
        fig.tight_layout()
    return render_png(fig, PHONE_DPI if phone else DPI)


def plot_composition(comp: pd.DataFrame, heads: list[str], phone: bool = False) -> bytes:
    """Q-, K- and V-composition among ``heads`` side by side (``phone``: one above the other)."""
    fonts = PHONE_FONTS if phone else None
    fig = Figure(figsize=(PHONE_WIDTH, 13.5) if phone else (13, 4.4), layout="constrained" if phone else None)
    index = {h: i for i, h in enumerate(heads)}
    sel = comp[comp["head_a_id"].isin(index) & comp["head_b_id"].isin(index)]
    for ax, mode in zip(fig.subplots(3, 1) if phone else fig.subplots(1, 3), ("q_comp", "k_comp", "v_comp")):
        grid = np.full((len(heads), len(heads)), np.nan)
        for a, b, v in zip(sel["head_a_id"], sel["head_b_id"], sel[mode]):
            grid[index[a], index[b]] = v
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="magma", vmin=0)
        bar = fig.colorbar(image, ax=ax, shrink=0.8)
        bar.ax.tick_params(labelsize=fonts.tick if fonts else 10)
        ax.set_xticks(range(len(heads)), heads, rotation=90, fontsize=fonts.tick if fonts else 7)
        ax.set_yticks(range(len(heads)), heads, fontsize=fonts.tick if fonts else 7)
        median = comp[mode].median() if len(comp) else math.nan
        ax.set_title(f"{mode} (median over all pairs {median:.3f})", fontsize=fonts.title if fonts else 9)
        ax.set_xlabel("reader (later layer)", fontsize=fonts.label if fonts else 8)
        ax.set_ylabel("writer (earlier layer)", fontsize=fonts.label if fonts else 8)
    if not phone:
        fig.tight_layout()
    return render_png(fig, PHONE_DPI if phone else DPI)


#: The per-head maps of anatomy.png (``headprune anatomy``), with their units.
SUMMARY_COLUMNS = {"previous_token": "share of attention", "duplicate_token": "share of attention",
                   "induction": "share of attention", "dla": "logit", "copying": "Σλ/Σ|λ|"}


def plot_anatomy_summary(heads: pd.DataFrame) -> bytes:
    """anatomy.png: one layer × head map per role score, the direct logit attribution and the copying score
    (each on its own colour scale; the values, to 3 decimals, in the cells where the grid is small)."""
    columns = [c for c in SUMMARY_COLUMNS if c in heads.columns]
    return plot_heatmaps(heads, columns, unit={c: SUMMARY_COLUMNS[c] for c in columns}, scaled=False, decimals=3)


def one_line(text: str) -> str:
    """``text`` on one line for a caption: whitespace runs, and the ``\\n``/``\\t`` escapes older files hold,
    as one space."""
    return " ".join(text.replace("\\n", " ").replace("\\t", " ").split())


def thumbnails_figure(thumbs: list[Thumbnail], phone: bool = False) -> Figure:
    """Attention patterns in a grid (6 per row; ``phone``: 2 per row, :data:`.plots.common.PHONE_WIDTH` wide),
    each titled with its head, why it is shown and the example; constrained layout keeps every title clear of
    the row above."""
    cols = min(2 if phone else 6, len(thumbs))
    rows = math.ceil(len(thumbs) / cols)
    tile = PHONE_WIDTH / cols if phone else 1.9
    fig = Figure(figsize=(tile * cols, (tile + (0.7 if phone else 0.45)) * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, t in zip(axes, thumbs):
        ax.imshow(np.asarray(t.pattern), cmap="Blues", vmin=0, vmax=1)
        ax.set_title(f"{t.head_id}\n{t.label}\n({t.example})" if phone else f"{t.head_id}\n{t.label} ({t.example})",
                     fontsize=PHONE_FONTS.tick if phone else 7)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes[len(thumbs):]:
        ax.set_visible(False)
    return fig


def plot_thumbnails(thumbs: list[Thumbnail], phone: bool = False) -> bytes:
    return render_png(thumbnails_figure(thumbs, phone), PHONE_DPI if phone else DPI)


# ---------------------------------------------------------------- the section


def anatomy_parts(a: AnatomyReport, scores: pd.DataFrame) -> tuple[Section, list[Picture]]:
    """The report section and its pictures (no section needs the pictures of another)."""
    if TRUTH not in scores.columns:
        return Section(SECTION_TITLE, [Paragraph(f"Not compared: the scores have no {TRUTH} column.")]), []
    j = joined(a, scores)
    corr = role_correlations(j)
    info = a.info
    pics = [Picture("anatomy_roles.png", f"Each anatomy measure against {TRUTH}, one point per head (colour: layer); "
                    "Spearman ρ with its 95% bootstrap interval over heads.", plot_roles(j, corr),
                    phone_png=plot_roles(j, corr, phone=True))]
    top = j.sort_values([TRUTH, "layer", "head"], ascending=[False, True, True])["head_id"].head(TOP_COMPOSITION)
    order = j.set_index("head_id").loc[list(top)].sort_values(["layer", "head"]).index.tolist()
    if len(a.composition):
        pics.append(Picture("anatomy_composition.png", f"Q-, K- and V-composition among the top {len(order)} heads by "
                            f"{TRUTH} (Elhage et al. 2021; blank: same or later layer).",
                            plot_composition(a.composition, order),
                            phone_png=plot_composition(a.composition, order, phone=True)))
    if a.thumbnails:
        pics.append(Picture("anatomy_attention.png", "Attention patterns (rows: queries, columns: keys) of the "
                            "strongest head of each role and of the top heads by importance. probe: "
                            f"{one_line(info.get('probe_text', 'random tokens repeated twice'))}; corpus: "
                            f"{one_line(info.get('corpus_text', 'the start of the scoring data'))}.",
                            plot_thumbnails(a.thumbnails), phone_png=plot_thumbnails(a.thumbnails, phone=True)))
    blocks: list[Block] = [Findings(anatomy_findings(j, info))] if "induction" in j.columns else []
    blocks += [Paragraph(f"Top {TOP_ANATOMY} heads by {TRUTH} with their anatomy (descriptions of heads, never used "
                         "to prune):"), Table(top_table(j)),
               Paragraph(f"Spearman rho of each anatomy measure with {TRUTH} over {len(j)} heads, 95% percentile "
                         f"bootstrap interval ({BOOTSTRAP} resamples of heads):"), Table(corr)]
    blocks += [Fold("Anatomy figures (" + ", ".join(p.name for p in pics) + ")", list(pics))] if pics else []
    blocks.append(Note(
        "previous_token, duplicate_token, induction: TransformerLens detect_head scores (mul: share of attention on "
        f"the pattern) on {info.get('probe', 'the induction probe')}; *_corpus: the same on "
        f"{info.get('corpus', 'the scoring data')}; "
        "dla: mean direct logit attribution to the correct next token (final LayerNorm scale frozen); copying: "
        "Σλ/Σ|λ| of the full OV circuit W_E W_V W_O W_U; wo_eff_rank: Roy-Vetterli effective rank of W_O^(i); "
        "wo_overlap_rest: mean cos² of the principal angles between the head's W_O row space and the span of the "
        "other heads of its layer."))
    return Section(SECTION_TITLE, blocks), pics


def before_pictures(secs: list[Section], section: Section) -> list[Section]:
    """``secs`` with ``section`` placed before the picture gallery (at the end if there is none)."""
    at = next((i for i, s in enumerate(secs) if s.title == "Pictures"), len(secs))
    return [*secs[:at], section, *secs[at:]]
