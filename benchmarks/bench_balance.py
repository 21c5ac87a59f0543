"""Per-rank busy time of the ablation sweep under torchrun: units shared i mod N against shared by cost.

    python -m benchmarks.bench_balance [--nproc 3] [--tokens 512] [--seq 256]

GPT-2 small architecture (12 layers × 12 heads), random weights, ``abl_zero`` on ``--tokens`` tokens in one
batch: 13 units (the baseline, then one per layer) whose costs fall from layer 0 to layer 11 by
(12·c + u)/(c + u) (:meth:`headprune.scoring.ablation.AblationScores.costs`). Both assignments run in the same
processes, one after the other; each rank's busy time is the CPU time (one thread per rank, so robust to other
load on the machine) of the units it computed, its cached forward included. Prints max/min over ranks, and
checks that both give the same scores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch


def worker(args) -> None:
    import torch.distributed as dist

    from headprune.io.read.loading import load_model
    from headprune.io.work.distributed import assign_units, init_from_env, rank_and_world, run_units
    from headprune.io.work.progress import NoProgress
    from headprune.perplexity import Windowing
    from headprune.scoring.ablation import AblationScores
    from headprune.scoring.base import ScoringContext

    init_from_env("cpu")
    rank, world = rank_and_world()
    model = load_model(args.dir)
    ids = torch.randint(0, model.cfg.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0))
    windowing = Windowing.for_model(model, args.seq, batch_size=args.tokens // args.seq)
    ctx = ScoringContext(model, windowing.batches(ids), ["abl_zero"], ablation_rows=8)
    family = AblationScores()
    rows = {}
    for mode in ("i mod N (equal costs)", "by cost (LPT)"):
        units = family.units(ctx)  # a fresh cache memo: each rank computes the cached forward it needs itself
        costs = family.costs(ctx, units)
        busy = [0.0]

        def timed(fn, busy=busy):
            def run():
                c0 = time.process_time()
                value = fn()
                busy[0] += time.process_time() - c0
                return value
            return run

        results = run_units([(k, timed(fn)) for k, fn in units], NoProgress(),
                            costs=None if mode.startswith("i mod") else costs)
        everyone: list[float] = [0.0] * world
        dist.all_gather_object(everyone, busy[0])
        share = assign_units([1.0] * len(costs) if mode.startswith("i mod") else costs, world)
        planned = [sum(costs[i] for i in s) for s in share]
        rows[mode] = (everyone, max(planned) / min(planned), results)
    if rank == 0:
        print(f"{world} ranks, {len(units)} units, GPT-2 small, {args.tokens} tokens in windows of {args.seq}\n")
        print("| assignment | busy CPU-s per rank | max/min measured | max/min of the modelled costs |")
        print("|---|---|---|---|")
        for mode, (busy_s, planned, _) in rows.items():
            print(f"| {mode} | {', '.join(f'{b:.1f}' for b in busy_s)} | {max(busy_s) / min(busy_s):.3f} | "
                  f"{planned:.3f} |")
        same = [r[2] for r in rows.values()]
        print(f"\nscores identical under both assignments: {same[0] == same[1]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=3)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dir", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    from benchmarks.common import gpt2_small_checkpoint

    folder = gpt2_small_checkpoint(args.dir or tempfile.mkdtemp(prefix="gpt2-small-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
           "-m", "benchmarks.bench_balance", "--worker", "--dir", str(folder), "--tokens", str(args.tokens),
           "--seq", str(args.seq)]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    main()
