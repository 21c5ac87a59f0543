"""Documents -> one 1-D tensor of token ids, documents separated by the tokenizer's end-of-text token.

Tokenizing streams long documents in bounded pieces and stops at ``max_tokens``; results are cached on disk
(:func:`headprune.data.cache.default_cache_dir`), each entry with a checksum."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from headprune.data.cache import default_cache_dir
from headprune.data.sources import Source, TextFile, corpus_sources
from headprune.errors import HeadpruneError, warn
from headprune.io.work.files import atomic_path


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


#: Long documents are tokenized in pieces of about this many characters, cut where a space stands between two
#: non-space characters, or a newline between two letters or digits: byte-level BPE pre-tokenizers (GPT-2's, and
#: the Llama-3 / Qwen regex) never join across such a space or newline, so the pieces' tokens are exactly the
#: document's, and memory stays bounded however long a line is.
PIECE_CHARS = 1 << 16
#: No piece is longer than this, whatever the content: text without any such space or newline (one 50 MB "word")
#: is cut here regardless, which may split one token in two at each such cut (one per 256 Ki characters).
MAX_PIECE_CHARS = 1 << 18


def _pieces(source: Source, size: int = PIECE_CHARS, hard: int = MAX_PIECE_CHARS):
    """The document in pieces of about ``size`` characters (see :data:`PIECE_CHARS`), never more than ``hard``; a
    file is read chunk by chunk, so only about one chunk is held at a time."""
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
        cut = _safe_cut(text, start, size, hard) if len(text) - start > size else -1
        if cut < 0 and more and len(text) - start < hard:  # no safe cut in what is read so far: read on
            read()
            continue
        if cut < 0 and len(text) - start > hard:  # no safe cut within ``hard`` characters: cut there anyway
            cut = start + hard
        if cut < 0:
            yield text[start:]
            return
        yield text[start:cut]
        start = cut


def _safe_cut(text: str, start: int, size: int, hard: int = MAX_PIECE_CHARS) -> int:
    """In ``text[start:start + hard]``: the last safe cut (see :data:`PIECE_CHARS`) before ``start + size``, else
    the first after it, as an index of ``text``; -1: none."""
    end = min(len(text), start + hard)

    def safe(i: int) -> bool:
        if not start < i < len(text) - 1:
            return False
        if text[i] == " ":
            return not text[i - 1].isspace() and not text[i + 1].isspace()
        return text[i - 1].isalnum() and text[i + 1].isalnum()

    best = -1
    for mark in (" ", "\n"):
        cut = text.rfind(mark, start + 1, min(start + size, end))
        while cut > start and not safe(cut):
            cut = text.rfind(mark, start + 1, cut)
        if cut > start:
            best = max(best, cut)
    if best > start:
        return best
    after = []
    for mark in (" ", "\n"):
        cut = text.find(mark, start + size, end)
        while 0 <= cut and not safe(cut):
            cut = text.find(mark, cut + 1, end)
        if cut >= 0:
            after.append(cut)
    return min(after) if after else -1


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
        raise HeadpruneError("the corpus has no text (empty or only whitespace); "
                             "give a corpus with non-whitespace text")
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
        raise HeadpruneError("the tokenizer has no eos token (documents are joined by it); use a tokenizer that "
                             "declares one (GPT-2's <|endoftext|>, an eos_token in tokenizer_config.json)")
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
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() != 1:
        raise HeadpruneError(f"token ids of {source} must be a 1-D int64 tensor, got "
                             f"{type(ids).__name__ if not isinstance(ids, torch.Tensor) else tuple(ids.shape)}; use "
                             "headprune.tokens(...) or torch.tensor(ids)")
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


def tokens(spec: str, split: str, model, max_tokens: int | None = None) -> torch.Tensor:
    """Token ids (1-D) of corpus ``spec``'s ``split`` in ``model``'s tokenizer, cut to ``max_tokens``: what the
    commands read for ``--data spec`` (:func:`corpus_ids` with :func:`model_tokenizer`)."""
    from headprune.io.read.tokenizer import model_tokenizer

    return corpus_ids(spec, split, model_tokenizer(model), max_tokens)

