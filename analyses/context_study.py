"""The context study of a real model: which KV heads need the whole context, whether they are the induction heads
the anatomy finds and the heads whose zero-ablation costs most, how much KV cache can stream, how the cheap scores
agree with the exact one. Reads the run's tables (``scores.csv``, ``anatomy.csv``) and ``headprune context``'s
(``context/``), writes ``context/study.md``; every sentence is computed from those tables
(tests/report/test_context_study.py recomputes them).

    python -m analyses.context_study reports/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from headprune.bootstrap import interval
from headprune.io.work.files import read_table, write_text
from headprune.models.heads import group_id
from headprune.stages.context import ContextResult, load_context

TOP = 5  # KV heads named as the ones that need the context most
DRAWS = 1000  # bootstrap draws over KV heads for the rank correlations
CONTEXT = 8192  # the context length whose KV-cache bytes the study states


def kv_table(run: Path, result: ContextResult) -> pd.DataFrame:
    """One row per KV head: its ctx_* scores (``result``'s; equal over its query heads, ctx_retrieval: the
    largest), and the largest induction score and abl_zero among its query heads (the run's tables)."""
    joined = result.scores.merge(read_table(run / "anatomy.csv")[["head_id", "induction"]], on="head_id").merge(
        read_table(run / "scores.csv")[["head_id", "abl_zero"]], on="head_id")
    n_layers = joined.layer.nunique()
    kv_per_layer = result.settings["n_kv_heads"] // n_layers
    group = len(joined) // (n_layers * kv_per_layer)
    joined["kv"] = joined["head"] // group
    agg = {c: "max" for c in ("ctx_stream", "ctx_stream_ci_lo", "ctx_stream_ci_hi", "ctx_gate", "ctx_retrieval",
                              "induction", "abl_zero")}
    table = joined.groupby(["layer", "kv"], as_index=False).agg(agg)
    table["kv_id"] = [group_id(layer, kv) for layer, kv in zip(table.layer, table.kv)]
    return table


def rho_interval(x: np.ndarray, y: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """Spearman ρ of x and y and its 95% interval over KV heads resampled."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(x), size=(DRAWS, len(x)))
    reps = [spearmanr(x[d], y[d]).statistic for d in draws]
    lo, hi = interval(np.array(reps))
    return float(spearmanr(x, y).statistic), float(lo), float(hi)


def stream_lines(result: ContextResult) -> list[str]:
    """How much KV cache can stream: the task the full model performs, then per measure and tolerance the score's
    order streaming the largest share, with the cache it saves at 8,192 tokens."""
    lines: list[str] = []
    task = result.settings["task"]
    curve, shares = result.curve, result.shares
    full = curve[curve.n_streaming == 0].iloc[0]
    if result.settings["n_prompts"]:
        lines.append(f"The full model gets {task} right on {full.accuracy:.0%} of {result.settings['n_prompts']} "
                     f"prompts ({result.settings['seq_len'] // 2:,} and {result.settings['seq_len']:,} tokens). The "
                     "largest share of KV heads streaming, with every measure within the tolerance (perplexity and "
                     "accuracy) and with the accuracy alone:\n")
    elif result.settings.get("task_note"):
        lines.append(f"The task is left out ({result.settings['task_note']}). The largest share of KV heads "
                     "streaming within the tolerance of the perplexity:\n")
    measures = ["all", "accuracy"] if result.settings["n_prompts"] else ["all"]
    for measure, tol in [(m, t) for m in measures for t in sorted(shares.tolerance.unique())]:
        within = f"within {tol:.0%}" + (f" of the {task} accuracy alone" if measure == "accuracy" else "")
        rows = shares[(shares.tolerance == tol) & (shares.measure == measure)
                      & shares.ranking.isin(result.settings["methods"])]
        tied = rows[rows.share == rows.share.max()].merge(curve[["ranking", "n_streaming", "delta_nll"]],
                                                          on=["ranking", "n_streaming"])
        best = tied.sort_values(["delta_nll", "ranking"]).iloc[0]  # as the pattern is chosen: then the smaller ΔNLL
        if best.share == 0:
            lines.append(f"- {within}: no score's order streams any share of the grid (first share "
                         f"{curve.share[curve.share > 0].min():.0%}).")
            continue
        point = curve[(curve.ranking == best.ranking) & (curve.n_streaming == best.n_streaming)].iloc[0]
        col = f"kv_bytes_{CONTEXT}"
        others = ", ".join(f"{t.ranking} [{t.share_lo:.0%}, {t.share_hi:.0%}]" for t in tied.itertuples()
                           if t.ranking != best.ranking)
        saved = 1 - point[col] / full[col]
        lines.append(f"- {within}: {best.ranking} streams {best.share:.0%} [{best.share_lo:.0%}, "
                     f"{best.share_hi:.0%}] of the KV heads (ΔNLL {best.delta_nll:+.4f}"
                     + (f"; as many: {others}" if others else "") + f"): the cache at {CONTEXT:,} tokens "
                     f"{full[col] / 2**20:,.1f} → {point[col] / 2**20:,.1f} MiB ({saved:.0%} less).")
    return lines


def study_lines(run: Path) -> list[str]:
    result = load_context(run / "context")
    kv = kv_table(run, result)
    top = kv.sort_values("ctx_stream", ascending=False).head(TOP)
    certified = int((kv.ctx_stream_ci_lo > 0).sum())
    lines = [f"# The context study: {run.name}\n",
             "## Which KV heads need the whole context\n",
             (f"{certified} of {len(kv)} KV heads cost NLL when streaming with their 95% interval above 0 (ctx_stream, "
             f"{result.settings['score_windows']} validation windows of {result.settings['seq_len']} tokens). "
             f"The {TOP} that cost most:"), ""]
    induction_rank = kv.induction.rank(ascending=False)
    ablation_rank = kv.abl_zero.rank(ascending=False)
    for r in top.itertuples():
        lines.append(f"- {r.kv_id}: ctx_stream {r.ctx_stream:+.4f} [{r.ctx_stream_ci_lo:+.4f}, "
                     f"{r.ctx_stream_ci_hi:+.4f}] nats/token; induction rank {induction_rank[r.Index]:.0f}, "
                     f"abl_zero rank {ablation_rank[r.Index]:.0f} of {len(kv)}")
    lines.append("")
    lines.append("## Are they the induction heads, and the heads that matter most?\n")
    for other, what in (("induction", "a KV head's largest among its query heads, from the run's anatomy.csv"),
                        ("abl_zero", "a KV head's largest among its query heads, from the run's scores.csv")):
        rho, lo, hi = rho_interval(kv.ctx_stream.to_numpy(), kv[other].to_numpy())
        top_other = set(kv.sort_values(other, ascending=False).head(TOP).kv_id)
        shared = sorted(set(top.kv_id) & top_other)
        lines.append(f"- ctx_stream against {other} ({what}): Spearman ρ {rho:+.2f} [{lo:+.2f}, {hi:+.2f}] over "
                     f"{len(kv)} KV heads; {len(shared)} of the top {TOP} in both"
                     + (f" ({', '.join(shared)})" if shared else "") + ".")
    lines += ["", "## How much KV cache can stream\n", *stream_lines(result)]
    lines += ["", "## The cheap scores against the exact one\n"]
    for method in ("ctx_gate", "ctx_retrieval"):
        rho, lo, hi = rho_interval(kv.ctx_stream.to_numpy(), kv[method].to_numpy())
        lines.append(f"- {method}: Spearman ρ with ctx_stream {rho:+.2f} [{lo:+.2f}, {hi:+.2f}] over {len(kv)} KV "
                     "heads.")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("run", type=Path, help="a run's folder holding scores.csv, anatomy.csv and context/")
    args = p.parse_args(argv)
    write_text(args.run / "context" / "study.md", "\n".join(study_lines(args.run)) + "\n")
    print(f"-> {args.run / 'context' / 'study.md'}")


if __name__ == "__main__":
    main()
