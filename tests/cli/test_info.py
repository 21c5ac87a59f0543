"""The ledger for GPT-2 small and the CLI's handling of bad models."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from headprune.cli.main import main
from headprune.io.read.loading import load_model
from headprune.models import ledger
from headprune.models.ledger import attention_flops_per_token, param_table, shape_trace, wo_table


@pytest.mark.parametrize("batch, seq_len", [(1, 8), (3, 40)])
def test_shape_trace_real_and_on_meta_agree_with_the_shapes_by_hand(tiny_dir, monkeypatch, batch, seq_len):
    model = load_model(tiny_dir)  # 4 heads of d_k 8, d 32
    expected = [(batch, seq_len, 32), (batch, 4, seq_len, 8), (batch, 4, seq_len, 8), (batch, 4, seq_len, seq_len),
                (batch, 4, seq_len, 8), (batch, seq_len, 32), (batch, seq_len, 32)]
    real = shape_trace(model, batch, seq_len)
    monkeypatch.setattr(ledger, "TRACE_ELEMENTS", 0)  # every trace from the config
    assert [shape for _, shape in real] == [shape for _, shape in shape_trace(model, batch, seq_len)] == expected


@pytest.mark.slow
def test_gpt2_small_ledger(small_dir, capsys):
    model = load_model(small_dir)
    wo = wo_table(model)
    assert (wo.W_O_weights == 768 * 768).all() and (wo.W_O_weights == 589_824).all()
    assert (wo.W_O_total == 590_592).all()
    assert (wo.W_O_flops_per_token == 2 * 768**2).all() and (wo.W_O_flops_per_token == 1_179_648).all()
    assert param_table(model).params.sum() == 124_439_808  # GPT-2 small's published count
    # QKV 2·d·3d + W_O 2·d² + scores/AV 4·d·T, per layer
    assert attention_flops_per_token(model, 512) == 12 * (2 * 768 * 2304 + 2 * 768 * 768 + 4 * 768 * 512)
    assert main(["info", "--model", str(small_dir), "--batch-size", "4", "--seq-len", "512"]) == 0
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


def _config(**changes):
    def damage(folder):
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(cfg | changes))
    return damage


def _config_list(folder):
    (folder / "config.json").write_text("[]")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/headprune-pwned",))


def _malicious_bin(folder):
    (folder / "model.safetensors").unlink()
    torch.save({"wte.weight": _Evil()}, folder / "pytorch_model.bin")


def _garbage_bin(folder):
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04garbage" * 100)


def _index(text):
    def damage(folder):
        (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
        (folder / "model.safetensors.index.json").write_text(text)
    return damage


def _int_weights(folder):
    state = load_file(folder / "model.safetensors")
    state["transformer.h.0.mlp.c_fc.weight"] = state["transformer.h.0.mlp.c_fc.weight"].to(torch.int32)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    "damage, words",
    [
        (_config_list, "must hold a JSON object"),
        (_config(n_head=0), "n_heads must be a positive integer"),
        (_config(n_layer="3"), "n_layers must be a positive integer"),
        (_config(layer_norm_epsilon=[1]), "layer_norm_eps"),
        (_config(vocab_size=10**11), "has shape"),  # checked against the weights before anything is allocated
        (_config(n_positions=10**10), "has shape"),
        (_malicious_bin, "unsafe pickle"),
        (_garbage_bin, "corrupt or truncated"),
        (_index("{not json"), "not a valid weight index"),
        (_index('{"weight_map": 42}'), "not a valid weight index"),
        (_index('{"weight_map": {"wte.weight": "nope.safetensors"}}'), "missing"),
        (_int_weights, "not floating point"),
        (_corrupt_truncated, "corrupt or truncated"),
        (_corrupt_header, "corrupt or truncated"),
        (_non_gpt2, "'bert' model; headprune supports model_type 'gpt2', 'llama', 'mistral'"),
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
    assert words in err and err.count("\n") == 1 and err.startswith("headprune: error:"), err
    assert not os.path.exists("/tmp/headprune-pwned")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "/no/such/dir"], "does not exist"),
        (["--dtype", "fp8"], "unknown dtype"),
        (["--dtype", "fp16", "--device", "cpu"], "fp16 is not supported on the CPU"),
    ]
    + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "no CUDA GPU")]),
)
def test_bad_options(tiny_dir, capsys, args, words):
    full = ["info", "--model", str(tiny_dir)] + args
    assert main(full) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


_NO_NETWORK = """
import os, sys
def hook(event, args):  # any DNS lookup or connect: report it and die with a status nothing else gives
    if event in ("socket.getaddrinfo", "socket.connect"):
        sys.stderr.write(f"NETWORK ATTEMPT {event} {args[:2]!r}\\n")
        sys.stderr.flush()
        os._exit(99)
sys.addaudithook(hook)
from headprune.cli.main import main
sys.exit(main(["info", "--model", "no-such-org/no-such-model"]))
"""


def _unknown_hub_id(tmp_path, offline: str):
    """``headprune info`` on an unknown hub id in a fresh process whose environment is set before
    huggingface_hub is imported (it reads HF_HUB_OFFLINE once, at import: monkeypatch.setenv in this process
    would come too late); an empty HF_HOME, and an endpoint that refuses connections at once."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGINGFACE_HUB_CACHE")}
    env |= {"HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": offline, "HF_ENDPOINT": "http://127.0.0.1:9"}
    return subprocess.run([sys.executable, "-c", _NO_NETWORK], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.slow
def test_unknown_hub_id_offline_one_line_error_without_network(tmp_path):
    proc = _unknown_hub_id(tmp_path, "1")
    assert "NETWORK ATTEMPT" not in proc.stderr and proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("headprune: error:") and proc.stderr.count("\n") == 1
    assert "'no-such-org/no-such-model'" in proc.stderr and "could not be fetched" in proc.stderr
    # The detector works: the same process with offline mode off does reach for the (refusing) endpoint.
    assert _unknown_hub_id(tmp_path, "0").returncode == 99


@pytest.mark.slow
def test_cli_process_reports_without_traceback(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    proc = subprocess.run([sys.executable, "-m", "headprune", "info", "--model", str(tmp_path)],
                          check=False, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert "config.json has no 'num_attention_heads' field, which a llama config needs" in proc.stderr
