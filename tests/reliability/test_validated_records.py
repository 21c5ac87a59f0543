"""Issue 26, class 4: edited tables and records are refused with one line, never dropped or trusted."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from headprune.cli.main import main
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.pruning.gates import GateOptions, learn_gates


def _run(capsys, argv):
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def run_tables(tiny_dir, corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("tables")
    assert main(["score", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "300", "--methods",
                 "abl_zero,wo_fro", "--bootstrap", "0", "--out", str(d / "s.csv"), "--quiet", "--device", "cpu"]) == 0
    assert main(["curve", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "300", "--scores",
                 str(d / "s.csv"), "--fractions", "0,0.5,1", "--seeds", "1", "--bootstrap", "0", "--out",
                 str(d / "c.csv"), "--quiet", "--device", "cpu"]) == 0
    return d


@pytest.mark.parametrize("edit", ["nan", "inf", "missing_row"])
def test_edited_scores_are_refused_by_report_prune_and_curve(tiny_dir, corpus, run_tables, tmp_path, capsys, edit):
    table = pd.read_csv(run_tables / "s.csv", dtype={"model_fingerprint": str})
    if edit == "missing_row":
        table = table.drop(index=5)
    else:
        table.loc[3, "abl_zero"] = float(edit)
    table.to_csv(tmp_path / "s.csv", index=False)
    code, err = _run(capsys, ["report", "--scores", str(tmp_path / "s.csv"), "--curves", str(run_tables / "c.csv"),
                              "--out", str(tmp_path / "rep")])
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "rep").exists(), err
    code, err = _run(capsys, ["prune", "--model", str(tiny_dir), "--scores", str(tmp_path / "s.csv"), "--method",
                              "abl_zero", "--count", "2", "--out", str(tmp_path / "p"), "--device", "cpu"])
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "p").exists(), err
    code, err = _run(capsys, ["curve", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "300",
                              "--scores", str(tmp_path / "s.csv"), "--fractions", "0,1", "--out",
                              str(tmp_path / "c.csv"), "--quiet", "--device", "cpu"])
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "c.csv").exists(), err
    if edit != "missing_row":
        assert "must be a finite number" in err and "L0H3" in err


def test_hf_export_whose_removed_head_is_not_zero_is_refused(tiny_dir, corpus, tmp_path, capsys):
    pruned = tmp_path / "p"
    assert main(["prune", "--model", str(tiny_dir), "--heads", "L1H2", "--out", str(pruned), "--format", "hf",
                 "--device", "cpu"]) == 0
    marker = json.loads((pruned / "headprune_export.json").read_text())
    marker["removed_heads"] = ["L1H2", "L0H0"]  # L0H0 was never removed: its weights are not zero
    (pruned / "headprune_export.json").write_text(json.dumps(marker))
    capsys.readouterr()
    code, err = _run(capsys, ["finetune", str(pruned), "--steps", "1", "--out", str(tmp_path / "r"), "--seq-len", "16",
                              "--train-data", str(corpus), "--data", str(corpus), "--quiet", "--device", "cpu"])
    assert code == 2 and "L0H0 was removed, but its weights are not zero" in err and err.count("\n") == 1


def test_zeroed_heads_are_accepted_and_an_edited_zero_head_is_caught(tiny_dir, tmp_path):
    from headprune.pruning.finetune import load_pruned

    pruned = tmp_path / "p"
    assert main(["prune", "--model", str(tiny_dir), "--heads", "L1H2", "--out", str(pruned), "--format", "hf",
                 "--device", "cpu"]) == 0
    model, _ = load_pruned(pruned)
    assert model.cfg.kept_heads[1] == [0, 1, 3]
    state = load_file(pruned / "model.safetensors")
    state["transformer.h.1.attn.c_attn.bias"][2 * 8 + 1] = 1e-3  # one Q bias entry of L1H2 (d_head 8) edited
    save_file(state, str(pruned / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(HeadpruneError, match="L1H2 was removed, but its weights are not zero"):
        load_pruned(pruned)


class _Damaged:
    """A progress whose only unit is a gate checkpoint with a key missing (a hand-edited line)."""

    def __init__(self, record):
        self.units = {"gates/ckpt/0000010": record}

    def __contains__(self, unit):
        return unit in self.units

    def get_or_compute(self, unit, compute):
        return self.units[unit] if unit in self.units else compute()


@pytest.mark.parametrize("record", [{"step": 10}, 42, {"log_alpha": "x", "lambdas": [], "opt": {}, "rng": "zz",
                                                     "step": 10, "history": []}])
def test_damaged_gate_checkpoint_is_one_line(tiny_dir, record):
    model = load_model(tiny_dir)
    batches = [torch.randint(0, 1000, (2, 16))]
    with pytest.raises(HeadpruneError, match="gate checkpoint in the progress file is damaged"):
        learn_gates(model, batches, options=GateOptions(20, sparsity=0.5), progress=_Damaged(record),
                    show_progress=False)
