"""Sweeps sharded over two processes with torch.distributed (gloo, CPU) write exactly the single-process tables."""

import json
import os
import subprocess
import sys

import pytest

from headprune.schema import parse_methods, score_columns

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import pydoc_data.topics

    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text(" ".join(list(pydoc_data.topics.topics.values())[:20])[:8000])
    return path


def _headprune(tmp_path, args, nproc: int = 1):
    """``python -m headprune ARGS`` alone, or under torchrun with ``nproc`` processes on a free port."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)] if nproc > 1 else []
    # one thread everywhere (torchrun's default for its workers), so only the sharding differs between the runs
    env = {**os.environ, "HEADPRUNE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *launcher, "-m", "headprune", *args, "--device", "cpu", "--quiet"],
                          check=False, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _units(progress) -> list[str]:
    return [json.loads(line)["unit"] for line in progress.read_text().splitlines()[1:]]


@pytest.fixture(scope="module")
def scores(tiny_dir, corpus, tmp_path_factory):
    """Every method scored by one process and by two; the two tables must be the same bytes."""
    tmp = tmp_path_factory.mktemp("scores")
    args = ["score", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "400", "--seq-len", "64",
            "--batch-size", "2", "--ablation-rows", "4", "--methods", "all"]
    _headprune(tmp, args + ["--out", str(tmp / "one.csv")])
    _headprune(tmp, args + ["--out", str(tmp / "two.csv")], nproc=2)
    return tmp


def test_torchrun_score_equals_one_process(scores):
    one, two = (scores / "one.csv").read_bytes(), (scores / "two.csv").read_bytes()
    assert one.splitlines()[0].decode().split(",") == score_columns(parse_methods("all"))
    assert two == one
    assert not list(scores.glob("*.progress.jsonl*"))  # every rank removed its own progress file


def test_torchrun_curve_equals_one_process(scores, tiny_dir, corpus, tmp_path):
    args = ["curve", "--model", str(tiny_dir), "--data", str(corpus), "--scores", str(scores / "one.csv"),
            "--methods", "all", "--fractions", "0,0.5", "--seeds", "2", "--compensate", "mean", "--score-data",
            str(corpus), "--max-tokens", "300", "--batch-size", "2"]
    _headprune(tmp_path, args + ["--out", str(tmp_path / "one.csv")])
    _headprune(tmp_path, args + ["--out", str(tmp_path / "two.csv")], nproc=2)
    one = (tmp_path / "one.csv").read_bytes()
    assert one.count(b"\n") == 1 + 2 * 10 * 2 + 2  # header, 10 importances x none/mean x 2 fractions, random
    assert (tmp_path / "two.csv").read_bytes() == one
    assert not list(tmp_path.glob("*.progress.jsonl*"))


def test_torchrun_run_equals_one_process(tiny_dir, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_TEST_KEEP_PROGRESS", "1")  # a finished run removes them: kept to see the shares
    args = ["run", "--model", str(tiny_dir), "--data", str(corpus), "--score-data", str(corpus), "--max-tokens", "300",
            "--batch-size", "2", "--fractions", "0,0.5", "--seeds", "2",
            "--methods", "wo_fro,fluct,grad,abl_zero"]  # units of every kind: weights, activations, gradients, ablation
    one, two = tmp_path / "one", tmp_path / "two"
    _headprune(tmp_path, args + ["--out", str(one)])
    _headprune(tmp_path, args + ["--out", str(two)], nproc=2)
    for name in ["scores.csv", "curves.csv", "baseline.json", "predictiveness.csv"]:
        assert (two / name).read_bytes() == (one / name).read_bytes(), name
    # the two ranks shared the units: each computed every other one, none twice, all of them together
    units = _units(one / ".progress.jsonl")
    rank0, rank1 = (_units(two / f".progress.jsonl.rank{r}-of-2") for r in (0, 1))
    assert sorted(rank0 + rank1) == sorted(units) and rank0 and rank1 and not set(rank0) & set(rank1)
    assert not (two / ".progress.jsonl").exists()


def test_torchrun_score_and_curve_on_a_gqa_llama_equal_one_process(corpus, tmp_path):
    """The same on a grouped-query Llama (6 query / 3 KV heads, its own tokenizer): every kind of scoring unit
    (weights, activations, gradients, ablations) and the mean-compensated curves give the same bytes from one
    process and from two."""
    from tests.cli.test_families_cli import save_tokenizer
    from tests.helpers import save_gqa_family

    folder = tmp_path / "llama"
    save_gqa_family("llama", folder, 320, seed=3)
    save_tokenizer(folder, corpus.read_text())
    args = ["score", "--model", str(folder), "--data", str(corpus), "--max-tokens", "300", "--seq-len", "32",
            "--batch-size", "2", "--ablation-rows", "4", "--methods", "wo_fro,fluct,grad,abl_zero,abl_mean"]
    _headprune(tmp_path, args + ["--out", str(tmp_path / "one.csv")])
    _headprune(tmp_path, args + ["--out", str(tmp_path / "two.csv")], nproc=2)
    one = (tmp_path / "one.csv").read_bytes()
    assert (tmp_path / "two.csv").read_bytes() == one
    assert len(one.decode().splitlines()) == 1 + 2 * 6
    curve = ["curve", "--model", str(folder), "--data", str(corpus), "--scores", str(tmp_path / "one.csv"),
             "--methods", "wo_fro,abl_zero", "--fractions", "0,0.5", "--seeds", "2", "--compensate", "mean",
             "--score-data", str(corpus), "--max-tokens", "300", "--seq-len", "32", "--batch-size", "2"]
    _headprune(tmp_path, curve + ["--out", str(tmp_path / "curve-one.csv")])
    _headprune(tmp_path, curve + ["--out", str(tmp_path / "curve-two.csv")], nproc=2)
    curves = (tmp_path / "curve-one.csv").read_bytes()
    assert curves.count(b"\n") == 1 + 2 * 2 * 2 + 2  # header, 2 importances x none/mean x 2 fractions, random
    assert (tmp_path / "curve-two.csv").read_bytes() == curves


# ---------------------------------------------------------------- two "nodes" on one machine (c10d rendezvous)

SCORE = ["score", "--max-tokens", "400", "--seq-len", "64", "--batch-size", "2", "--ablation-rows", "4",
         "--methods", "wo_fro,fluct,grad,abl_zero,abl_mean"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, seconds: float = 120) -> None:
    import socket
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on port {port}")


def _node(tmp_path, args, port: int, nproc: int, **env):
    """One "machine" of a 2-node torchrun job: its own agent, the c10d rendezvous at localhost:port."""
    launcher = ["-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(nproc), "--rdzv-backend",
                "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "headprune-test", "--max-restarts", "0"]
    env = {**os.environ, "HEADPRUNE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen([sys.executable, *launcher, "-m", "headprune", *args, "--device", "cpu", "--quiet"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def reference(tiny_dir, corpus, tmp_path_factory):
    """The single-process scores every multi-process run below must reproduce byte for byte."""
    tmp = tmp_path_factory.mktemp("reference")
    _headprune(tmp, SCORE + ["--model", str(tiny_dir), "--data", str(corpus), "--out", str(tmp / "one.csv")])
    return (tmp / "one.csv").read_bytes()


def test_two_nodes_equal_one_process(reference, tiny_dir, corpus, tmp_path):
    """torchrun --nnodes 2 --nproc-per-node 2 (two agents, a c10d rendezvous on localhost): 4 ranks, same bytes."""
    args, port = (SCORE + ["--model", str(tiny_dir), "--data", str(corpus), "--out", str(tmp_path / "four.csv")],
                  _free_port())
    nodes = [_node(tmp_path, args, port, 2) for _ in range(2)]
    for node in nodes:
        _, err = node.communicate(timeout=600)
        assert node.returncode == 0, err[-3000:]
    assert (tmp_path / "four.csv").read_bytes() == reference
    assert not list(tmp_path.glob("*.progress.jsonl*"))


def test_dead_node_fails_the_others_then_resume_with_other_count(reference, tiny_dir, corpus, tmp_path):
    """Node 2's ranks die (SIGKILL) after one unit each: node 1's ranks stop within HEADPRUNE_DIST_TIMEOUT (5 s)
    plus a unit, with one clear line, not a hang. Rerunning with 3 processes resumes the 4-rank progress files
    and writes the single-process bytes."""
    import time

    out = tmp_path / "s.csv"
    args, port = SCORE + ["--model", str(tiny_dir), "--data", str(corpus), "--out", str(out)], _free_port()
    survivor = _node(tmp_path, args, port, 2, HEADPRUNE_DIST_TIMEOUT="5")
    _wait_listening(port)  # the surviving node's agent hosts the rendezvous (as node 0 of a cluster would)
    dying = _node(tmp_path, args, port, 2, HEADPRUNE_DIST_TIMEOUT="5", HEADPRUNE_TEST_KILL_AFTER_UNITS="1")
    dying.communicate(timeout=600)
    died = time.monotonic()
    _, err = survivor.communicate(timeout=600)
    assert dying.returncode != 0 and survivor.returncode != 0
    assert time.monotonic() - died < 30, "the surviving node did not stop within a bounded time"
    lines = [line for line in err.splitlines() if line.startswith("headprune: error:")]
    assert lines and all(("stopped (no heartbeat for 5 s)" in line or "lost the torch.distributed store" in line)
                         and "rerun the same command to resume" in line for line in lines), err[-3000:]
    shards = sorted(p.name for p in tmp_path.glob("s.csv.progress.jsonl.rank*-of-4"))
    assert len(shards) >= 2 and not out.exists()
    done = {u for p in tmp_path.glob("s.csv.progress.jsonl.rank*-of-4") for u in _units(p)}
    assert done  # work to resume from

    _headprune(tmp_path, args, nproc=3)
    assert out.read_bytes() == reference
    assert not list(tmp_path.glob("*.progress.jsonl*"))  # the 4-rank files went with the 3-rank ones
