"""The long-document corpus (``--data longdocs``): whole long texts that every machine with Python has, for
long-window perplexity and the long-context tasks (:mod:`headprune.patching.long_tasks`).

Sources, all shipped with CPython itself and under the Python Software Foundation License (PSF-2.0; the licence
text is one of the documents):

- ``code:MODULE``: a standard-library module's source, whole, where it is at least
  :data:`MIN_CODE_CHARS` characters (``typing``, ``argparse``, ``tarfile``, ...: 30-40 modules, 4 M characters);
- ``topic:KEY``: a ``pydoc_data.topics`` entry (the language reference's chapters as ``help()`` shows them)
  of at least :data:`MIN_PROSE_CHARS` characters (``specialnames``, ``compound``, ``types``, ...);
- ``module:MODULE``: a module's docstrings in source order (the default corpus's document) of at least
  :data:`MIN_PROSE_CHARS` characters;
- ``license:python``: CPython's ``LICENSE.txt`` (its history and the PSF, BeOpen, CNRI and CWI licences).

The names are those of the ``code`` and ``default`` corpora, so a document falls in the same train/validation/test
split (:func:`~headprune.data.stdlib_docs.split_of`) in all three; what it holds depends on the Python version, as
theirs does.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from headprune.data.stdlib_docs import code_documents, default_documents

MIN_CODE_CHARS = 40_000  # ~10k tokens: a module at least this long fills an 8k-token window
MIN_PROSE_CHARS = 20_000  # ~5k tokens


def long_documents() -> list[tuple[str, str]]:
    """The corpus as sorted ``(name, text)`` pairs (see the module docstring)."""
    docs = {name: text for name, text in code_documents() if len(text) >= MIN_CODE_CHARS}
    docs |= {name: text for name, text in default_documents() if len(text) >= MIN_PROSE_CHARS}
    license_file = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    if license_file.is_file():
        docs["license:python"] = license_file.read_text(encoding="utf-8", errors="replace").strip()
    return sorted(docs.items())


def prose_documents() -> list[tuple[str, str]]:
    """The prose of :func:`long_documents` (topics, docstrings, the licence): the haystacks of the retrieval tasks."""
    return [(name, text) for name, text in long_documents() if not name.startswith("code:")]
