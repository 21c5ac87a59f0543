"""The LM head's NLL (:func:`headprune.models.nll.unembed_nll`) at several chunk sizes, on a packaged real model.

    python -m benchmarks.bench_lm_head [--model gemma-3-270m] [--windows 8] [--seq 128] [--processes 2]
                                       [--budgets 64,128,256,512] [--repeats 3]

At Gemma 3's vocabulary of 262,144 the LM head is 62% of a forward's FLOPs, and every ablation and curve point
ends in it. The final residual stream of ``--windows`` windows of ``--seq`` tokens (random: speed does not depend
on the values) goes through the final norm, the LM head and the log-softmax in chunks of ``budget`` MiB of fp32
logits, the budgets interleaved, in ``--processes`` single-threaded processes at once (as ``run``'s workers share
the machine). Prints each budget's median seconds per process and its ratio to the default's
(:data:`~headprune.models.nll.NLL_LOGITS_BYTES`), checks every budget's NLLs against the default's (the matmul's
rounding may differ with the rows), and writes ``reports/bench_lm_head.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoConfig

from benchmarks.common import time_interleaved
from headprune.io.read.loading import load_model
from headprune.io.read.packaged import packaged_folder
from headprune.models.nll import NLL_LOGITS_BYTES, nll_rows, unembed_nll

MIB = 2**20


def measure(args: argparse.Namespace) -> dict:
    """In this process, single-threaded: median seconds of each budget, and the largest NLL difference to the
    default budget's."""
    torch.set_num_threads(1)
    model = load_model(args.model)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.vocab_size, (args.windows, args.seq), generator=gen)
    resid = torch.randn(args.windows, args.seq, model.cfg.d_model, generator=gen)
    budgets = [int(b) for b in args.budgets.split(",")]
    with torch.no_grad():
        calls = {b: (lambda b=b: unembed_nll(model, resid, tokens, budget_bytes=b * MIB)) for b in budgets}
        seconds = time_interleaved(calls, args.repeats)
        default = unembed_nll(model, resid, tokens)
        diff = max(float((calls[b]() - default).abs().max()) for b in budgets)
    return {"seconds": {str(b): seconds[b] for b in budgets}, "max_nll_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--budgets", default="64,128,256,512", help="MiB of fp32 logits per chunk")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    argv = [sys.executable, "-m", "benchmarks.bench_lm_head", *sys.argv[1:], "--child"]
    children = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(args.processes)]
    outputs = [c.communicate()[0] for c in children]
    if any(c.returncode for c in children):
        raise SystemExit(f"a measuring process failed (exit codes {[c.returncode for c in children]})")
    found = [json.loads(o.strip().splitlines()[-1]) for o in outputs]
    budgets = list(found[0]["seconds"])
    median = {b: statistics.median(f["seconds"][b] for f in found) for b in budgets}
    default = str(NLL_LOGITS_BYTES // MIB)
    vocab = AutoConfig.from_pretrained(packaged_folder(args.model)).vocab_size
    rows = {b: nll_rows(vocab, int(b) * MIB) for b in budgets}
    for b in budgets:
        ratio = f", {median[b] / median[default]:.2f}x the default's" if default in median else ""
        print(f"{b:>4} MiB ({rows[b]} rows a chunk): {median[b]:.2f} s per process for {args.windows} windows of "
              f"{args.seq}{ratio}")
    diff = max(f["max_nll_diff"] for f in found)
    print(f"largest NLL difference to the default budget's: {diff:.1e}")
    assert diff < 1e-4, diff
    out = {"model": args.model, "windows": args.windows, "seq": args.seq, "processes": args.processes,
           "default_mib": int(default), "rows": rows, "median_seconds": median, "max_nll_diff": diff}
    Path("reports/bench_lm_head.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
