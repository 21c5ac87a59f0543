"""The ledger for GPT-2 small and the CLI's handling of bad models."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from headprune.cli import main
from headprune.ledger import attention_flops_per_token, param_table, wo_table
from headprune.loading import load_model


def test_gpt2_small_ledger(small_dir, capsys):
    model = load_model(small_dir)
    wo = wo_table(model)
    assert (wo.W_O_weights == 768 * 768).all() and (wo.W_O_weights == 589_824).all()
    assert (wo.W_O_total == 590_592).all()
    assert (wo.W_O_flops_per_token == 2 * 768**2).all() and (wo.W_O_flops_per_token == 1_179_648).all()
    assert param_table(model).params.sum() == 124_439_808  # GPT-2 small's published count
    # QKV 2·d·3d + W_O 2·d² + scores/AV 4·d·T, per layer
    assert attention_flops_per_token(model, 512) == 12 * (2 * 768 * 2304 + 2 * 768 * 768 + 4 * 768 * 512)
    assert main(["info", "--model", str(small_dir), "--batch", "4", "--seq", "512"]) == 0
    out = capsys.readouterr().out
    assert "589,824 + 768 = 590,592" in out and "1,179,648" in out
    assert "(4, 12, 512, 64)" in out and "(4, 12, 512, 512)" in out and "(4, 512, 768)" in out


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _corrupt_truncated(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _corrupt_header(folder):
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)


def _non_gpt2(folder):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"model_type": "bert"}))


def _nan_weights(folder):
    state = load_file(folder / "model.safetensors")
    state["transformer.h.1.attn.c_proj.weight"][0, 0] = float("nan")
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


def _no_weights(folder):
    (folder / "model.safetensors").unlink()


def _bad_json(folder):
    (folder / "config.json").write_text("{not json")


@pytest.mark.parametrize(
    "damage, words",
    [
        (_corrupt_truncated, "corrupt or truncated"),
        (_corrupt_header, "corrupt or truncated"),
        (_non_gpt2, "not GPT-2"),
        (_nan_weights, "NaN or inf"),
        (_no_weights, "no model.safetensors"),
        (_bad_json, "not valid JSON"),
    ],
)
def test_bad_model_one_line_exit_2(tiny_dir, tmp_path, capsys, damage, words):
    folder = _copy(tiny_dir, tmp_path / "m")
    damage(folder)
    assert main(["info", "--model", str(folder)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and err.startswith("headprune: error:")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "/no/such/dir"], "does not exist"),
        (["--model", "no-such-org/no-such-model"], "could not be fetched"),
        (["--dtype", "fp8"], "unknown dtype"),
        (["--dtype", "fp16", "--device", "cpu"], "fp16 is not supported on the CPU"),
    ]
    + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "no CUDA GPU")]),
)
def test_bad_options(tiny_dir, capsys, monkeypatch, args, words):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    full = ["info", "--model", str(tiny_dir)] + args
    assert main(full) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_cli_process_reports_without_traceback(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    proc = subprocess.run([sys.executable, "-m", "headprune", "info", "--model", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert "'llama' model, not GPT-2" in proc.stderr
