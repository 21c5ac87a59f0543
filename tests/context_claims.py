"""The context study's sentences recomputed from the tables they cite (headprune context's summary.md): used on the
CLI's output and on the committed real-model studies."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from scipy.stats import spearmanr

from headprune.stages.context import load_context


def pct(x: float) -> str:
    return f"{x:.0%}"


def check_summary(folder: Path) -> int:
    """Every claim of ``folder``/summary.md recomputed from the saved tables; returns how many were checked."""
    r = load_context(folder)
    text = (folder / "summary.md").read_text()
    curve, shares, s = r.curve, r.shares, r.settings
    full = curve[curve.n_streaming == 0].iloc[0]
    checked = 0
    assert f"tail NLL {full.tail_nll:.4f} nats/token on the last {s['tail']} tokens of {s['curve_windows']} " \
           f"windows of {s['seq_len']} tokens" in text
    checked += 1
    if s["n_prompts"]:
        assert f"; {s['task']} right on {pct(full.accuracy)} of {s['n_prompts']} prompts." in text
        assert len(r.points[full.point]["right"]) == s["n_prompts"]
        checked += 1
    blocks = re.findall(r"within (\d+)% of the full model('s \w+ accuracy alone)?[^\n]*\n((?:- [^\n]*\n)+)", text)
    assert len(blocks) == shares.tolerance.nunique() * (2 if s["n_prompts"] else 1)
    assert {alone for _, alone, _ in blocks} == ({"", f"'s {s['task']} accuracy alone"} if s["n_prompts"] else {""})
    for tol_pct, alone, block in blocks:
        rows = shares[(shares.tolerance.round(2) == int(tol_pct) / 100)
                      & (shares.measure == ("accuracy" if alone else "all"))]
        for ranking, share, lo, hi in re.findall(r"- (\w+): (\d+)% \[(\d+)%, (\d+)%\]", block):
            row = rows[rows.ranking == ranking].iloc[0]
            assert (pct(row.share), pct(row.share_lo), pct(row.share_hi)) == (f"{share}%", f"{lo}%", f"{hi}%")
            checked += 1
        band = re.search(r"random orders \((\d+) seeds\): (\d+)% to (\d+)%", block)
        random_rows = rows[rows.ranking.str.startswith("random/")]
        assert band and int(band[1]) == len(random_rows)
        assert (f"{band[2]}%", f"{band[3]}%") == (pct(random_rows.share.min()), pct(random_rows.share.max()))
        checked += 1
    pattern = re.search(r"Pattern: (\S+), (\d+) of (\d+) KV heads streaming", text)
    none = re.search(r"Pattern: no KV head streams \(no score's order stays within (\d+)% at its first share, "
                     r"(\d+)%\)", text)
    if r.pattern.n_streaming:
        assert pattern and (pattern[1], int(pattern[2]), int(pattern[3])) == (
            r.pattern.ranking, r.pattern.n_streaming, s["n_kv_heads"])
    else:  # every score's order is outside the tolerance at its smallest share, on all the windows
        assert none and int(none[1]) == round(100 * s["tolerance"])
        assert none[2] == pct(curve.share[curve.share > 0].min())[:-1]
        chosen_from = r.shares[(r.shares.tolerance == s["tolerance"]) & r.shares.ranking.isin(s["methods"])
                               & (r.shares.measure == "all")]
        assert len(chosen_from) == len(s["methods"]) and (chosen_from.share == 0).all()
    point = full if r.pattern.n_streaming == 0 else \
        curve[(curve.ranking == r.pattern.ranking) & (curve.n_streaming == r.pattern.n_streaming)].iloc[0]
    for context, before, after in re.findall(r"([\d,]+) tokens ([\d,.]+) MiB → ([\d,.]+) MiB", text):
        column = f"kv_bytes_{context.replace(',', '')}"
        assert (before, after) == (f"{full[column] / 2**20:,.1f}", f"{point[column] / 2**20:,.1f}")
        checked += 1
    folds = r.cross_fit.sort_values(["tolerance", "fold"])
    held = re.findall(r"(\w+) at (\d+)%, held-out ΔNLL ([+-]\d+\.\d+)(?:, accuracy drop ([+-]\d+)%)?", text)
    assert len(held) == len(folds)
    for (ranking, share, delta, drop), fold in zip(held, folds.itertuples()):
        assert (ranking, f"{share}%", delta) == (fold.ranking, pct(fold.share), f"{fold.held_out_delta_nll:+.4f}")
        assert drop == ("" if pd.isna(fold.held_out_accuracy_drop) else f"{fold.held_out_accuracy_drop:+.0%}"[:-1])
        checked += 1
    for method, rho in re.findall(r"(ctx_\w+) ([+-]\d+\.\d+)", text.split("Agreement", 1)[1]):
        assert rho == f"{spearmanr(r.scores[method], r.scores['ctx_stream']).statistic:+.2f}"
        checked += 1
    return checked
