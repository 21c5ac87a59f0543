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
    return [t for t in frame["text"].tolist() if isinstance(t, str)]


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
    return [t for t in ds["text"] if isinstance(t, str)]


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


def tokenize_corpus(texts: list[str], tokenizer, cache_dir: str | os.PathLike | None = None) -> torch.Tensor:
    """Token ids of ``texts`` as one 1-D LongTensor, documents joined by the eos token.

    Results are cached in ``cache_dir`` (default :func:`default_cache_dir`) under a sha256 of
    the tokenizer's serialized definition and the texts, so repeated calls skip tokenizing.
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
    file = cache / f"{_cache_key(texts, tokenizer)}.safetensors"
    if file.exists():
        try:
            return load_file(file)["ids"]
        except (SafetensorError, OSError, KeyError):
            pass  # corrupt or foreign file: re-tokenize and overwrite
    ids: list[int] = []
    batch = 256
    for start in range(0, len(texts), batch):
        encoded = tokenizer(texts[start:start + batch], add_special_tokens=False)["input_ids"]
        for i, doc in enumerate(encoded):
            if start + i:
                ids.append(eos)
            ids.extend(doc)
    tensor = torch.tensor(ids, dtype=torch.long)
    try:
        with atomic_path(file) as tmp:
            save_file({"ids": tensor}, tmp)
    except (OSError, HeadpruneError) as e:  # a read-only cache only costs re-tokenizing next time
        warn(f"could not write token cache {file}: {e}")
    return tensor


def token_digest(ids: torch.Tensor) -> str:
    """A short hash of token ids (1-D): which data a sweep ran on."""
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]


def corpus_ids(spec: str, split: str, tokenizer, max_tokens: int | None = None) -> torch.Tensor:
    """Token ids of a corpus spec's documents (see :func:`load_texts`), cut to the first ``max_tokens``."""
    ids = tokenize_corpus(load_texts(spec, split), tokenizer)
    return ids[:max_tokens] if max_tokens else ids
