"""Start-up time: ``headprune --help``, and ``headprune eval --max-tokens 2048`` on the default corpus with an
empty cache (cold: parses the standard library's documentation and tokenizes) against a filled one (warm:
reads the cached documents and token ids).

    python -m benchmarks.bench_start [--repeats 3] [--max-tokens 2048]

Each command runs in a fresh process (what a user waits for), repeats interleaved; prints the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _seconds(argv: list[str], cache: Path) -> float:
    env = {**os.environ, "HEADPRUNE_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "headprune", *argv], check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=2048)
    args = ap.parse_args()
    evaluate = ["eval", "--max-tokens", str(args.max_tokens), "--json", "--device", "cpu"]
    times: dict[str, list[float]] = {"--help": [], "eval cold": [], "eval warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            cache = Path(tmp, f"cache{i}")  # empty: nothing parsed or tokenized yet
            times["--help"].append(_seconds(["--help"], cache))
            times["eval cold"].append(_seconds(evaluate, cache))
            times["eval warm"].append(_seconds(evaluate, cache))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"headprune --help: {med['--help']:.2f} s (no torch)")
    print(f"headprune {' '.join(evaluate)}: cold {med['eval cold']:.2f} s, warm {med['eval warm']:.2f} s "
          f"(warm/cold = {med['eval warm'] / med['eval cold']:.2f}; "
          f"the cache saves {med['eval cold'] - med['eval warm']:.2f} s)")


if __name__ == "__main__":
    main()
