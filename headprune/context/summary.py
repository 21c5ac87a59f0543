"""The context study's sentences, each generated from the tables it cites (tests recompute every one from them)."""

from __future__ import annotations

import pandas as pd
from scipy.stats import spearmanr

from headprune.context.pattern import KVPattern


def mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:,.1f} MiB"


def score_agreement(scores: pd.DataFrame, methods: list[str], exact: str = "ctx_stream") -> dict[str, float]:
    """Spearman ρ of each cheap context score with the exact one, over query heads."""
    return {m: float(spearmanr(scores[m], scores[exact]).statistic) for m in methods if m != exact}


def random_band(shares: pd.DataFrame, tol: float, measure: str = "all") -> tuple[float, float, int]:
    """(lowest, highest, seeds) of the random orders' largest share within ``tol`` by ``measure``."""
    rows = shares[(shares.tolerance == tol) & (shares.measure == measure) & shares.ranking.str.startswith("random/")]
    return float(rows.share.min()), float(rows.share.max()), len(rows)


def share_block(shares: pd.DataFrame, tol: float, measure: str, heading: str) -> list[str]:
    """``heading``, then each ranking's largest share within ``tol`` by ``measure`` with its interval, and the
    random orders' band."""
    lines = [heading]
    rows = shares[(shares.tolerance == tol) & (shares.measure == measure)]
    for r in rows[~rows.ranking.str.startswith("random/")].itertuples():
        lines.append(f"- {r.ranking}: {r.share:.0%} [{r.share_lo:.0%}, {r.share_hi:.0%}]")
    lo, hi, seeds = random_band(shares, tol, measure)
    if seeds:
        lines.append(f"- random orders ({seeds} seeds): {lo:.0%} to {hi:.0%}")
    return lines + [""]


def summary_lines(scores: pd.DataFrame, curve: pd.DataFrame, shares: pd.DataFrame, cross_fit: pd.DataFrame,
                  pattern: KVPattern, s: dict) -> list[str]:
    """Markdown lines from the context stage's tables and settings ``s``: the full model, the largest streaming
    share per ranking and tolerance, the pattern and its held-out check, how the cheap scores agree with the exact
    one."""
    full = curve[curve.n_streaming == 0].iloc[0]
    n_kv, contexts = s["n_kv_heads"], [c for c in (2048, 8192, 32768) if f"kv_bytes_{c}" in curve]
    acc = f"; {s['task']} right on {full.accuracy:.0%} of {s['n_prompts']} prompts" if s["n_prompts"] else ""
    lines = ["# Which KV heads need the whole context\n",
             (f"Full model: tail NLL {full.tail_nll:.4f} nats/token on the last {s['tail']} tokens of "
             f"{s['curve_windows']} windows of {s['seq_len']} tokens (long documents, test split){acc}. Streaming "
             f"heads keep {s['sink']} sink + {s['recent']} recent tokens; the scores were computed on "
             f"{s['score_windows']} windows of the validation split."), ""]
    if s.get("task_note"):
        lines += [f"The task is left out: {s['task_note']}.", ""]
    task = f" and {s['task']} accuracy" if s["n_prompts"] else ""
    for tol in sorted(shares.tolerance.unique()):
        lines += share_block(shares, tol, "all", f"Largest share of the {n_kv} KV heads streaming within {tol:.0%} "
                                                 f"of the full model (perplexity{task}; 95% interval):")
    if s["n_prompts"]:
        for tol in sorted(shares.tolerance.unique()):
            lines += share_block(shares, tol, "accuracy", f"Largest share of the {n_kv} KV heads streaming within "
                                 f"{tol:.0%} of the full model's {s['task']} accuracy alone (95% interval):")
    p = pattern
    streams = curve[(curve.ranking == p.ranking) & (curve.n_streaming == p.n_streaming)].iloc[0] if p.n_streaming \
        else full
    bytes_line = ", ".join(f"{c:,} tokens {mib(full[f'kv_bytes_{c}'])} → {mib(streams[f'kv_bytes_{c}'])}"
                           for c in contexts)
    if p.n_streaming:
        lines += [(f"Pattern: {p.ranking}, {p.n_streaming} of {n_kv} KV heads streaming (the largest share within "
                   f"{s['tolerance']:.0%}); KV cache in fp16 at {bytes_line}."), ""]
    else:
        lines += [(f"Pattern: no KV head streams (no score's order stays within {s['tolerance']:.0%} at its first "
                   f"share, {curve.share[curve.share > 0].min():.0%}); KV cache in fp16 at {bytes_line}."), ""]
    for tol in sorted(cross_fit.tolerance.unique()):
        folds = cross_fit[cross_fit.tolerance == tol].sort_values("fold")
        held = "; ".join(f"chosen on {f.chosen_on}: {f.ranking} at {f.share:.0%}, held-out ΔNLL "
                         f"{f.held_out_delta_nll:+.4f}" + ("" if pd.isna(f.held_out_accuracy_drop) else
                                                          f", accuracy drop {f.held_out_accuracy_drop:+.0%}")
                         for f in folds.itertuples())
        lines.append(f"Within {tol:.0%}, chosen on one half of the windows and prompts and measured on the other: "
                     f"{held}.")
    lines.append("")
    methods = [m for m in s["methods"] if m in scores]
    if "ctx_stream" in methods and len(methods) > 1:
        rho = score_agreement(scores, methods)
        lines.append("Agreement with the exact ctx_stream (Spearman ρ over query heads): "
                     + ", ".join(f"{m} {v:+.2f}" for m, v in rho.items()) + ".")
    return lines
