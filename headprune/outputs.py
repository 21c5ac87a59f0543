"""Atomic outputs and append-only progress files for resumable sweeps.

Every file is written to a temporary name in its own folder, flushed, fsynced and renamed over the
target, so a reader (or a killed run) never sees a half-written file.

A sweep records each finished unit as one JSON line in a progress file whose first line is the run's
fingerprint (command, model, data, settings). Rerunning the same command skips the recorded units; a
different fingerprint refuses to resume unless told to overwrite. A torn last line (SIGKILL in mid-write)
is ignored and its unit recomputed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import HeadpruneError
from .schema import TEXT_COLUMNS

TABLE_SUFFIXES = (".csv", ".parquet")


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
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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
        raise HeadpruneError(f"cannot read table {path} ({type(err).__name__}); is it a headprune csv/parquet?") from None


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


def fingerprint(**settings) -> str:
    """A short stable hash of a run's settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Progress:
    """Append-only record of a sweep's finished units, keyed by strings, values JSON-serialisable.

    ``others``: progress files of the same output left by a run with another number of processes
    (:func:`headprune.distributed.progress_files`): their units count as done (each checked to belong to this
    run), they are never written, and :meth:`remove` (or ``overwrite``) deletes them too."""

    def __init__(self, path: str | os.PathLike, settings: dict, overwrite: bool = False,
                 others: Iterable[str | os.PathLike] = ()):
        self.path = Path(path)
        self.others = [Path(p) for p in others]
        self.key = fingerprint(**settings)
        self.units: dict[str, Any] = {}
        # For tests only: SIGKILL this process right after it has recorded this many units (a deterministic kill).
        self._kill_after = int(os.environ.get("HEADPRUNE_TEST_KILL_AFTER_UNITS", "0"))
        self._recorded = 0
        # The header is written with the first unit: a run that fails before computing anything leaves no file
        # behind to block the corrected rerun.
        self._header: dict | None = {"fingerprint": self.key, "settings": settings}
        if self.path.exists() and not self.path.is_file():
            raise HeadpruneError(f"progress file {self.path} is not a regular file; remove it or choose another output")
        if overwrite:
            for old in [self.path, *self.others]:
                old.unlink(missing_ok=True)
        for other in self.others:
            if other.is_file():
                self.units |= self._records(other, self._lines(other)[0])  # a torn last line: that unit is redone
        if self.path.exists():
            self._load()

    def _lines(self, path: Path) -> tuple[list[str], str]:
        """The complete lines of ``path`` and the torn last one ("" where the file ends in a newline)."""
        try:
            *lines, torn = path.read_text().split("\n")
        except (OSError, UnicodeDecodeError) as err:
            raise HeadpruneError(f"cannot read progress file {path} ({type(err).__name__}); pass --overwrite "
                                 "to start afresh") from None
        return lines, torn

    def _records(self, path: Path, lines: list[str]) -> dict[str, Any]:
        """``{unit: value}`` of a progress file's lines, after checking its header belongs to this run."""
        if not lines:
            return {}
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = None
        if not (isinstance(header, dict) and isinstance(header.get("fingerprint"), str)
                and isinstance(header.get("settings"), dict)):
            raise HeadpruneError(f"{self.path} line 1 is not a headprune progress header (damaged, or not a progress "
                                 "file); pass --overwrite to start afresh or choose another output")
        if header["fingerprint"] != self.key:
            raise HeadpruneError(
                f"{path} holds progress of a different run (other model, data or settings); pass --overwrite "
                "to discard it or choose another output"
            )
        units = {}
        for i, line in enumerate(lines[1:], start=2):
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict) or set(rec) != {"unit", "value"} or not isinstance(rec["unit"], str):
                    raise ValueError
            except ValueError:  # JSONDecodeError too: not JSON, or JSON of the wrong shape (a second header, 42)
                raise HeadpruneError(f"{path} line {i} is damaged; pass --overwrite to start afresh") from None
            units[rec["unit"]] = rec["value"]
        return units

    def _load(self) -> None:
        lines, torn = self._lines(self.path)
        if not lines:  # killed before the header was complete: start afresh
            self.path.unlink()
            return
        self.units |= self._records(self.path, lines)
        self._header = None
        if torn:  # the last record of a killed run, cut mid-write: drop it, its unit is recomputed
            write_text(self.path, "\n".join(lines) + "\n")

    def _append(self, record: dict) -> None:
        text = json.dumps(record) + "\n"
        if self._header is not None:
            ensure_dir(self.path.parent)
            text, self._header = json.dumps(self._header) + "\n" + text, None
        with open(self.path, "a") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def __contains__(self, unit: str) -> bool:
        return unit in self.units

    def get_or_compute(self, unit: str, compute: Callable[[], Any]) -> Any:
        """The recorded value of ``unit``, else ``compute()`` recorded now. JSON round-trips floats exactly."""
        if unit not in self.units:
            value = compute()
            self._append({"unit": unit, "value": value})
            self.units[unit] = json.loads(json.dumps(value))
            self._recorded += 1
            if self._recorded == self._kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.units[unit]

    def remove(self) -> None:
        for path in [self.path, *self.others]:
            path.unlink(missing_ok=True)


class NoProgress:
    """The Progress interface without a file (Python API calls that need no resume)."""

    def __contains__(self, unit: str) -> bool:
        return False

    def get_or_compute(self, unit: str, compute: Callable[[], Any]) -> Any:
        return json.loads(json.dumps(compute()))

    def remove(self) -> None:
        pass
