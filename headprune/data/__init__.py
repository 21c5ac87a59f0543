"""Text in: corpus specs and their readers, the standard-library documentation corpus, tokenizing and its cache.

The tokenizing names (torch) load on first use, so that reading or checking a corpus spec imports no torch."""

from headprune.data.sources import SPLITS, TextFile, check_corpus_spec, corpus_sources, load_texts
from headprune.data.stdlib_docs import default_documents, split_of

_TOKENS = ("check_ids", "corpus_ids", "token_digest", "tokenize_corpus")  # in headprune.data.tokens

__all__ = ["SPLITS", "TextFile", "check_corpus_spec", "check_ids", "corpus_ids", "corpus_sources",
           "default_documents", "load_texts", "split_of", "token_digest", "tokenize_corpus"]


def __getattr__(name: str):
    if name in _TOKENS:
        from headprune.data import tokens

        return getattr(tokens, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
