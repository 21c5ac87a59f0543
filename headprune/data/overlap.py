"""Whether training text contains the evaluation text, decided by content: fine-tuning on what is evaluated
would overstate recovery.

Both token streams are first *normalised*: every token that decodes to whitespace only (spaces, ``\\n``,
``\\r\\n``, tabs) and the end-of-text separator are dropped, so a copy with CRLF line ends, one more newline or
other document boundaries gives the same stream. Then every window of ``n`` = :data:`NGRAM` consecutive
normalised evaluation tokens is hashed (a polynomial hash mod 2^64) into a set E, and the training stream is
read in chunks of :data:`CHUNK` tokens, each hashed the same way and looked up in E. The overlap is

    share = #{evaluation n-gram positions whose n-gram occurs in the training stream} / #{evaluation positions}

and a share above :data:`MAX_SHARE` is refused, naming the training document that holds most of them. Disjoint
text shares few 13-grams (the default corpus' train and test splits: 1.2%; other pages of pydoc's topics: 11%);
a copy, a prefix, a directory holding the evaluation file, or training text that contains it give about 100%.
Memory: E (8 bytes per evaluation token) plus one chunk; time: linear in both streams.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from headprune.errors import HeadpruneError

#: Tokens per hashed n-gram: long enough that disjoint text almost never shares one, short enough that a few
#: edited tokens leave most n-grams of a copy intact.
NGRAM = 13
#: The largest share of evaluation n-grams that may occur in the training text: copies and containers give ~100%;
#: other pages of the same technical manual share up to ~11% (pydoc topics: repeated grammar and boilerplate).
MAX_SHARE = 0.5
#: Training tokens hashed at a time (bounded memory for any training stream).
CHUNK = 1 << 21
_BASE = np.uint64(1_000_003)


def whitespace_ids(tokenizer) -> np.ndarray:
    """Sorted ids of the tokens that decode to whitespace only, plus the eos token (cached on the tokenizer)."""
    cached = getattr(tokenizer, "_headprune_whitespace_ids", None)
    if cached is not None:
        return cached
    vocab = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(vocab)], clean_up_tokenization_spaces=False)
    ids = [i for i, t in enumerate(texts) if t != "" and t.isspace()]
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    out = np.unique(np.asarray(ids, dtype=np.int64))
    try:
        tokenizer._headprune_whitespace_ids = out
    except AttributeError:
        pass
    return out


def _normalised(ids: np.ndarray, drop: np.ndarray) -> np.ndarray:
    return ids[~np.isin(ids, drop)] if len(drop) else ids


def ngram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """h_t = Σ_j ids[t+j] · B^(n−1−j) mod 2^64 for every start t (len(ids) − n + 1 of them)."""
    if len(ids) < n:
        return np.zeros(0, dtype=np.uint64)
    x = ids.astype(np.uint64)
    m = len(x) - n + 1
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _BASE + x[j : j + m]
    return h


def overlap(train_ids: torch.Tensor, eval_ids: torch.Tensor, tokenizer, n: int = NGRAM
            ) -> tuple[float, int | None, int]:
    """(share of the evaluation's n-gram positions found in the training stream, index of the training document
    holding most matches or None, n used). Documents are counted by the eos separators of ``train_ids``."""
    drop = whitespace_ids(tokenizer)
    ev = _normalised(eval_ids.numpy(), drop)
    n = min(n, len(ev))
    if n == 0:
        return 0.0, None, 0
    eh = ngram_hashes(ev, n)
    keys, inverse = np.unique(eh, return_inverse=True)
    seen = np.zeros(len(keys), dtype=bool)
    train = train_ids.numpy()
    eos = tokenizer.eos_token_id
    hits_per_doc: dict[int, int] = {}
    doc_base, step = 0, CHUNK
    for start in range(0, len(train), step):
        raw = train[start : start + step + 4 * n]  # the overlap keeps n-grams across chunk ends (whitespace dropped)
        docs = doc_base + (np.cumsum(raw == eos) if eos is not None else np.zeros(len(raw), dtype=np.int64))
        keep = ~np.isin(raw, drop)
        tokens, doc_of = raw[keep], docs[keep]
        inside = int(keep[:step].sum())  # n-grams starting in this chunk proper
        h = ngram_hashes(tokens, n)[:inside]
        if len(h):
            pos = np.searchsorted(keys, h).clip(max=len(keys) - 1)
            found = keys[pos] == h
            seen[pos[found]] = True
            for d, c in zip(*np.unique(doc_of[: len(h)][found], return_counts=True)):
                hits_per_doc[int(d)] = hits_per_doc.get(int(d), 0) + int(c)
        if eos is not None:
            doc_base += int((train[start : start + step] == eos).sum())
    share = float(seen[inverse].mean())
    top = max(hits_per_doc, key=lambda d: hits_per_doc[d]) if hits_per_doc else None
    return share, top, n


def _document_name(spec: str, index: int) -> str:
    """A readable name of training document ``index`` of ``spec``: a directory's file, else the spec itself."""
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".txt" and p.is_file())
        if 0 <= index < len(files):
            return str(files[index])
    return spec if index == 0 else f"document {index + 1} of {spec}"


def refuse_same_data(train_spec: str, eval_spec: str, train_ids: torch.Tensor, eval_ids: torch.Tensor,
                     tokenizer) -> None:
    """HeadpruneError where more than :data:`MAX_SHARE` of the evaluation's normalised n-grams occur in the
    training stream (see the module docstring), naming the training document with most of them."""
    share, top, n = overlap(train_ids, eval_ids, tokenizer)
    if share > MAX_SHARE:
        where = _document_name(train_spec, top) if top is not None else train_spec
        raise HeadpruneError(f"the training data {train_spec!r} contains the evaluation data {eval_spec!r}: "
                             f"{100 * share:.1f}% of its {n}-token sequences occur in the training text (most in "
                             f"{where}); fine-tuning on it would overstate recovery; give another --train-data or "
                             "--data")
