"""Text in: corpus specs and their readers, the standard-library documentation corpus, tokenizing and its cache."""

from headprune.data.sources import SPLITS, TextFile, corpus_sources, load_texts
from headprune.data.stdlib_docs import default_documents, split_of
from headprune.data.tokens import check_ids, corpus_ids, token_digest, tokenize_corpus

__all__ = ["SPLITS", "TextFile", "check_ids", "corpus_ids", "corpus_sources", "default_documents", "load_texts",
           "split_of", "token_digest", "tokenize_corpus"]
