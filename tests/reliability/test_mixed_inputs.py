"""Issue 26, class 3: a teacher, scores, curves or ranks of another model or run are refused; a GPT-2 checkpoint
with its own LM head loads as transformers loads it (tied or not)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2LMHeadModel

from headprune.cli.main import main
from headprune.io.read.loading import load_model

from helpers import TINY, save_hf_gpt2


def _run(capsys, argv):
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def eval_text(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "eval.txt"
    path.write_text("Gardens, rivers and the long history of bridges over them. " * 60)
    return path


def test_finetune_teacher_must_be_the_export_source(tiny_dir, corpus, eval_text, tmp_path, capsys):
    pruned = tmp_path / "p"
    assert main(["prune", "--model", str(tiny_dir), "--heads", "L0H1", "--out", str(pruned), "--device", "cpu"]) == 0
    other = tmp_path / "other"
    save_hf_gpt2(other, seed=7, **TINY)
    capsys.readouterr()
    common = ["--steps", "1", "--seq-len", "16", "--batch-size", "2", "--train-data", str(corpus), "--data",
              str(eval_text), "--quiet", "--device", "cpu"]
    code, err = _run(capsys, ["finetune", str(pruned), "--out", str(tmp_path / "r1"), "--teacher", str(other), *common])
    assert code == 2 and "is not the model the export was pruned from" in err and err.count("\n") == 1
    assert not (tmp_path / "r1").exists()
    small = tmp_path / "short"
    save_hf_gpt2(small, **{**TINY, "n_positions": 32})
    capsys.readouterr()
    code, err = _run(capsys, ["finetune", str(pruned), "--out", str(tmp_path / "r2"), "--teacher", str(small), *common])
    assert code == 2 and f"the teacher {small} has n_positions 32" in err
    code, err = _run(capsys, ["finetune", str(pruned), "--out", str(tmp_path / "r3"), "--teacher", str(tiny_dir),
                              "--fold-value-bias", *common])
    assert code == 0, err


def _score(tiny_dir, data, out, tokens):
    assert main(["score", "--model", str(tiny_dir), "--data", str(data), "--max-tokens", str(tokens), "--methods",
                 "abl_zero,wo_fro", "--bootstrap", "0", "--out", str(out), "--quiet", "--device", "cpu"]) == 0


def test_report_refuses_scores_and_curves_of_different_runs(tiny_dir, corpus, eval_text, tmp_path, capsys):
    _score(tiny_dir, corpus, tmp_path / "a.csv", 300)
    _score(tiny_dir, corpus, tmp_path / "b.csv", 500)  # the same model, another run
    assert main(["curve", "--model", str(tiny_dir), "--data", str(eval_text), "--scores", str(tmp_path / "b.csv"),
                 "--fractions", "0,0.5,1", "--seeds", "1", "--bootstrap", "0", "--out", str(tmp_path / "cb.csv"),
                 "--quiet", "--device", "cpu"]) == 0
    capsys.readouterr()
    code, err = _run(capsys, ["report", "--scores", str(tmp_path / "a.csv"), "--curves", str(tmp_path / "cb.csv"),
                              "--out", str(tmp_path / "rep")])
    assert code == 2 and "ranked by another scores table" in err and not (tmp_path / "rep").exists()
    code, err = _run(capsys, ["report", "--scores", str(tmp_path / "b.csv"), "--curves", str(tmp_path / "cb.csv"),
                              "--out", str(tmp_path / "rep")])
    assert code == 0, err
    table = pd.read_csv(tmp_path / "b.csv").drop(columns="model_fingerprint")
    table.to_csv(tmp_path / "nofp.csv", index=False)
    code, err = _run(capsys, ["prune", "--model", str(tiny_dir), "--scores", str(tmp_path / "nofp.csv"), "--method",
                              "abl_zero", "--count", "2", "--out", str(tmp_path / "px"), "--device", "cpu"])
    assert code == 2 and "no model_fingerprint column" in err and not (tmp_path / "px").exists()


def test_ranks_must_agree_before_work(tiny_dir, corpus, tmp_path):
    """Two ranks of one torch.distributed group, started with different --max-tokens: both stop with one line."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, tokens in ((0, 300), (1, 400)):
        env = {**os.environ, "WORLD_SIZE": "2", "RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "HEADPRUNE_DIST_TIMEOUT": "60"}
        procs.append(subprocess.Popen([sys.executable, "-m", "headprune", "score", "--model", str(tiny_dir), "--data",
                                       str(corpus), "--max-tokens", str(tokens), "--methods", "abl_zero", "--out",
                                       str(tmp_path / "s.csv"), "--quiet", "--device", "cpu"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, err[-2000:]
        assert "the processes disagree on tokens" in err and "Traceback" not in err
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("tied_in_config", [True, False])
@pytest.mark.parametrize("head", ["own", "copy"])
def test_lm_head_loads_as_transformers_loads_it(tmp_path, tied_in_config, head):
    folder = tmp_path / "m"
    save_hf_gpt2(folder, **{**TINY, "tie_word_embeddings": tied_in_config})
    state = load_file(folder / "model.safetensors")
    wte = state["transformer.wte.weight"]
    state["lm_head.weight"] = torch.randn(wte.shape, generator=torch.Generator().manual_seed(3)) if head == "own" \
        else wte.clone()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    ours = load_model(folder)
    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    ids = torch.randint(0, TINY["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(ours(ids), hf(ids).logits, atol=1e-4, rtol=0)
    assert ours.cfg.tie_word_embeddings == (tied_in_config and head == "copy")
