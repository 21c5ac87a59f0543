"""The adaptive exact ranking (``headprune rank``) against a reference sweep on a real model: its time, what it
certifies, and the precision and recall of its certified top K against the reference's top K.

    python -m benchmarks.bench_adaptive [--model smollm2-135m-instruct] [--pool 16384] [--seq 128] [--top K]
                                        [--margin 0] [--cache DIR] [--adaptive-only | --compare-only]

Real weights (a packaged model, fetched and cached on first use), the default corpus' validation split, windows of
``--seq`` tokens. Two measurements on the same ``--pool`` tokens:

1. the adaptive ranking, ``headprune rank`` (abl_zero, top K by |ΔNLL|, 95%), run as that command and timed; its
   table and summary are kept in ``--cache`` (``adaptive_<model>_<pool>_<margin>.csv`` and ``.json``);
2. the reference: the exact sweep of every head on every window of the pool, ``headprune score --methods abl_zero``
   with its 95% bootstrap intervals, run as that command (resumable: an interrupted reference goes on where it
   stopped; a finished one is read from ``--cache``). ``--adaptive-only`` skips it and the comparison;
   ``--compare-only`` skips step 1 and compares the row already written with the ranking kept in ``--cache``.

Both commands use the machine's cores as their defaults do (two workers on 2 cores), so their times compare.

Then the certified heads against the reference's top K by |abl_zero|: precision (certified heads in it / certified)
and recall (certified heads in it / K), with the same for the adaptive ranking's K largest |ΔNLL| whether certified
or not, and how many of the reference's own top K its bootstrap intervals separate from the (K+1)-th head. Prints
and writes a row to ``reports/bench_adaptive.json`` (replacing the row of the same model, pool, window, first
windows and margin). The adaptive ranking runs first, alone on the machine; compare its time with the reference's
only where the reference also ran alone, and a resumed run's time (written as null) not at all.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd


def _command(args: argparse.Namespace, *extra: str) -> list[str]:
    return [sys.executable, "-m", "headprune", *extra[:1], "--model", args.model, "--data", "default", "--seq-len",
            str(args.seq), "--max-tokens", str(args.pool), *extra[1:]]


def adaptive(args: argparse.Namespace, cache: Path) -> tuple[pd.DataFrame, dict, float | None]:
    """``headprune rank`` on the pool: its table, its summary and its seconds (None where it resumed an interrupted
    ranking: the time of a part)."""
    out = cache / f"adaptive_{args.model}_{args.pool}_{args.margin:g}.csv"
    top = [] if args.top is None else ["--top", str(args.top)]
    resumed = any(cache.glob(out.name + ".progress*"))
    t0 = time.perf_counter()
    subprocess.run(_command(args, "rank", "--first-windows", str(args.first_windows), "--margin", str(args.margin),
                            *top, "--out", str(out)), check=True)
    seconds = None if resumed else time.perf_counter() - t0
    return pd.read_csv(out), json.loads(out.with_suffix(".json").read_text()), seconds


def reference(args: argparse.Namespace, cache: Path) -> tuple[pd.DataFrame, float | None]:
    """The exact abl_zero sweep on the pool (the ``score`` command's table) and its seconds where this call ran it
    to the end in one go (None: read from the cache or resumed)."""
    out = cache / f"ref_{args.model}_abl_zero_{args.pool}.csv"
    if out.exists():
        return pd.read_csv(out), None
    resumed = any(cache.glob(out.name + ".progress*"))
    t0 = time.perf_counter()
    subprocess.run(_command(args, "score", "--methods", "abl_zero", "--bootstrap", "200", "--out", str(out)),
                   check=True)
    return pd.read_csv(out), None if resumed else time.perf_counter() - t0


def compare(table: pd.DataFrame, ref: pd.DataFrame, k: int) -> dict:
    """Precision and recall of the certified heads, and of the adaptive K largest, against the reference's top K;
    how many of the reference's top K its intervals separate from the (K+1)-th."""
    ref = ref.assign(size=ref["abl_zero"].abs()).sort_values("size", ascending=False, kind="stable")
    truth = set(ref["head_id"].head(k))
    certified = set(table.loc[table["status"] == "in", "head_id"])
    point = set(table.assign(size=table["delta"].abs()).nlargest(k, "size")["head_id"])
    edge = ref["size"].iloc[k]  # the (K+1)-th |abl_zero|
    low = np.where(ref["abl_zero_ci_lo"] > 0, ref["abl_zero_ci_lo"],
                   np.where(ref["abl_zero_ci_hi"] < 0, -ref["abl_zero_ci_hi"], 0.0))
    return {"certified_precision": len(certified & truth) / len(certified) if certified else None,
            "certified_recall": len(certified & truth) / k,
            "point_precision": len(point & truth) / k,
            "reference_separated": int((low[:k] > edge).sum()),
            "certified_not_in_reference_top": sorted(certified - truth),
            "reference_top": ref["head_id"].head(k).tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--pool", type=int, default=16384, help="tokens of the validation split")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--top", type=int, default=None, help="K (default 10%% of the heads)")
    parser.add_argument("--first-windows", type=int, default=8)
    parser.add_argument("--margin", type=float, default=0.0, help="rank's --margin (nats/token)")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "headprune" / "bench"))
    parser.add_argument("--adaptive-only", action="store_true")
    parser.add_argument("--compare-only", action="store_true")
    parser.add_argument("--out", default="reports/bench_adaptive.json")
    args = parser.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    path = Path(args.out)
    rows = json.loads(path.read_text()) if path.exists() else []

    def key(r: dict) -> tuple:
        return r["model"], r["pool_tokens"], r["seq_len"], r["first_windows"], r["margin"]

    if args.compare_only:
        ranked = cache / f"adaptive_{args.model}_{args.pool}_{args.margin:g}.csv"
        table = pd.read_csv(ranked)
        row = next(r for r in rows if key(r) == (args.model, args.pool, args.seq, args.first_windows, args.margin))
    else:
        table, summary, seconds = adaptive(args, cache)
        row = {"model": args.model, "heads": len(table), "pool_tokens": args.pool, "seq_len": args.seq,
               "top": summary["top"], "level": summary["level"], "margin": args.margin,
               "first_windows": args.first_windows,
               "adaptive_s": None if seconds is None else round(seconds, 1), "certified": len(summary["certified"]),
               "contested": len(summary["contested"]), "open_places": summary["open_places"],
               "head_windows": summary["head_windows"],
               "plain_sweep_head_windows": summary["plain_sweep_head_windows"], "rounds": summary["rounds"]}
    if not args.adaptive_only:
        ref, ref_seconds = reference(args, cache)
        row |= {"reference_s": None if ref_seconds is None else round(ref_seconds, 1)} | compare(table, ref,
                                                                                                   row["top"])
    print(json.dumps(row, indent=1))
    path.write_text(json.dumps([r for r in rows if key(r) != key(row)] + [row], indent=1) + "\n")


if __name__ == "__main__":
    main()
