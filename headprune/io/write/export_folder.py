"""Export folders, written atomically: built in a temporary folder beside the target, fsynced, renamed into place
(a previous export swapped out, a killed writer's leftovers put back or removed), each with a ``headprune_export.json``
record of what was removed, how and from what; every file gets the mode a new file gets under the umask (0644
under 022). What goes into them: :mod:`headprune.io.write.export`."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.io.work.files import (
    clear_stale_temporaries,
    current_umask,
    ensure_dir,
    glob_escape,
    pid_alive,
    temp_prefix,
    write_failures,
)

EXPORT_MARKER = "headprune_export.json"

#: Licence files of the source folder an export passes on when present (the Gemma terms and their notice).
LICENCE_FILES = ("NOTICE.md", "GEMMA_TERMS.html", "LICENSE")


#: The files of the source folder an export copies when present: the tokenizer (GPT-2's BPE files, tokenizer.json or
#: SentencePiece's model) and the generation and chat settings.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "vocab.json", "merges.txt", "chat_template.jinja")


def check_export_target(folder: Path, overwrite: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise HeadpruneError(f"export target {folder} is a file; choose a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / EXPORT_MARKER).is_file() and not overwrite:
        raise HeadpruneError(f"export target {folder} is a non-empty folder that is not a headprune export; "
                             "choose another folder or pass overwrite")


def _replace_dir(tmp: Path, folder: Path) -> None:
    """Rename the finished ``tmp`` folder to ``folder``, swapping out any previous one (moved to
    ``.NAME.PID.RANDOM.old`` first, then deleted; a kill in between leaves it for :func:`clear_stale_old`)."""
    if not folder.exists():
        os.rename(tmp, folder)
        return
    old = folder.with_name(f"{temp_prefix(folder)}{uuid.uuid4().hex[:8]}.old")
    os.rename(folder, old)
    try:
        os.rename(tmp, folder)
    except OSError:
        os.rename(old, folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


def clear_stale_old(folder: Path) -> None:
    """Deal with the previous exports a killed writer left as ``.NAME.PID.*.old`` (its PID no longer running): if
    it was killed between its two renames, ``folder`` is missing and the newest of them is put back; the rest
    are deleted."""
    stale = []
    for old in folder.parent.glob(f".{glob_escape(folder.name)}.*.old"):
        pid = old.name[len(folder.name) + 2:].split(".")[0]
        if old.is_dir() and pid.isdigit() and not pid_alive(int(pid)):
            stale.append(old)
    stale.sort(key=lambda p: p.stat().st_mtime_ns)
    if stale and not folder.exists():
        os.rename(stale.pop(), folder)
    for old in stale:
        shutil.rmtree(old, ignore_errors=True)


def write_export(folder: str | os.PathLike, write: Callable[[Path], None], overwrite: bool) -> Path:
    """Build the export in a temporary folder beside ``folder`` (``write(tmp)``), fsync, rename into place."""
    folder = Path(folder).expanduser().absolute()
    clear_stale_old(folder)
    check_export_target(folder, overwrite)
    clear_stale_temporaries(folder)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(folder), suffix=".tmp", dir=ensure_dir(folder.parent)))
    try:
        with write_failures(f"export {folder}"):  # a full disk in safetensors' writer too: one line, no folder
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; the export gets the usual permissions
            write(tmp)
            for f in tmp.iterdir():  # safetensors' writer makes 0600 files; every file gets what open() gives
                os.chmod(f, 0o666 & ~current_umask())
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            _replace_dir(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def write_checkpoint(tmp: Path, config: dict, tensors: dict[str, Tensor], source: Path | None, marker: dict) -> None:
    """An export's files into ``tmp``: config.json, model.safetensors, the source folder's :data:`TOKENIZER_FILES`
    and :data:`LICENCE_FILES` (those it has) and the :data:`EXPORT_MARKER` record."""
    from safetensors.torch import save_file

    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in (*TOKENIZER_FILES, *LICENCE_FILES):
        if source is not None and (source / name).is_file():
            shutil.copyfile(source / name, tmp / name)
    (tmp / EXPORT_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
