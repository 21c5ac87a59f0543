"""Cost estimates against measured time: every command that says what it will cost, run as a user runs it.

    python -m benchmarks.bench_estimates [--models stdlib-gpt2-mini,smollm2-135m-instruct] [--workers 1,2]
                                         [--out reports/bench_estimates.jsonl]

For each model, worker count and cache state (cold: an empty token cache; warm: the same cache again), runs
``score``, ``curve`` (on that score's table), ``verify``, ``patch`` and ``run`` as subprocesses, reads the line
``estimated time: LOW to HIGH (about POINT) ...`` each prints (stdout or stderr, where ``run`` logs), and times the
command from that line to its exit: the work the estimate covers (loading and tokenizing come before it). Prints
one row per case: the estimate, the measured seconds, measured / point and whether the measurement lies in the
printed range and within 2x of the point. Each finished case is appended to ``--out`` (JSON lines) and skipped when
the benchmark runs again, so an interrupted run resumes. SmolLM2 runs on fewer tokens (``SETTINGS``) so that the
whole benchmark takes about an hour on 2 cores; the estimates are proportional to the tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

#: Token settings per model: the shipped model at its defaults (the run on fewer tokens), SmolLM2 on a few windows.
SETTINGS = {
    "stdlib-gpt2-mini": {"all": [], "run": ["--max-tokens", "2048"]},
    "smollm2-135m-instruct": {"all": ["--max-tokens", "256", "--seq-len", "128"], "run": []},
}
PATCH_TASK = {"stdlib-gpt2-mini": "brackets", "smollm2-135m-instruct": "induction"}
LINE = re.compile(r"estimated time: (.+?) to (.+?) \(about (.+?)\)")
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}


def seconds(text: str) -> float:
    """'41 s', '3.5 min', '1.2 h' in seconds."""
    value, unit = text.split()
    return float(value) * UNITS[unit]


def commands(model: str, work: Path) -> dict[str, list[str]]:
    common = ["--model", model, *SETTINGS[model]["all"]]
    scores = work / "scores.csv"
    return {
        "score": ["score", *common, "--out", str(scores), "--overwrite"],
        "curve": ["curve", *common, "--scores", str(scores), "--out", str(work / "curve.csv"), "--overwrite"],
        "verify": ["verify", *common, "--out", str(work / "verify.csv"), "--overwrite"],
        "patch": ["patch", "--model", model, "--task", PATCH_TASK[model], "--out", str(work / "patch.csv"),
                  "--overwrite"],
        "run": ["run", *common, *SETTINGS[model]["run"], "--out", str(work / "run"), "--overwrite"],
    }


def timed(argv: list[str], env: dict[str, str]) -> dict:
    """Run ``headprune argv``; the estimate it printed and the seconds from that line to the exit."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(["headprune", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, bufsize=1)
    found, at, lines = None, None, []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if found is None and (m := LINE.search(line)):
            found, at = m, time.perf_counter()
    if proc.wait() != 0 or found is None or at is None:
        raise SystemExit(f"headprune {' '.join(argv)} failed or printed no estimate:\n" + "\n".join(lines[-10:]))
    end = time.perf_counter()
    low, high, point = (seconds(found.group(i)) for i in (1, 2, 3))
    return {"low": low, "point": point, "high": high, "measured": end - at, "wall": end - t0,
            "line": found.group(0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SETTINGS))
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--commands", default="score,curve,verify,patch,run")
    ap.add_argument("--out", type=Path, default=Path("reports/bench_estimates.jsonl"))
    args = ap.parse_args()
    done = {}
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            row = json.loads(line)
            done[(row["model"], row["workers"], row["cache"], row["command"])] = row
    print("| model | workers | cache | command | estimate (s) | measured (s) | measured / point | in range | "
          "within 2x |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    for model in args.models.split(","):
        for workers in args.workers.split(","):
            with tempfile.TemporaryDirectory(prefix="bench-estimates-") as tmp:
                work = Path(tmp)
                env = os.environ | {"HEADPRUNE_CACHE": str(work / "cache"), "HEADPRUNE_WORKERS": workers}
                for cache in ("cold", "warm"):
                    for command, argv in commands(model, work).items():
                        if command not in args.commands.split(","):
                            continue
                        key = (model, int(workers), cache, command)
                        row = done.get(key)
                        if row is None:
                            shutil.rmtree(work / "run", ignore_errors=True)  # the run starts afresh each time
                            row = dict(zip(("model", "workers", "cache", "command"), key)) | timed(argv, env)
                            with args.out.open("a") as f:
                                f.write(json.dumps(row) + "\n")
                        ratio = row["measured"] / row["point"]
                        print(f"| {model} | {workers} | {cache} | {command} | {row['low']:.0f} to {row['high']:.0f} "
                              f"(about {row['point']:.0f}) | {row['measured']:.1f} | {ratio:.2f} | "
                              f"{'yes' if row['low'] <= row['measured'] <= row['high'] else 'no'} | "
                              f"{'yes' if 0.5 <= ratio <= 2 else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
