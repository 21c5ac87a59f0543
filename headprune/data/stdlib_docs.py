"""The default corpus: the Python standard library's own documentation, on every machine.

One document per ``pydoc_data.topics`` entry and one per standard-library module with docstrings, split
deterministically into train/validation/test by document name (:func:`split_of`); parsed once and cached."""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import os
import sys
import sysconfig
from pathlib import Path

from headprune.data.cache import default_cache_dir
from headprune.errors import HeadpruneError, warn
from headprune.io.work.files import atomic_path

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


def code_documents() -> list[tuple[str, str]]:
    """The code corpus as sorted ``(name, text)`` pairs: one document per standard-library module, its Python
    source as written (``code:dotted.name``), the files :func:`default_documents` reads docstrings from (tests and
    ``site-packages`` left out); files that are not UTF-8 or are empty are skipped. Split by :func:`split_of` of the
    module name, so a module's docstrings (prose) and its source (code) fall in the same split."""
    root = _stdlib_dir()
    docs = {}
    for path in _python_files(root):
        try:
            text = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text:
            docs[f"code:{_module_name(path, root)}"] = text
    return sorted(docs.items())


def split_of(name: str) -> str:
    """Deterministic split of a document name: ~90% ``train``, ~5% ``validation``, ~5% ``test``; a module's code
    document (``code:NAME``) falls where its docstrings (``module:NAME``) do."""
    name = "module:" + name.removeprefix("code:") if name.startswith("code:") else name
    bucket = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % 100
    return "train" if bucket < 90 else "validation" if bucket < 95 else "test"
