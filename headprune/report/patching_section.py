"""The report's patching section: which heads carry a behaviour on clean/corrupt prompt pairs, and whether the
attribution-patching approximations find them (torch-free: :func:`headprune.patching.study.patch_study`
computes the inputs).

- one layer × head map per method of the normalised effect (m − m_corrupt)/(m_clean − m_corrupt);
- the agreement of each approximation with exact patching (Spearman ρ of |change|, recall of the top k);
- the top heads by exact patching with their importance (abl_zero) and anatomy roles;
- per approximation of z, the bound on what the heads it leaves unverified can still move (AtP*'s diagnostic).

Files (:func:`patching_paths`, the one place that names them): patch.csv, patch_agreement.csv, patch_missed.csv,
patch.json (task, metric, the two runs' metrics, the bounds). ``headprune run`` writes them into its report folder and
``headprune patch --out DIR/patch.csv`` beside its table, so ``headprune report`` rebuilds the section from either.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.io.work.files import read_table, write_table, write_text
from headprune.report.anatomy import ROLE_COLUMNS, AnatomyReport
from headprune.report.plots.common import Picture
from headprune.report.plots.maps import plot_heatmaps
from headprune.report.render import Block, Findings, Note, Paragraph, Section, Table
from headprune.schema import TRUTH

SECTION_TITLE = "Which heads carry a behaviour: activation patching"
TOP_PATCHED = 8
EFFECT_UNIT = "fraction of the gap"  # the maps' cells and colorbars, as the findings give it
PATCH_TABLE = "patch.csv"  # the study's head table in a report folder, and beside the scores `report` reads
_TABLES = ("agreement", "missed")  # written beside the head table, in its format


def patching_paths(table: str | os.PathLike) -> dict[str, Path]:
    """Every file of one patching study whose head table is ``table`` (``DIR/STEM.SUFFIX``): ``table`` itself,
    ``agreement`` and ``missed`` (DIR/STEM_agreement.SUFFIX, DIR/STEM_missed.SUFFIX) and ``info``
    (DIR/STEM.json: task, metric, the runs' metrics, the bounds)."""
    table = Path(table)
    return {"table": table, **{k: table.with_name(f"{table.stem}_{k}{table.suffix}") for k in _TABLES},
            "info": table.with_name(f"{table.stem}.json")}


@dataclass
class PatchingReport:
    """table: one row per head (layer, head, head_id, a column per method and its interval); agreement and
    missed: as :class:`headprune.patching.study.Study` has them; info: the task, metric and runs' summary."""

    table: pd.DataFrame
    agreement: pd.DataFrame | None = None
    missed: pd.DataFrame | None = None
    info: dict = field(default_factory=dict)

    @property
    def methods(self) -> list[str]:
        return [c for c in self.table.columns if c.startswith(("patch_", "atp_")) and not c.endswith(("_lo", "_hi"))]


def write_patching_files(table: str | os.PathLike, p: PatchingReport) -> None:
    """The study's files (:func:`patching_paths` of ``table``), the head table last: a folder whose head table
    exists holds the rest of the same study. A table the study lacks is removed (an earlier study's would pass
    for this one's)."""
    paths = patching_paths(table)
    write_text(paths["info"], json.dumps(p.info, sort_keys=True) + "\n")
    for key in _TABLES:
        if (df := getattr(p, key)) is not None:
            write_table(df, paths[key])
        else:
            paths[key].unlink(missing_ok=True)
    write_table(p.table, paths["table"])


def read_patching_files(folder: Path) -> PatchingReport | None:
    """The patching study in ``folder`` (a report folder, or where ``headprune patch --out FOLDER/patch.csv``
    wrote), or None when it has none or holds a by-position table (no section shows one)."""
    paths = patching_paths(folder / PATCH_TABLE)
    if not paths["table"].is_file():
        return None
    try:
        info = json.loads(paths["info"].read_text())
        if info.get("by_position"):
            return None
        parts = {key: read_table(paths[key]) if paths[key].is_file() else None for key in _TABLES}
        return PatchingReport(read_table(paths["table"]), parts["agreement"], parts["missed"], dict(info))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise HeadpruneError(f"cannot read the patching study in {folder} ({type(err).__name__}: {err}); run "
                             f"headprune patch --out {paths['table']} again, or remove {PATCH_TABLE}") from None


def top_patched(p: PatchingReport, scores: pd.DataFrame, anatomy: AnatomyReport | None, n: int = TOP_PATCHED
                ) -> pd.DataFrame:
    """The n heads whose exact patching moves the metric most, with every method's effect, their importance
    (abl_zero) and, where measured, their anatomy roles."""
    exact = p.methods[0]
    top = p.table.assign(_size=p.table[exact].abs()).sort_values(["_size", "layer", "head"],
                                                                 ascending=[False, True, True]).head(n)
    out = top[["head_id", *p.methods]]
    if TRUTH in scores.columns:
        out = out.merge(scores[["head_id", TRUTH]], on="head_id", how="left")
    if anatomy is not None:
        roles = [c for c in ROLE_COLUMNS if c in anatomy.heads.columns]
        out = out.merge(anatomy.heads[["head_id", *roles]], on="head_id", how="left")
    out.insert(0, "rank", range(1, len(out) + 1))
    return out.reset_index(drop=True)


def patching_findings(p: PatchingReport, top: pd.DataFrame) -> list[str]:
    """Sentences from the numbers: the gap the heads are measured against, the heads that carry it, how well
    each approximation agrees, and what the bound leaves possible."""
    info, exact = p.info, p.methods[0]
    sentences = [(f"On {info['pairs']} {info.get('task') or 'prompt'} pairs the {info['metric']} is "
                 f"{info['metric_clean']:.2f} on the clean prompts and {info['metric_corrupt']:.2f} on the corrupt "
                 f"ones (gap {info['gap']:.2f}).")]
    lead = top.head(3)
    sentences.append(f"Patching one head's {exact.removeprefix('patch_')} from the clean run restores the most for "
                     + ", ".join(f"{h} ({v:+.2f})" for h, v in zip(lead["head_id"], lead[exact]))
                     + " (1 = the whole gap).")
    if p.agreement is not None:
        for row in p.agreement.itertuples():
            sentences.append(f"{row.method} ranks the heads as {row.exact} does with Spearman ρ {row.spearman:.2f} "
                             f"and finds {row.recall_at_k:.0%} of its top {row.k}.")
    for b in info.get("bounds", []):
        check = (f"; the largest exact effect among them is {b['largest_exact_unverified']:.3f}"
                 if b.get("largest_exact_unverified") is not None else "")
        sentences.append(f"After verifying its top {len(b['verified'])} heads, {b['method']} leaves no head that "
                         f"moves the metric by more than {b['bound']:.3f} ({b['level']:.0%} bound from "
                         f"{b['subsets']} random subsets{check}).")
    return sentences


def patching_parts(p: PatchingReport, scores: pd.DataFrame, anatomy: AnatomyReport | None = None
                   ) -> tuple[Section, list[Picture]]:
    """The report section and its picture."""
    top = top_patched(p, scores, anatomy)
    pic = Picture("patching.png", "Normalised effect of patching each head, as a fraction of the gap between the "
                  "clean and the corrupt metric (rows: layers, columns: heads): 1 restores the clean behaviour, 0 "
                  "leaves the corrupt one. AtP* (GradDrop) estimates a magnitude.",
                  plot_heatmaps(p.table, p.methods, unit=EFFECT_UNIT, scaled=False),
                  phone_png=plot_heatmaps(p.table, p.methods, unit=EFFECT_UNIT, scaled=False, phone=True))
    blocks: list[Block] = [Findings(patching_findings(p, top)), pic,
                           Paragraph(f"Top {len(top)} heads by {p.methods[0]}, with their importance for the "
                                     "language-modelling loss and their anatomy roles:"), Table(top)]
    if p.agreement is not None:
        blocks += [Paragraph("Each approximation against exact patching (|change| per head; 95% intervals over "
                             "resampled pairs):"), Table(p.agreement)]
    blocks.append(Note(
        f"{p.info.get('task_text', 'Prompt pairs')}. Metric: {p.info['metric']} at each prompt's last position, "
        f"{p.info['direction']} direction. patch_z: exact activation patching of the head's output z_i (all "
        "positions), batched from the cached residual stream; atp_z: attribution patching (one forward and one "
        "backward); atp_star_z: AtP* with GradDrop (Kramár et al. 2024). The bound patches random subsets of the "
        "unverified heads together and bounds each head's effect (subsampling estimate plus a Bonferroni "
        "normal margin), under additive effects."))
    return Section(SECTION_TITLE, blocks), [pic]
