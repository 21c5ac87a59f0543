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
import functools
import hashlib
import inspect
import json
import os
import sysconfig
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
    for dirpath, dirnames, filenames in os.walk(top or root):
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS and not d.startswith(".")]
        for filename in filenames:
            if not filename.endswith(".py"):
                continue
            path = Path(dirpath, filename)
            try:
                tree = ast.parse(path.read_bytes(), filename=str(path))
            except (SyntaxError, ValueError):
                continue
            parts = _docstrings(tree)
            if parts:
                docs[f"module:{_module_name(path, root)}"] = "\n\n".join(parts)
    return docs


@functools.lru_cache(maxsize=1)
def _default_documents() -> tuple[tuple[str, str], ...]:
    from pydoc_data.topics import topics

    docs = {f"topic:{key}": text.strip() for key, text in topics.items()}
    docs.update(_module_documents(_stdlib_dir()))
    return tuple(sorted((name, text) for name, text in docs.items() if text))


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


def _read_txt(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeadpruneError(
            f"{path} is not UTF-8 text (invalid byte at offset {e.start}); convert it to UTF-8"
        ) from None


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
        return _nonempty([_read_txt(p) for p in files], str(path))
    if path.suffix == ".txt":
        return _nonempty([_read_txt(path)], str(path))
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


def _cache_key(texts: list[str], tokenizer) -> str:
    h = hashlib.sha256(_tokenizer_fingerprint(tokenizer).encode())
    h.update(str(tokenizer.eos_token_id).encode())
    for text in texts:
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


def _pieces(text: str, size: int = PIECE_CHARS):
    start = 0
    while len(text) - start > size:
        cut = text.rfind(" ", start + 1, start + size)
        while cut > start and (text[cut - 1].isspace() or text[cut + 1].isspace()):
            cut = text.rfind(" ", start + 1, cut)
        if cut <= start:  # no safe cut in reach (no spaces): the rest in one piece
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


def _stream_ids(texts: list[str], tokenizer, eos: int, limit: int | None) -> torch.Tensor:
    """The ids of ``texts`` joined by ``eos``, tokenized in batches of pieces; stops once ``limit`` ids exist."""
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

    chars = 0
    for i, text in enumerate(texts):
        for j, piece in enumerate(_pieces(text)):
            pending.append((i > 0 and j == 0, piece))
            chars += len(piece)
            if chars >= budget:
                flush()
                chars = 0
                if limit and len(ids) >= limit:
                    break
        if limit and len(ids) >= limit:
            break
    if pending:
        flush()
    out = torch.frombuffer(ids, dtype=torch.long).clone() if len(ids) else torch.zeros(0, dtype=torch.long)
    return out[:limit] if limit else out


def tokenize_corpus(texts: list[str], tokenizer, cache_dir: str | os.PathLike | None = None,
                    limit: int | None = None) -> torch.Tensor:
    """Token ids of ``texts`` as one 1-D LongTensor, documents joined by the eos token; only the first ``limit``
    when given (tokenizing stops there: a 50 MB line for 300 tokens reads only its start).

    Results are cached in ``cache_dir`` (default :func:`default_cache_dir`) under a sha256 of
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
    ids = check_ids(tokenize_corpus(load_texts(spec, split), tokenizer, limit=max_tokens), len(tokenizer), spec)
    if len(ids) < 2:  # refused here, before any output or progress file exists
        raise HeadpruneError(f"corpus {spec} has {len(ids)} token(s); at least 2 are needed to score anything")
    return ids
