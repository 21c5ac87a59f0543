"""Issue 26, class 6: a full disk in any writer is one line and no partial output; reading is bounded whatever the
content (no spaces at all, or one word per line)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
import torch

from headprune.cli.main import main


def _run(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


@pytest.fixture(scope="module")
def pruned(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("pruned") / "p"
    assert main(["prune", "--model", str(tiny_dir), "--heads", "L0H1,L2H3", "--out", str(out), "--format", "hf",
                 "--device", "cpu"]) == 0
    return out


@pytest.mark.parametrize("failure", ["oserror", "torch"])
def test_torch_checkpoint_writer_on_a_full_disk_is_one_line(pruned, corpus, tmp_path, capsys, monkeypatch, failure):
    """torch.save writes part of the checkpoint, then fails as on a full disk: an OSError, or torch's zip writer's
    own RuntimeError (the text torch gives on ENOSPC)."""
    def full_disk(obj, f, *args, **kwargs):
        with open(f, "wb") as fh:
            fh.write(b"PK\x03\x04 half a checkpoint")
        if failure == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/3: file write failed")

    monkeypatch.setattr(torch, "save", full_disk)
    out = tmp_path / "rec"
    eval_file = tmp_path / "eval.txt"
    eval_file.write_text("An entirely different evaluation text about gardens and rivers. " * 40)
    code, err = _run(capsys, ["finetune", str(pruned), "--steps", "2", "--checkpoint-every", "1", "--out", str(out),
                              "--seq-len", "16", "--batch-size", "2", "--train-data", str(corpus), "--data",
                              str(eval_file), "--quiet", "--device", "cpu"])
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("headprune: error: cannot write") and "Traceback" not in err
    assert not out.exists()
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("*.pt"))


@pytest.mark.parametrize("failure", ["oserror", "safetensors"])
def test_safetensors_export_writer_on_a_full_disk_is_one_line(tiny_dir, tmp_path, capsys, monkeypatch, failure):
    import safetensors.torch
    from safetensors import SafetensorError

    def full_disk(*args, **kwargs):
        if failure == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    out = tmp_path / "export"
    code, err = _run(capsys, ["prune", "--model", str(tiny_dir), "--heads", "L0H1", "--out", str(out),
                              "--device", "cpu"])
    assert code == 2, err
    assert err.count("\n") == 1 and "No space left on device" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.iterdir())  # no export, no temporary folder


PEAK = """
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "headprune", "eval", "--model", sys.argv[1], "--data", sys.argv[2],
                "--max-tokens", "1024", "--device", "cpu"], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)  # MiB
"""


def _peak_mib(model, data) -> int:
    env = {**os.environ, "RAYON_NUM_THREADS": "2"}  # the tokenizer's thread pool (and its arenas) as on 2 cores
    done = subprocess.run([sys.executable, "-c", PEAK, str(model), str(data)], check=False, capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def test_reading_is_bounded_whatever_the_content(tiny_dir, tmp_path):
    """``eval --max-tokens 1024`` on 16 MB without a single space, and on 16 MB of one word per line, peaks within
    250 MiB of the same command on a 20 kB file (measured: +30 to +125 MiB, with the allocator's arenas varying
    from machine to machine; before, the whole file went to the tokenizer at once: ~+750 MiB)."""
    small = tmp_path / "small.txt"
    small.write_text("word " * 4000)
    nospace = tmp_path / "nospace.txt"
    nospace.write_text("abcdefghij" * 1_600_000)
    lines = tmp_path / "lines.txt"
    lines.write_text("word\n" * 3_200_000)
    base = _peak_mib(tiny_dir, small)
    for big in (nospace, lines):
        assert _peak_mib(tiny_dir, big) < base + 250, big.name


def test_newline_cuts_are_exact_and_bound_the_pieces():
    """One word per line: pieces end at newlines (none longer than 2 x PIECE_CHARS, not the 256 Ki fallback), and
    their tokens are exactly the whole text's (GPT-2's pre-tokenizer never joins across such a newline)."""
    from headprune.data import tokens
    from headprune.io.read.tokenizer import _gpt2_bpe

    text = "".join(f"word{i % 97}\n" for i in range(60_000))
    pieces = list(tokens._pieces(text))
    assert "".join(pieces) == text and len(pieces) > 3 and max(map(len, pieces)) <= 2 * tokens.PIECE_CHARS
    tok = _gpt2_bpe()
    whole = tok(text, add_special_tokens=False)["input_ids"]
    assert [i for p in tok(pieces, add_special_tokens=False)["input_ids"] for i in p] == whole
