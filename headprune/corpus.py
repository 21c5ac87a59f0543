"""Text corpora -> token ids.

A corpus *spec* names where the text comes from:

- ``default``: the Python standard library's own documentation (see :func:`default_documents`),
  split deterministically into train/validation/test by document name (see :func:`split_of`);
- a ``.txt`` file, or a directory of ``.txt`` files (read in sorted order, one document each);
- a ``.jsonl`` or ``.parquet`` file with a ``text`` column (one document per row);
- ``hf:NAME[:CONFIG]:SPLIT``: a Hugging Face dataset with a ``text`` column.

Local files and ``hf:`` specs carry their own split; the ``split`` argument only selects
from the default corpus. :func:`tokenize_corpus` turns documents into one 1-D tensor of
token ids, documents separated by the tokenizer's end-of-text token, cached on disk.
"""

from __future__ import annotations

import ast
import codecs
import functools
import hashlib
import inspect
import json
import os
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from headprune.errors import HeadpruneError, warn
from headprune.outputs import atomic_path

SPLITS = ("train", "validation", "test")

#: Docstrings shorter than this many characters (after cleaning) are skipped: they are
#: mostly one-word stubs ("Return self.") that add repetition, not language.
MIN_DOCSTRING_CHARS = 40

_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _docstrings(tree: ast.Module) -> list[str]:
    """Module, class and function docstrings in source order, cleaned and long enough."""
    out: list[str] = []

    def visit(node: ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        doc = ast.get_docstring(node, clean=False)
        if doc:
            doc = inspect.cleandoc(doc)
            if len(doc) >= MIN_DOCSTRING_CHARS:
                out.append(doc)
        for child in node.body:
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child)

    visit(tree)
    return out


def _module_documents(root: Path, top: Path | None = None) -> dict[str, str]:
    """``module:NAME`` documents of the ``.py`` files under ``top`` (default ``root``), named relative to ``root``."""
    docs = {}
    for path in _python_files(top or root):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue
        parts = _docstrings(tree)
        if parts:
            docs[f"module:{_module_name(path, root)}"] = "\n\n".join(parts)
    return docs


def _parse_default_documents() -> tuple[tuple[str, str], ...]:
    from pydoc_data.topics import topics

    docs = {f"topic:{key}": text.strip() for key, text in topics.items()}
    docs.update(_module_documents(_stdlib_dir()))
    return tuple(sorted((name, text) for name, text in docs.items() if text))


#: Bump when the parsing above changes what the documents are: old cache entries then no longer match.
DOCUMENTS_FORMAT = 1


def _stdlib_key() -> str:
    """What the parsed documents depend on: the parsing (format, minimum length), the Python version and every
    ``.py`` file of the standard library (path, size, mtime) plus pydoc's topics; a stat per file, no reading."""
    import pydoc_data.topics

    root = _stdlib_dir()
    h = hashlib.sha256(json.dumps([DOCUMENTS_FORMAT, MIN_DOCSTRING_CHARS, sys.version, str(root)]).encode())
    for path in [Path(pydoc_data.topics.__file__)] + sorted(_python_files(root)):
        st = path.stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def _python_files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS and not d.startswith(".")]
        yield from (Path(dirpath, f) for f in filenames if f.endswith(".py"))


def _documents_digest(docs) -> str:
    return hashlib.sha256(json.dumps(docs, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


@functools.lru_cache(maxsize=1)
def _default_documents() -> tuple[tuple[str, str], ...]:
    """The parsed documents, cached on disk beside the token ids (parsing the standard library takes seconds):
    ``stdlib-documents-KEY.json`` holds the documents and their sha256; a damaged entry is parsed afresh."""
    file = default_cache_dir() / f"stdlib-documents-{_stdlib_key()}.json"
    try:
        entry = json.loads(file.read_text(encoding="utf-8"))
        docs = entry["documents"]
        if isinstance(docs, list) and entry.get("sha256") == _documents_digest(docs):
            return tuple((str(name), str(text)) for name, text in docs)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        pass  # absent, damaged or foreign: parse again and overwrite
    parsed = _parse_default_documents()
    docs = [list(pair) for pair in parsed]
    try:
        with atomic_path(file) as tmp:
            tmp.write_text(json.dumps({"sha256": _documents_digest(docs), "documents": docs}, ensure_ascii=False),
                           encoding="utf-8")
    except (OSError, HeadpruneError) as e:  # a read-only cache only costs parsing again next time
        warn(f"could not write document cache {file}: {e}")
    return parsed


def default_documents() -> list[tuple[str, str]]:
    """The default English corpus as sorted ``(name, text)`` pairs, available on every machine.

    One document per ``pydoc_data.topics`` entry (``topic:KEY``) and one per standard library
    module that has docstrings (``module:dotted.name``): the module docstring followed by its
    class and function docstrings (methods included) in source order, each cleaned with
    :func:`inspect.cleandoc`; docstrings shorter than :data:`MIN_DOCSTRING_CHARS` are skipped.
    Test directories, ``site-packages`` and files that do not parse are left out.
    The content therefore depends on the Python version.
    """
    return list(_default_documents())


def split_of(name: str) -> str:
    """Deterministic split of a document name: ~90% ``train``, ~5% ``validation``, ~5% ``test``."""
    bucket = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % 100
    return "train" if bucket < 90 else "validation" if bucket < 95 else "test"


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


def _read_txt(path: Path) -> str:
    return TextFile(path).read()


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


def corpus_sources(spec: str, split: str = "validation") -> Sequence[Source]:
    """:func:`load_texts`, except that ``.txt`` files stay unread :class:`TextFile` documents (streamed when
    tokenized; their emptiness is then checked by :func:`tokenize_corpus`)."""
    if split not in SPLITS:
        raise HeadpruneError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if not spec or not spec.strip():
        raise HeadpruneError("empty corpus spec; use default, a .txt/.jsonl/.parquet path, a directory or hf:NAME[:CONFIG]:SPLIT")
    if spec == "default":
        return [text for name, text in default_documents() if split_of(name) == split]
    if spec.startswith("hf:"):
        return _nonempty(_load_hf(spec), spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise HeadpruneError(f"corpus path {path} does not exist; give an existing file or directory, default, or hf:NAME[:CONFIG]:SPLIT")
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
        f"unsupported corpus file {path}; use a .txt, .jsonl or .parquet file, a directory of .txt files, default or hf:NAME[:CONFIG]:SPLIT"
    )


def _tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    ident = backend.to_str() if backend is not None else json.dumps(
        [type(tokenizer).__name__, sorted(tokenizer.get_vocab().items())]
    )
    return hashlib.sha256(ident.encode()).hexdigest()


def _cache_key(texts: Sequence[Source], tokenizer) -> str:
    """sha256 of the tokenizer and every document's UTF-8 bytes (a file's streamed: the same key as its text)."""
    h = hashlib.sha256(_tokenizer_fingerprint(tokenizer).encode())
    h.update(str(tokenizer.eos_token_id).encode())
    for text in texts:
        if isinstance(text, TextFile):
            h.update(text.path.stat().st_size.to_bytes(8, "little"))
            for block in text.blocks():
                h.update(block)
            continue
        data = text.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def default_cache_dir() -> Path:
    """``$HEADPRUNE_CACHE`` if set, else ``~/.cache/headprune/tokens``."""
    env = os.environ.get("HEADPRUNE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "headprune" / "tokens"


#: Long documents are tokenized in pieces of about this many characters, cut where a space stands between two
#: non-space characters: GPT-2's pre-tokenizer never joins across such a space, so the pieces' tokens are exactly
#: the document's, and memory stays bounded however long a line is.
PIECE_CHARS = 1 << 16


def _pieces(source: Source, size: int = PIECE_CHARS):
    """The document in pieces of about ``size`` characters, each cut before a space that stands between two
    non-space characters; a file is read chunk by chunk, so only about one chunk is held at a time. Where no
    such space lies within ``size`` characters the piece runs on to the next one (the whole rest without any)."""
    chunks = iter([source] if isinstance(source, str) else source.chunks())
    text, start, more = "", 0, True  # text[start:] is what is read and not yet yielded

    def read() -> None:
        nonlocal text, start, more
        chunk = next(chunks, None)
        more = chunk is not None
        if chunk:
            text, start = text[start:] + chunk, 0

    while True:
        while more and len(text) - start <= size:
            read()
        cut = _safe_cut(text, start, size) if len(text) - start > size else -1
        if cut < 0 and more:  # no safe cut in what is read so far: read on
            read()
            continue
        if cut < 0:
            yield text[start:]
            return
        yield text[start:cut]
        start = cut


def _safe_cut(text: str, start: int, size: int) -> int:
    """In ``text[start:]``: the last space before ``start + size`` (else the first after it) between two non-space
    characters, as an index of ``text``; -1: none."""
    def safe(i: int) -> bool:
        return start < i < len(text) - 1 and not text[i - 1].isspace() and not text[i + 1].isspace()

    cut = text.rfind(" ", start + 1, start + size)
    while cut > start and not safe(cut):
        cut = text.rfind(" ", start + 1, cut)
    if cut > start:
        return cut
    cut = text.find(" ", start + size)
    while cut >= 0 and not safe(cut):
        cut = text.find(" ", cut + 1)
    return cut


def _stream_ids(texts: Sequence[Source], tokenizer, eos: int, limit: int | None) -> torch.Tensor:
    """The ids of ``texts`` joined by ``eos``, tokenized in batches of pieces; stops once ``limit`` ids exist.
    A corpus read to its end without any non-whitespace character is refused."""
    from array import array

    ids = array("q")
    pending: list[tuple[bool, str]] = []  # (starts a document after the first, piece)
    budget = PIECE_CHARS if limit else 64 * PIECE_CHARS  # characters per tokenizer call

    def flush() -> None:
        encoded = tokenizer([p for _, p in pending], add_special_tokens=False)["input_ids"]
        for (new_doc, _), piece in zip(pending, encoded):
            if new_doc:
                ids.append(eos)
            ids.extend(piece)
        pending.clear()

    chars, has_text = 0, False
    for i, text in enumerate(texts):
        for j, piece in enumerate(_pieces(text)):
            pending.append((i > 0 and j == 0, piece))
            chars += len(piece)
            has_text = has_text or not piece.isspace() and bool(piece)
            if chars >= budget:
                flush()
                chars = 0
                if limit and len(ids) >= limit:
                    break
        if limit and len(ids) >= limit:
            break
    if pending:
        flush()
    if not has_text and not (limit and len(ids) >= limit):
        raise HeadpruneError("the corpus has no text (empty or only whitespace); give a corpus with non-whitespace text")
    out = torch.frombuffer(ids, dtype=torch.long).clone() if len(ids) else torch.zeros(0, dtype=torch.long)
    return out[:limit] if limit else out


def tokenize_corpus(texts: Sequence[Source], tokenizer, cache_dir: str | os.PathLike | None = None,
                    limit: int | None = None) -> torch.Tensor:
    """Token ids of ``texts`` as one 1-D LongTensor, documents joined by the eos token; only the first ``limit``
    when given (tokenizing stops there: a 50 MB line for 300 tokens reads only its start).

    A :class:`TextFile` is streamed: hashed chunk by chunk for the cache key, decoded and tokenized only as far as
    needed. Results are cached in ``cache_dir`` (default :func:`default_cache_dir`) under a sha256 of
    the tokenizer's serialized definition and the texts (and ``limit``), so repeated calls skip tokenizing.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    eos = tokenizer.eos_token_id
    if eos is None:
        raise HeadpruneError("tokenizer has no eos token; use a GPT-2 style tokenizer with <|endoftext|>")
    texts = list(texts)
    if not texts:
        raise HeadpruneError("no documents to tokenize; give a non-empty corpus")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    file = cache / f"{_cache_key(texts, tokenizer)}{f'-first{limit}' if limit else ''}.safetensors"
    if file.is_file():
        try:
            cached = load_file(file)["ids"]
            if _ids_digest(cached) == safe_open_metadata(file).get("sha256"):
                return cached
        except (SafetensorError, OSError, KeyError, ValueError, RuntimeError):
            pass  # corrupt, damaged (checksum) or foreign file: re-tokenize and overwrite
    tensor = _stream_ids(texts, tokenizer, eos, limit)
    try:
        with atomic_path(file) as tmp:
            save_file({"ids": tensor}, tmp, metadata={"sha256": _ids_digest(tensor)})
    except (OSError, HeadpruneError) as e:  # a read-only cache only costs re-tokenizing next time
        warn(f"could not write token cache {file}: {e}")
    return tensor


def _ids_digest(ids: torch.Tensor) -> str:
    """The checksum a cache entry carries: a flipped bit in a cached id must not silently change the data."""
    return hashlib.sha256(ids.to(torch.long).contiguous().numpy().tobytes()).hexdigest()


def safe_open_metadata(file: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return f.metadata() or {}


def check_ids(ids: torch.Tensor, vocab_size: int, source: str) -> torch.Tensor:
    """``ids`` if every one indexes the model's embedding, else one clear error (not an index crash mid-run)."""
    if ids.dtype != torch.long or ids.dim() != 1:
        raise HeadpruneError(f"token ids of {source} must be a 1-D integer tensor")
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise HeadpruneError(f"token ids of {source} lie outside the model's vocabulary [0, {vocab_size}); use the "
                             "model's own tokenizer")
    return ids


def token_digest(ids: torch.Tensor) -> str:
    """A short hash of token ids (1-D): which data a sweep ran on."""
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]


def corpus_ids(spec: str, split: str, tokenizer, max_tokens: int | None = None) -> torch.Tensor:
    """Token ids of a corpus spec's documents (see :func:`load_texts`), cut to the first ``max_tokens``."""
    ids = check_ids(tokenize_corpus(corpus_sources(spec, split), tokenizer, limit=max_tokens), len(tokenizer), spec)
    if len(ids) < 2:  # refused here, before any output or progress file exists
        raise HeadpruneError(f"corpus {spec} has {len(ids)} token(s); at least 2 are needed to score anything")
    return ids
