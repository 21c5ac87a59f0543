"""The verified ranking against the exact sweep on a real model: time, the recall of the exact top K, the bound.

    python -m benchmarks.bench_verified [--model smollm2-135m-instruct] [--tokens 1024] [--seq 512]

Real weights (a packaged model, fetched and cached on first use), the default corpus' validation split. Both runs in
one process, one after the other, on the same tokens: ``score_heads(..., "abl_zero")`` (the exact sweep of every
head) and ``score_heads(..., "taylor")`` + :func:`~headprune.scoring.verified.verify_ranking` (estimate, exact top
10%, 32 subsets). Prints and writes ``reports/bench_verified.json``: seconds of each, the recall of the exact top K
by the verified set, the certified recall, the bound and the largest exact |abl_zero| outside the verified set.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from headprune import load_model, tokens
from headprune.perplexity import Windowing
from headprune.scoring import ScoringOptions, score_heads
from headprune.scoring.verified import recall_at_k, verify_ranking


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--out", default="reports/bench_verified.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = load_model(args.model)
    ids = tokens("default", "validation", model, args.tokens)
    w = Windowing.resolve(model.cfg.n_positions, args.seq, args.seq, 8)
    options = ScoringOptions(bootstrap=0)

    t0 = time.perf_counter()
    exact = score_heads(model, ids, "abl_zero", w, options, show_progress=False).table["abl_zero"].to_numpy()
    sweep_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    taylor = score_heads(model, ids, "taylor", w, options, show_progress=False).table["taylor"].to_numpy()
    result = verify_ranking(model, ids, taylor, windowing=w, show_progress=False)
    verify_s = time.perf_counter() - t0

    verified = result.table["verified"].to_numpy()
    row = {"model": args.model, "heads": len(exact), "tokens": len(ids), "seq_len": w.seq_len,
           "threads": torch.get_num_threads(), "exact_sweep_s": round(sweep_s, 1), "verified_s": round(verify_s, 1),
           "speedup": round(sweep_s / verify_s, 2), "verified": int(verified.sum()),
           "recall_at_k": recall_at_k(exact, verified), "recall_certified": result.recall_lower,
           "bound": result.bound, "largest_unverified_exact": float(np.abs(exact[~verified]).max()),
           "smallest_verified_exact": result.threshold,
           "spearman_taylor_abl_zero": float(spearmanr(taylor, exact).statistic),
           "exact_matches_sweep": float(np.abs(result.table["exact"].to_numpy()[verified] - exact[verified]).max())}
    print(json.dumps(row, indent=1))
    path = Path(args.out)
    rows = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in rows if (r["model"], r["tokens"], r["seq_len"]) != (args.model, len(ids), w.seq_len)] + [row]
    path.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
