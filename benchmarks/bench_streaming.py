"""Streaming heads at long contexts: peak resident memory and time of one attention layer's streaming output
(:func:`headprune.models.attention_ops.streaming_z`, blocks of queries against the keys they see) against the
explicit (T, T) probabilities (:func:`~headprune.models.attention_ops.streaming_probs` @ v), each in its own
process (the peak is ``ru_maxrss``), at SmolLM2-135M's shapes (9 query heads, d_k 64), one window.

    python -m benchmarks.bench_streaming [--lengths 2048,8192] [--sink 4] [--recent 256]

Prints one line per length: peak MiB above the inputs, seconds, and the ratios; the banded output is checked
against the explicit one (max |Δ|) at each length.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from headprune.models.attention_ops import streaming_probs, streaming_z

HEADS, D_HEAD = 9, 64


def measure(way: str, T: int, sink: int, recent: int) -> dict:
    """In this process: peak RSS growth (MiB) and seconds of one way at length T, and the output's checksum."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, T, D_HEAD, generator=g) for _ in range(3))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if way == "banded":
        z = streaming_z(q, k, v, D_HEAD ** -0.5, sink, recent)
    else:
        z = streaming_probs(q, k, D_HEAD ** -0.5, sink, recent) @ v
    seconds = time.perf_counter() - t0
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return {"mib": peak, "seconds": seconds, "z": z[0, :, ::97].flatten().tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--recent", type=int, default=256)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # way, T: the child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.sink, args.recent)))
        return
    torch.set_num_threads(1)
    for T in (int(t) for t in args.lengths.split(",")):
        out = {}
        for way in ("banded", "explicit"):
            cmd = [sys.executable, "-m", "benchmarks.bench_streaming", "--one", way, str(T),
                   "--sink", str(args.sink), "--recent", str(args.recent)]
            out[way] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        diff = max(abs(a - b) for a, b in zip(out["banded"]["z"], out["explicit"]["z"]))
        b, e = out["banded"], out["explicit"]
        print(f"T={T}: banded {b['mib']:.0f} MiB {b['seconds']:.2f} s | explicit (T,T) {e['mib']:.0f} MiB "
              f"{e['seconds']:.2f} s | memory {e['mib'] / max(b['mib'], 1):.1f}x less, "
              f"{e['seconds'] / b['seconds']:.1f}x faster | max |dz| {diff:.1e}")


if __name__ == "__main__":
    main()
