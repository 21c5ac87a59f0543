"""Sweeps sharded over two processes with torch.distributed (gloo) equal the single-process result."""

import os
import subprocess
import sys

import pandas as pd

from headprune.cli import main


def test_torchrun_two_processes_equal_one(tiny_dir, tmp_path, monkeypatch):
    import pydoc_data.topics

    corpus = tmp_path / "c.txt"
    corpus.write_text(" ".join(list(pydoc_data.topics.topics.values())[:20])[:8000])
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path / "cache"))
    args = ["score", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "400", "--seq-len", "64",
            "--batch-size", "2", "--methods", "fluct,taylor,abl_zero,abl_mean", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "one.csv")]) == 0
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "headprune",
                           *args, "--out", str(tmp_path / "two.csv")],
                          env={**os.environ, "HEADPRUNE_CACHE": str(tmp_path / "cache")}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    one, two = pd.read_csv(tmp_path / "one.csv"), pd.read_csv(tmp_path / "two.csv")
    methods = ["fluct", "taylor", "abl_zero", "abl_mean"]
    assert (one[methods] - two[methods]).abs().max().max() <= 1e-9
    assert not list(tmp_path.glob("*.progress.jsonl*"))  # every rank cleaned up its own progress file
