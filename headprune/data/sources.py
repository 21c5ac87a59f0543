"""Corpus specs -> documents.

A corpus *spec* names where the text comes from:

- ``default``: the Python standard library's own documentation (:mod:`headprune.data.stdlib_docs`),
  split deterministically into train/validation/test by document name;
- ``code``: the standard library's Python source, one document per module, split the same way (prose vs code);
- ``longdocs``: long whole documents (long modules' source, the language reference's long chapters, long docstring
  collections, CPython's licence: :mod:`headprune.data.long_docs`), split the same way;
- a ``.txt`` file, or a directory of ``.txt`` files (read in sorted order, one document each; streamed);
- a ``.jsonl`` or ``.parquet`` file with a ``text`` column (one document per row);
- ``hf:NAME[:CONFIG]:SPLIT``: a Hugging Face dataset with a ``text`` column.

Local files and ``hf:`` specs carry their own split; the ``split`` argument only selects from the built-in corpora
(:data:`BUILTIN`)."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from headprune.data.long_docs import long_documents
from headprune.data.stdlib_docs import code_documents, default_documents, split_of
from headprune.errors import HeadpruneError

SPLITS = ("train", "validation", "test")

#: The corpora every machine has, by spec: their documents as ``(name, text)`` pairs, split by name.
BUILTIN = {"default": default_documents, "code": code_documents, "longdocs": long_documents}


def is_builtin(spec: str) -> bool:
    """Whether ``spec`` names a built-in corpus (split by the ``split`` argument) rather than a path or ``hf:``."""
    return spec in BUILTIN


def _nonempty(texts: list[str], source: str) -> list[str]:
    texts = [t for t in texts if isinstance(t, str)]
    if not any(t.strip() for t in texts):
        raise HeadpruneError(f"corpus {source} has no text; give a corpus with non-whitespace text")
    return texts


#: Bytes read from a text file at a time: files are streamed, never read whole (see TextFile).
READ_BYTES = 1 << 18


@dataclass(frozen=True)
class TextFile:
    """One UTF-8 ``.txt`` document, read in chunks of :data:`READ_BYTES` when needed: tokenizing a 50 MB file for
    300 tokens decodes only its start, and hashing it for the token cache holds one chunk at a time."""

    path: Path

    def blocks(self):
        """The file's bytes, chunk by chunk."""
        with open(self.path, "rb") as f:
            while block := f.read(READ_BYTES):
                yield block

    def chunks(self):
        """The file's text, chunk by chunk (invalid UTF-8: one clear error naming the byte offset)."""
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = 0
        try:
            for block in self.blocks():
                yield decoder.decode(block)
                offset += len(block)
            yield decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise HeadpruneError(f"{self.path} is not UTF-8 text (invalid byte at offset {offset + e.start}); convert "
                                 "it to UTF-8") from None

    def read(self) -> str:
        return "".join(self.chunks())


Source = str | TextFile  # a document: its text, or a file read when needed


def _read_table(path: Path) -> list[str]:
    import pandas as pd

    try:
        if path.suffix == ".jsonl":
            frame = pd.read_json(path, lines=True, dtype=False)
        else:
            frame = pd.read_parquet(path)
    except UnicodeDecodeError as e:
        raise HeadpruneError(
            f"{path} is not UTF-8 text (invalid byte at offset {e.start}); convert it to UTF-8"
        ) from None
    except Exception as e:  # noqa: BLE001 - pandas/pyarrow raise many types for malformed files
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise HeadpruneError(f"could not read {path}: {first}; check the file format") from None
    if "text" not in frame.columns:
        cols = ", ".join(map(str, frame.columns)) or "none"
        raise HeadpruneError(f"{path} has no 'text' column (columns: {cols}); add one")
    return _strings(frame["text"].tolist(), str(path))


def _strings(values: list, source: str) -> list[str]:
    """``values`` if every one is a string: a row of a number, a list or null is refused, never silently dropped."""
    if bad := [i for i, v in enumerate(values) if not isinstance(v, str)]:
        raise HeadpruneError(f"{source}: {len(bad)} row(s) of 'text' are not strings (first: row {bad[0] + 1}, "
                             f"{type(values[bad[0]]).__name__}); make every text a string")
    return values


def _load_hf(spec: str) -> list[str]:
    parts = spec[3:].split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise HeadpruneError(f"malformed corpus spec {spec!r}; use hf:NAME[:CONFIG]:SPLIT")
    name, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    import datasets

    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # noqa: BLE001 - datasets/hub raise many kinds (offline, not found, bad config, ...)
        what = f"{name!r}" + (f" config {config!r}" if config else "") + f" split {split!r}"
        raise HeadpruneError(
            f"could not load Hugging Face dataset {what} ({type(e).__name__}); likely no network and "
            "no local cache, or a wrong name/config/split: download it once online or use a local file"
        ) from None
    if "text" not in ds.column_names:
        raise HeadpruneError(
            f"Hugging Face dataset {name!r} has no 'text' column (columns: {', '.join(ds.column_names)})"
        )
    return _strings(list(ds["text"]), spec)


def load_texts(spec: str, split: str = "validation") -> list[str]:
    """Documents of a corpus spec (see module docstring); ``split`` applies to ``default`` only."""
    return _nonempty([src if isinstance(src, str) else src.read() for src in corpus_sources(spec, split)], spec)


def check_corpus_spec(spec: str) -> None:
    """Refuse a corpus spec that names a local path that does not exist (before anything loads)."""
    if not is_builtin(spec) and not spec.startswith("hf:") and spec.strip() and not Path(spec).expanduser().exists():
        raise HeadpruneError(f"corpus path {Path(spec).expanduser()} does not exist; give an existing file or "
                             "directory, default, code, longdocs, or hf:NAME[:CONFIG]:SPLIT")


def corpus_sources(spec: str, split: str = "validation") -> Sequence[Source]:
    """:func:`load_texts`, except that ``.txt`` files stay unread :class:`TextFile` documents (streamed when
    tokenized; their emptiness is then checked by :func:`tokenize_corpus`)."""
    if split not in SPLITS:
        raise HeadpruneError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if not spec or not spec.strip():
        raise HeadpruneError("empty corpus spec; use default, a .txt/.jsonl/.parquet path, a directory "
                             "or hf:NAME[:CONFIG]:SPLIT")
    if is_builtin(spec):
        return [text for name, text in BUILTIN[spec]() if split_of(name) == split]
    if spec.startswith("hf:"):
        return _nonempty(_load_hf(spec), spec)
    check_corpus_spec(spec)
    path = Path(spec).expanduser()
    if not path.is_dir() and not path.is_file():  # a FIFO or device would block forever or never end
        raise HeadpruneError(f"corpus path {path} is not a regular file or directory; give a .txt/.jsonl/.parquet file")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".txt" and p.is_file())
        if not files:
            raise HeadpruneError(f"directory {path} has no .txt files; put UTF-8 .txt files in it")
        return [TextFile(p) for p in files]
    if path.suffix == ".txt":
        return [TextFile(path)]
    if path.suffix in (".jsonl", ".parquet"):
        return _nonempty(_read_table(path), str(path))
    raise HeadpruneError(
        f"unsupported corpus file {path}; use a .txt, .jsonl or .parquet file, a directory of .txt files, "
        "default or hf:NAME[:CONFIG]:SPLIT"
    )
