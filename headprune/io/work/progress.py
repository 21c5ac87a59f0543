"""Append-only progress files for resumable sweeps: each finished unit is one JSON line under a header of the
settings; a rerun with the same settings takes the recorded units as done, another is refused unless overwritten."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from headprune.errors import HeadpruneError
from headprune.io.work.files import ensure_dir, write_text


def fingerprint(**settings) -> str:
    """A short stable hash of a run's settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Progress:
    """Append-only record of a sweep's finished units, keyed by strings, values JSON-serialisable.

    ``others``: progress files of the same output left by a run with another number of processes
    (:func:`headprune.io.work.distributed.progress_files`): their units count as done (each checked to belong to this
    run), they are never written, and :meth:`remove` (or ``overwrite``) deletes them too."""

    def __init__(self, path: str | os.PathLike, settings: dict, overwrite: bool = False,
                 others: Iterable[str | os.PathLike] = ()):
        self.path = Path(path)
        self.others = [Path(p) for p in others]
        self.key = fingerprint(**settings)
        self.settings = settings
        self.units: dict[str, Any] = {}
        # For tests only: SIGKILL this process right after it has recorded this many units (a deterministic kill;
        # HEADPRUNE_TEST_KILL_SIGNAL=INT sends SIGINT instead, as Ctrl-C would).
        self._kill_after = int(os.environ.get("HEADPRUNE_TEST_KILL_AFTER_UNITS", "0"))
        self._kill_signal = getattr(signal, "SIG" + os.environ.get("HEADPRUNE_TEST_KILL_SIGNAL", "KILL"))
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
                os.kill(os.getpid(), self._kill_signal)
        return self.units[unit]

    def remove(self, every_rank: bool = False) -> None:
        """Delete the progress file and those of ``others``, once the result is written. ``every_rank``: also the
        files of this run's other processes (``NAME.rank{r}-of-{n}``), for rank 0 to call after writing a result
        that needed all their units (so the units were all recorded)."""
        if os.environ.get("HEADPRUNE_TEST_KEEP_PROGRESS"):  # for tests only: inspect which units each process did
            return
        paths = [self.path, *self.others]
        if every_rank:
            base = re.sub(r"\.rank\d+-of-\d+$", "", self.path.name)
            paths += sorted(self.path.parent.glob(glob.escape(base) + ".rank*-of-*"))
        for path in paths:
            path.unlink(missing_ok=True)


class NoProgress:
    """The Progress interface without a file (Python API calls that need no resume)."""

    def __contains__(self, unit: str) -> bool:
        return False

    def get_or_compute(self, unit: str, compute: Callable[[], Any]) -> Any:
        return json.loads(json.dumps(compute()))

    def remove(self, every_rank: bool = False) -> None:
        pass
