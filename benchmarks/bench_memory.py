"""Peak resident memory of each command on real models, each run as its own process (what a user sees).

    python -m benchmarks.bench_memory [--models smollm2-135m-instruct,gemma-3-270m] [--max-tokens 2048]
        [--commands eval,score,score_ablation,curve,patch,anatomy,run] [--limit-s 900] [--root DIR]

Budgets (stated in the table): ``--max-tokens`` tokens per corpus (two windows of 1024 at the default 2048: the
window is what sets a forward's size, the token count only how many forwards run); ``score`` with the cheap methods
``wo_fro,grad,taylor``; ``score_ablation`` the exact ``abl_zero`` sweep on one window (``--max-tokens 1024``);
``curve`` ranks by ``wo_fro`` at fractions 0 and 0.5 with one random seed; ``patch`` the built-in induction task
(32 pairs); ``run`` the cheap methods. A command still running after ``--limit-s`` seconds is stopped and its peak
so far reported (marked "stopped"): the peak of a sweep comes in its first units, which hold the same tensors as
the rest. The peak is the process' maximum resident set size (``wait4``'s ``ru_maxrss``, as ``/usr/bin/time -v``
reports it). ``score`` and ``curve`` run one worker (``--workers 1``): a stopped command's children are not reaped,
so their peak would be lost, and each of several workers holds what one does. ``--root`` runs another checkout's
``headprune`` (e.g. the code before a change) for a before/after table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("eval", "score", "score_ablation", "curve", "patch", "anatomy", "run")


def argv_of(command: str, model: str, max_tokens: int, tmp: Path) -> list[str]:
    """The headprune arguments of one measured command."""
    common = ["--model", model, "--device", "cpu", "--quiet"]
    scores = tmp / f"{model}-scores.csv"
    if command == "eval":
        return ["eval", *common, "--max-tokens", str(max_tokens), "--json"]
    if command == "score":
        return ["score", *common, "--workers", "1", "--max-tokens", str(max_tokens), "--methods", "wo_fro,grad,taylor",
                "--out", str(scores), "--overwrite"]
    if command == "score_ablation":
        return ["score", *common, "--workers", "1", "--max-tokens", "1024", "--methods", "abl_zero", "--bootstrap", "0",
                "--out", str(tmp / f"{model}-abl.csv"), "--overwrite"]
    if command == "curve":
        if not scores.exists():  # the curve ranks by a scores table: make one (weights only, seconds)
            subprocess.run([sys.executable, "-m", "headprune", "score", *common, "--methods", "wo_fro",
                            "--bootstrap", "0", "--out", str(scores), "--overwrite"], check=True, cwd=ROOT)
        return ["curve", *common, "--workers", "1", "--max-tokens", str(max_tokens), "--scores", str(scores),
                "--methods", "wo_fro",
                "--fractions", "0,0.5", "--seeds", "1", "--bootstrap", "0", "--out", str(tmp / f"{model}-curve.csv"),
                "--overwrite"]
    if command == "patch":
        return ["patch", *common, "--task", "induction", "--out", str(tmp / f"{model}-patch.csv"), "--overwrite"]
    if command == "anatomy":  # (anatomy has no progress bars, hence no --quiet)
        return ["anatomy", *common[:-1], "--max-tokens", str(max_tokens), "--out", str(tmp / f"{model}-anatomy")]
    if command == "run":
        return ["run", *common, "--max-tokens", str(max_tokens), "--methods", "wo_fro,grad,taylor",
                "--out", str(tmp / f"{model}-run"), "--overwrite"]
    raise ValueError(f"unknown command {command}")


def peak_rss(argv: list[str], root: Path, limit_s: float) -> tuple[float, float, str]:
    """(peak RSS in GiB, seconds, how it ended) of ``python -m headprune *argv`` run in ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "headprune", *argv], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(limit_s, stop)
    timer.start()
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    seconds = time.perf_counter() - t0
    if stopped.is_set():
        how = f"stopped at {limit_s:.0f} s"
    elif os.waitstatus_to_exitcode(status) == 0:
        how = "finished"
    else:
        how = f"failed: {err.strip().splitlines()[-1] if err.strip() else status}"
    return usage.ru_maxrss / 2**20, seconds, how  # ru_maxrss is in KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--limit-s", type=float, default=900.0, help="stop a command after this many seconds")
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose headprune runs (default: this one)")
    args = ap.parse_args()
    print("| model | command | budget | peak RSS (GiB) | wall s | ended |\n|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for model in args.models.split(","):
            for command in args.commands.split(","):
                argv = argv_of(command, model, args.max_tokens, tmp)
                dropped = {"--quiet", "--json", "--overwrite", "--model", model, "--device", "cpu", "--out"}
                budget = " ".join(a for a in argv[1:] if a not in dropped and not a.startswith(str(tmp)))
                gib, seconds, how = peak_rss(argv, args.root.resolve(), args.limit_s)
                print(f"| {model} | {command} | `{budget}` | {gib:.2f} | {seconds:.0f} | {how} |", flush=True)


if __name__ == "__main__":
    main()
