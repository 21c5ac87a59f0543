"""Atomic outputs: every file is written to a temporary name in its own folder, flushed, fsynced and renamed over the
target, so a reader (or a killed run) never sees a half-written file; tables read and written by suffix."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.schema import TEXT_COLUMNS

TABLE_SUFFIXES = (".csv", ".parquet")


def beside(table: str | os.PathLike, suffix: str) -> Path:
    """The file saved beside ``table``: ``scores.parquet`` -> ``scores`` + ``suffix``."""
    path = Path(table)
    return path.with_name(path.stem + suffix)


def temp_prefix(target: Path) -> str:
    """The name start of ``target``'s temporaries: ``.NAME.PID.`` (the PID tells whether their writer still lives)."""
    return f".{target.name}.{os.getpid()}."


def clear_stale_temporaries(target: Path) -> None:
    """Remove temporaries of ``target`` (files or folders) left by a writer that no longer runs (SIGKILL)."""
    import shutil

    for tmp in target.parent.glob(f".{glob_escape(target.name)}.*.tmp"):
        pid = tmp.name[len(target.name) + 2:].split(".")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike):
    """Yield a temporary path beside ``target``; on success rename it over ``target``, on error remove it."""
    target = Path(target)
    ensure_dir(target.parent)
    clear_stale_temporaries(target)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        with write_failures(target):
            yield Path(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; give the file the usual permissions
            os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


#: What the native writers say when the disk fails them: torch.save's zip writer (``inline_container.cc``) and
#: safetensors' serializer (``IoError``) raise RuntimeError / SafetensorError, not OSError, on a full disk.
_WRITER_FAILURES = ("inline_container", "PytorchStreamWriter", "file write failed", "IoError", "No space left")


def write_failure(err: BaseException) -> str | None:
    """The one-line reason a write failed, where ``err`` is the machine's fault (an OSError, or a native writer's
    I/O failure); None for anything else (a bug, shown with its traceback)."""
    if isinstance(err, OSError):
        return err.strerror or str(err) or type(err).__name__
    text = str(err)
    native = isinstance(err, RuntimeError) or type(err).__name__ == "SafetensorError"
    if native and any(mark in text for mark in _WRITER_FAILURES):
        first = text.splitlines()[0] if text else type(err).__name__
        return "No space left on device" if "No space left" in text or "StorageFull" in text else (
            f"the writer failed: {first[:120]}")
    return None


@contextlib.contextmanager
def write_failures(target: str | os.PathLike):
    """Turn a failed write of ``target`` (full disk, I/O error, ... from Python or a native writer) into one
    HeadpruneError line; the caller's temporaries are its own to remove."""
    try:
        yield
    except HeadpruneError:
        raise
    except Exception as err:
        if (reason := write_failure(err)) is None:
            raise
        raise HeadpruneError(f"cannot write {target} ({reason}); free space or choose another location") from None


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike):
    """Yield the folder to write ``target``'s files into: a new ``target`` is built in a temporary folder and
    renamed into place when complete (absent on any error); an existing one is written in place, file by file."""
    import shutil

    target = Path(target).absolute()
    if target.is_dir():
        yield target
        return
    check_writable(target)
    ensure_dir(target.parent)
    clear_stale_temporaries(target)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())
        yield tmp
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def write_bytes(target: str | os.PathLike, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_json(target: str | os.PathLike, obj: Any) -> None:
    write_text(target, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_table(df: pd.DataFrame, target: str | os.PathLike) -> None:
    """A DataFrame as .csv or .parquet (by suffix), atomically."""
    suffix = Path(target).suffix
    check_table_suffix(target)
    df = df.copy(deep=False)
    df.attrs = {}  # pandas stores attrs (a baseline, timings) in the parquet metadata: identical runs, identical files
    with atomic_path(target) as tmp:
        df.to_csv(tmp, index=False) if suffix == ".csv" else df.to_parquet(tmp, index=False)


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    path = Path(path)
    check_table_suffix(path)
    if not path.is_file():
        raise HeadpruneError(f"table {path} does not exist")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, dtype={c: str for c in TEXT_COLUMNS}, keep_default_na=False,
                           na_values=["", "NaN", "nan"])
    except Exception as err:  # noqa: BLE001 - pandas/pyarrow raise many kinds
        raise HeadpruneError(f"cannot read table {path} ({type(err).__name__}); "
                             "is it a headprune csv/parquet?") from None


def read_scores(path: str | os.PathLike) -> pd.DataFrame:
    """A saved scores table (read_table keeps head_id and model_fingerprint as text)."""
    return read_table(path)


def check_table_suffix(path: str | os.PathLike) -> None:
    if Path(path).suffix not in TABLE_SUFFIXES:
        raise HeadpruneError(f"output {path} must end in .csv or .parquet")


def ensure_dir(folder: str | os.PathLike) -> Path:
    """Create ``folder`` if needed and check that files can be written in it."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise HeadpruneError(f"cannot write to {folder} ({err.strerror or err}); choose a writable location") from None
    return folder


def check_writable(path: str | os.PathLike, file: bool = False) -> Path:
    """Fail early, creating nothing, unless ``path`` (a file to be where ``file``, else a folder) can be created or
    written: a computation must not run for an hour to find its output cannot be saved."""
    path = Path(path).absolute()
    if len(path.name.encode()) > 255:
        raise HeadpruneError(f"cannot write {path}: the name is longer than 255 bytes; choose a shorter one")
    if file and path.is_dir():
        raise HeadpruneError(f"cannot write {path}: it is a folder; choose a file name")
    if not file and path.exists() and not path.is_dir():
        raise HeadpruneError(f"cannot write {path}: it is a file, not a folder; choose another location")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise HeadpruneError(f"cannot write {path}: {existing} is a file, not a folder; choose another location")
    if not os.access(existing if existing.is_dir() else existing.parent, os.W_OK):
        raise HeadpruneError(f"cannot write to {existing} (permission denied); choose a writable location")
    return path
