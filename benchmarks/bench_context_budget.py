"""``headprune context`` at its default budget, timed whole, against a committed study at a longer window: what the
default costs, and what the longer window buys (how the KV heads' need for the context and the largest streaming
shares change with the window length).

    python -m benchmarks.bench_context_budget [--model smollm2-135m-instruct]
        [--study reports/smollm2-135m-instruct/context] [--work /tmp/headprune-bench-context]

The command runs in a child process as a user runs it (its estimate line is kept beside the measured time; the
child's peak resident memory from ``getrusage``). ``--work`` keeps its progress file, so a stopped run resumes, but
then its time is not one run's: a finished run is read back with the time recorded beside it. The comparison, per
context score: Spearman ρ across KV heads of a KV head's need (the largest score of its query heads) at the two
window lengths, with a 95% interval resampling the KV heads (each budget's scores carry their own window intervals
in their tables), and the overlap of the two top 10%; per ranking, the largest share within 1% and 5% at each
length with its interval. Prints the findings and writes ``reports/bench_context_budget.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from headprune.bootstrap import DEFAULT_REPLICATES, interval
from headprune.context.curve import kv_need
from headprune.io.read.loading import load_model
from headprune.stages.context import ContextResult, load_context

TOLERANCES = (0.01, 0.05)


def run_command(model: str, work: Path) -> dict:
    """Run ``headprune context`` at its defaults into ``work`` (or read back the finished run's record)."""
    record = work.with_name(work.name + ".timing.json")
    if (work / "summary.md").is_file() and record.is_file():
        return json.loads(record.read_text())
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "headprune", "context", "--model", model, "--out", str(work)],
                          stdout=subprocess.PIPE, text=True, check=True)
    seconds = time.perf_counter() - t0
    estimate = next((line for line in done.stdout.splitlines() if line.startswith("estimated")), "")
    timing = {"seconds": round(seconds, 1), "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN)
                                                                  .ru_maxrss / 1024, 1), "estimate_line": estimate}
    record.write_text(json.dumps(timing, indent=1) + "\n")
    return timing


def kv_needs(model, result: ContextResult, method: str) -> pd.Series:
    """Each KV head's need for the context by ``method`` (the largest score among its query heads)."""
    table = result.scores
    need = kv_need(model, dict(zip(zip(table["layer"], table["head"]), table[method])))
    return pd.Series(need).sort_index()


def agreement(a: pd.Series, b: pd.Series, replicates: int = DEFAULT_REPLICATES, seed: int = 0) -> dict:
    """Spearman ρ of two scores of the same KV heads, its 95% interval over resampled KV heads, and how many of
    the top 10% by ``b`` are in the top 10% by ``a``."""
    x, y = a.to_numpy(float), b.loc[a.index].to_numpy(float)
    rng = np.random.default_rng(seed)
    draws = [spearmanr(x[i], y[i]).statistic for i in (rng.integers(0, len(x), len(x)) for _ in range(replicates))]
    lo, hi = interval(np.array([d for d in draws if np.isfinite(d)]))
    k = math.ceil(0.1 * len(x))
    top_a, top_b = set(a.nlargest(k).index), set(b.nlargest(k).index)
    return {"rho": float(spearmanr(x, y).statistic), "rho_lo": float(lo), "rho_hi": float(hi), "top": k,
            "top_overlap": len(top_a & top_b)}


def shares_of(result: ContextResult) -> dict:
    """{ranking: {tolerance: [share, lo, hi]}} by perplexity and accuracy together, the scores' rankings only."""
    rows = result.shares[(result.shares.measure == "all") & ~result.shares.ranking.str.startswith("random/")]
    return {r: {f"{t:g}": [float(x) for x in rows[(rows.ranking == r) & (rows.tolerance == t)]
                [["share", "share_lo", "share_hi"]].iloc[0]] for t in TOLERANCES} for r in rows.ranking.unique()}


def full_model(result: ContextResult) -> dict:
    """The full model's tail NLL and task accuracy at this budget."""
    full = result.curve[result.curve.n_streaming == 0].iloc[0]
    return {"tail_nll": float(full.tail_nll), "accuracy": None if pd.isna(full.accuracy) else float(full.accuracy),
            "prompts": result.settings["n_prompts"]}


def budget(result: ContextResult) -> dict:
    keys = ("seq_len", "recent", "tail", "score_windows", "curve_windows", "random_seeds")
    return {k: result.settings[k] for k in keys}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--study", default="reports/smollm2-135m-instruct/context",
                   help="the committed study at the longer window")
    p.add_argument("--work", default="/tmp/headprune-bench-context", help="where the default run writes")
    p.add_argument("--out", default="reports/bench_context_budget.json")
    args = p.parse_args(argv)
    timing = run_command(args.model, Path(args.work))
    default, study = load_context(args.work), load_context(args.study)
    model = load_model(args.model)
    methods = [m for m in default.settings["methods"] if m in study.settings["methods"]]
    record = {"model": args.model, "default": budget(default) | timing | {"full": full_model(default)},
              "study": budget(study) | {"full": full_model(study)},
              "agreement": {m: agreement(kv_needs(model, default, m), kv_needs(model, study, m)) for m in methods},
              "shares": {"default": shares_of(default), "study": shares_of(study)}}
    d, s = record["default"], record["study"]
    print(f"{args.model}: headprune context at its default ({d['seq_len']}-token windows) took "
          f"{d['seconds'] / 60:.1f} min, peak {d['peak_rss_mib']:,.0f} MiB ({d['estimate_line'] or 'no estimate'})")
    print(f"full model: tail NLL {d['full']['tail_nll']:.4f} on the last {d['tail']} tokens of {d['seq_len']}-token "
          f"windows, {s['full']['tail_nll']:.4f} on the last {s['tail']} of {s['seq_len']} (each budget's own test "
          "windows: not a context effect)")
    for r, by_tol in record["shares"]["default"].items():
        print(f"{r}: largest share within " + "; ".join(
            f"{float(t):.0%}: {v[0]:.0%} [{v[1]:.0%}, {v[2]:.0%}] at {d['seq_len']}, "
            f"{record['shares']['study'][r][t][0]:.0%} [{record['shares']['study'][r][t][1]:.0%}, "
            f"{record['shares']['study'][r][t][2]:.0%}] at {s['seq_len']}" for t, v in by_tol.items()))
    for m, a in record["agreement"].items():
        print(f"{m}: rho {a['rho']:.2f} [{a['rho_lo']:.2f}, {a['rho_hi']:.2f}] between {d['seq_len']} and "
              f"{s['seq_len']} tokens; {a['top_overlap']} of the top {a['top']} in both")
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
