"""Tests for headprune.data.corpus: default corpus, splits, loaders, errors, cached tokenization."""

import hashlib
import inspect
import json

import pandas as pd
import pytest
import torch

from headprune.data import stdlib_docs
from headprune.data.sources import load_texts
from headprune.data.stdlib_docs import default_documents, split_of
from headprune.data.tokens import tokenize_corpus
from headprune.errors import HeadpruneError

EOS = "<|endoftext|>"


@pytest.fixture(autouse=True)
def token_cache(tmp_path, monkeypatch):
    """This module counts cache files: each test gets an empty cache."""
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path / "token-cache"))


@pytest.fixture(scope="module")
def docs():
    return default_documents()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tiny GPT-2 style byte-level BPE tokenizer, loaded the way models ship it."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    folder = tmp_path_factory.mktemp("tok")
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(["hello world, the quick brown fox jumps"] * 20, vocab_size=300,
                            special_tokens=[EOS], show_progress=False)
    bpe.save_model(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "bos_token": EOS, "unk_token": EOS}))
    return GPT2TokenizerFast.from_pretrained(folder)


# --- default corpus -------------------------------------------------------------------------


def test_default_documents_deterministic_sorted_unique(docs):
    # rebuilding the whole corpus takes seconds; rebuild one package twice, compare with the corpus
    root = stdlib_docs._stdlib_dir()
    email_docs = stdlib_docs._module_documents(root, root / "email")
    assert email_docs == stdlib_docs._module_documents(root, root / "email")
    assert email_docs == {n: t for n, t in docs if n.startswith("module:email")}
    assert "module:email.message" in email_docs and "module:email" in email_docs
    names = [n for n, _ in docs]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all(n.startswith(("topic:", "module:")) for n in names)
    assert all(text.strip() for _, text in docs)


def test_default_documents_content(docs):
    from pydoc_data.topics import topics

    by_name = dict(docs)
    for key, text in topics.items():
        assert by_name[f"topic:{key}"] == text.strip()
    doc = by_name["module:json"]
    assert doc.startswith(inspect.cleandoc(json.__doc__))
    assert inspect.cleandoc(json.dumps.__doc__) in doc
    # source order: dumps is defined before loads in json/__init__.py
    assert doc.index(inspect.cleandoc(json.dumps.__doc__)) < doc.index(inspect.cleandoc(json.loads.__doc__))
    assert not any(n.startswith("module:test.") or ".tests." in n or "idle_test" in n or "site-packages" in n
                   for n in by_name)
    total = sum(len(t) for _, t in docs)
    assert 1_000_000 < total < 5_000_000
    assert 300 < len(docs) < 3000


@pytest.fixture
def fake_stdlib(tmp_path, monkeypatch):
    """A two-module standard library (parsing the real one takes seconds), the parse counted, the lru cache empty."""
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "alpha.py").write_text('"""Alpha: a module docstring long enough to be kept in the corpus."""\n')
    (root / "pkg" / "__init__.py").write_text('"""Pkg: another module docstring that is long enough to keep."""\n')
    monkeypatch.setattr(stdlib_docs, "_stdlib_dir", lambda: root)
    parses = []
    real = stdlib_docs._parse_default_documents
    monkeypatch.setattr(stdlib_docs, "_parse_default_documents", lambda: parses.append(1) or real())
    stdlib_docs._default_documents.cache_clear()
    yield root, parses
    stdlib_docs._default_documents.cache_clear()


def test_default_documents_cached_on_disk_and_validated(fake_stdlib, tmp_path):
    root, parses = fake_stdlib
    first = default_documents()
    assert len(parses) == 1 and ("module:alpha", "Alpha: a module docstring long enough to be kept in the corpus.") \
        in first and ("module:pkg", "Pkg: another module docstring that is long enough to keep.") in first
    [entry] = (tmp_path / "token-cache").glob("stdlib-documents-*.json")
    stdlib_docs._default_documents.cache_clear()
    assert default_documents() == first and len(parses) == 1  # a new process: read, not parsed
    text = entry.read_text(encoding="utf-8")
    entry.write_text(text.replace("Alpha: a module", "Alpha: a mod-ule"), encoding="utf-8")  # damaged, same shape
    stdlib_docs._default_documents.cache_clear()
    assert default_documents() == first and len(parses) == 2  # the checksum caught it: parsed again, entry rewritten
    assert entry.read_text(encoding="utf-8") == text
    entry.write_text("{not json", encoding="utf-8")
    stdlib_docs._default_documents.cache_clear()
    assert default_documents() == first and len(parses) == 3
    (root / "alpha.py").write_text('"""Alpha, edited: the standard library changed under the cache entry."""\n')
    stdlib_docs._default_documents.cache_clear()
    assert ("module:alpha", "Alpha, edited: the standard library changed under the cache entry.") in default_documents()
    assert len(parses) == 4 and len(list((tmp_path / "token-cache").glob("stdlib-documents-*.json"))) == 2


def test_split_of_matches_rule_and_is_stable():
    for name in ["doc0", "topic:assert", "module:os.path", "ü"]:
        bucket = int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:16], 16) % 100
        expected = "train" if bucket < 90 else ("validation" if bucket < 95 else "test")
        assert split_of(name) == expected
    assert [split_of(f"doc{i}") for i in (0, 6, 38, 5, 39)] == ["train", "validation", "validation", "test", "test"]
    counts = pd.Series([split_of(f"name-{i}") for i in range(20_000)]).value_counts(normalize=True)
    assert abs(counts["train"] - 0.90) < 0.01
    assert abs(counts["validation"] - 0.05) < 0.007
    assert abs(counts["test"] - 0.05) < 0.007


def test_default_splits_partition_corpus(docs):
    parts = {s: load_texts("default", s) for s in ("train", "validation", "test")}
    assert sum(map(len, parts.values())) == len(docs)
    assert sorted(t for p in parts.values() for t in p) == sorted(t for _, t in docs)
    n = len(docs)
    assert 0.85 < len(parts["train"]) / n < 0.95
    assert 0.02 < len(parts["validation"]) / n < 0.08 and 0.02 < len(parts["test"]) / n < 0.08
    expected_test = [t for name, t in docs if split_of(name) == "test"]
    assert parts["test"] == expected_test


def test_code_corpus_is_the_module_sources_split_with_their_docstrings(docs):
    """``code``: each module's source file as written, in the split of the same module's docstrings."""
    import sysconfig
    from pathlib import Path

    root = Path(sysconfig.get_paths()["stdlib"])
    source = (root / "asyncio" / "futures.py").read_text(encoding="utf-8").strip()
    split = split_of("module:asyncio.futures")
    assert source in load_texts("code", split)
    assert all(source not in load_texts("code", s) for s in ("train", "validation", "test") if s != split)
    docstrings = dict(docs)["module:asyncio.futures"]
    assert docstrings in load_texts("default", split)
    n = len(stdlib_docs.code_documents())
    parts = {s: load_texts("code", s) for s in ("train", "validation", "test")}
    assert sum(map(len, parts.values())) == n and 0.02 < len(parts["test"]) / n < 0.08


# --- local files ------------------------------------------------------------------------------


def test_txt_file_and_directory(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("héllo wörld\nline 2\n", encoding="utf-8")
    assert load_texts(str(f), "test") == ["héllo wörld\nline 2\n"]
    d = tmp_path / "dir"
    d.mkdir()
    (d / "b.txt").write_text("second")
    (d / "a.txt").write_text("first")
    (d / "ignored.md").write_text("not text corpus")
    assert load_texts(str(d), "train") == ["first", "second"]


def test_jsonl_and_parquet(tmp_path):
    rows = [{"text": "one", "id": 1}, {"text": "twö", "id": 2}]
    jl = tmp_path / "c.jsonl"
    jl.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    assert load_texts(str(jl), "validation") == ["one", "twö"]
    pq = tmp_path / "c.parquet"
    pd.DataFrame(rows).to_parquet(pq)
    assert load_texts(str(pq), "validation") == ["one", "twö"]


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "missing.txt", "does not exist"),
        (lambda p: _write(p / "empty.txt", b""), "no text"),
        (lambda p: _write(p / "blank.txt", b"  \n\t\n"), "no text"),
        (lambda p: _write(p / "latin1.txt", b"abc\xe9def"), "offset 3"),
        (lambda p: _write(p / "x.jsonl", b'{"body": "hi"}\n'), "no 'text' column"),
        (lambda p: _parquet(p / "x.parquet", {"body": ["hi"]}), "no 'text' column"),
        (lambda p: _write(p / "x.jsonl", b'{"text": "  "}\n'), "no text"),
        (lambda p: _write(p / "x.jsonl", b"not json\n"), "could not read"),
        (lambda p: _write(p / "x.csv", b"text\nhi\n"), "unsupported corpus file"),
        (lambda p: (p / "emptydir").mkdir() or p / "emptydir", "no .txt files"),
    ],
)
def test_bad_local_inputs(tmp_path, make, needle):
    path = make(tmp_path)
    with pytest.raises(HeadpruneError) as info:
        load_texts(str(path), "train")
    message = str(info.value)
    assert needle in message and "\n" not in message
    if path.exists() and path.is_file():
        assert str(path) in message


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _parquet(path, columns):
    pd.DataFrame(columns).to_parquet(path)
    return path


@pytest.mark.parametrize("spec", ["", "hf:", "hf:name", "hf:a:b:c:d", "hf::train"])
def test_malformed_specs(spec):
    with pytest.raises(HeadpruneError):
        load_texts(spec, "train")


def test_unknown_split():
    with pytest.raises(HeadpruneError, match="unknown split"):
        load_texts("default", "dev")


def test_hf_dataset_unavailable_offline(tmp_path, monkeypatch):
    import datasets

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
        monkeypatch.setattr(datasets.config, var, True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    with pytest.raises(HeadpruneError, match="could not load Hugging Face dataset 'nobody/no-such-set'") as info:
        load_texts("hf:nobody/no-such-set:wikitext-2:test", "train")
    assert "no network" in str(info.value) and "'test'" in str(info.value)


# --- tokenization -----------------------------------------------------------------------------


def test_tokenize_joins_with_eos(tokenizer, tmp_path):
    texts = ["hello world", "the quick brown fox", "", "jumps"]
    ids = tokenize_corpus(texts, tokenizer, tmp_path / "c")
    eos = tokenizer.convert_tokens_to_ids(EOS)
    expected = []
    for i, text in enumerate(texts):
        if i:
            expected.append(eos)
        expected += tokenizer.encode(text, add_special_tokens=False)
    assert ids.dtype == torch.long and ids.dim() == 1
    assert ids.tolist() == expected
    assert (ids == eos).sum().item() == len(texts) - 1
    assert tokenizer.decode(ids.tolist()) == EOS.join(texts)


def test_tokenize_cache_hit_skips_tokenizer(tokenizer, tmp_path, monkeypatch):
    texts = ["hello world"] * 3 + ["fox"]
    first = tokenize_corpus(texts, tokenizer)  # default cache dir = $HEADPRUNE_CACHE
    cached = list((tmp_path / "token-cache").glob("*.safetensors"))
    assert len(cached) == 1

    def boom(*args, **kwargs):
        raise AssertionError("tokenizer called on a cache hit")

    monkeypatch.setattr(type(tokenizer), "__call__", boom)
    monkeypatch.setattr(type(tokenizer), "encode", boom)
    assert torch.equal(tokenize_corpus(list(texts), tokenizer), first)
    with pytest.raises(AssertionError):  # other texts: a miss
        tokenize_corpus(texts + ["more"], tokenizer)
    monkeypatch.undo()
    cached[0].write_bytes(b"garbage")  # a corrupt cache file is rebuilt
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path / "token-cache"))
    assert torch.equal(tokenize_corpus(texts, tokenizer), first)
    assert not list((tmp_path / "token-cache").glob("*.tmp"))
