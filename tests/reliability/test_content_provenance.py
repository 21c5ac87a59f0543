"""Issue 26, class 1: training on its own evaluation text is refused by content, whatever the file looks like."""

from __future__ import annotations

import pydoc_data.topics
import time

import pytest
import torch

from headprune.cli.main import main
from headprune.data.overlap import MAX_SHARE, overlap, refuse_same_data
from headprune.data.tokens import corpus_ids
from headprune.errors import HeadpruneError
from headprune.io.read.tokenizer import _gpt2_bpe

TOPICS = list(pydoc_data.topics.topics.values())


@pytest.fixture(scope="module")
def tok():
    return _gpt2_bpe()


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """An evaluation file of many short lines, and its hostile relatives."""
    d = tmp_path_factory.mktemp("overlap")
    text = "\n".join(line for t in TOPICS[:25] for line in t.splitlines()[:30] if line.strip()) + "\n"
    (d / "evaldir").mkdir()
    ev = d / "evaldir" / "eval.txt"
    ev.write_text(text)
    (d / "crlf.txt").write_bytes(text.replace("\n", "\r\n").encode())
    (d / "plus_newline.txt").write_text(text + "\n")
    (d / "contains.txt").write_text(" ".join(TOPICS[40:45]) + "\n" + text + " ".join(TOPICS[45:50]))
    (d / "prefix.txt").write_text(text[: len(text) // 3])
    (d / "other.txt").write_text(" ".join(TOPICS[50:70]))
    (d / "evaldir" / "another.txt").write_text(" ".join(TOPICS[70:72]))
    return d


@pytest.mark.parametrize("train", ["crlf.txt", "plus_newline.txt", "contains.txt", "evaldir"])
def test_copies_and_containers_of_the_eval_text_are_refused(tok, texts, train):
    ev = corpus_ids(str(texts / "evaldir" / "eval.txt"), "test", tok)
    tr = corpus_ids(str(texts / train), "train", tok)
    with pytest.raises(HeadpruneError) as err:
        refuse_same_data(str(texts / train), "eval.txt", tr, ev, tok)
    msg = str(err.value)
    assert "eval.txt" in msg and "% of its 13-token sequences" in msg
    if train == "evaldir":  # the file of the directory that holds the overlap is named
        assert str(texts / "evaldir" / "eval.txt") in msg


def test_eval_text_that_is_part_of_the_training_text(tok, texts):
    """The evaluation file is the first third of the training text: all of its n-grams occur there."""
    ev = corpus_ids(str(texts / "prefix.txt"), "test", tok)
    tr = corpus_ids(str(texts / "evaldir" / "eval.txt"), "train", tok)
    share, _, _ = overlap(tr, ev, tok)
    assert share > 0.99
    with pytest.raises(HeadpruneError, match="contains the evaluation data"):
        refuse_same_data("eval.txt", "prefix.txt", tr, ev, tok)


def test_disjoint_text_passes_and_the_default_splits_share_little(tok, texts):
    ev = corpus_ids(str(texts / "evaldir" / "eval.txt"), "test", tok)
    tr = corpus_ids(str(texts / "other.txt"), "train", tok)
    refuse_same_data("other.txt", "eval.txt", tr, ev, tok)  # no error (they share 11%: the manual's boilerplate)
    share, _, _ = overlap(corpus_ids("default", "train", tok), corpus_ids("default", "test", tok), tok)
    assert share < MAX_SHARE / 4  # measured 1.2%: the threshold lies far above what disjoint docs share


def test_hand_counted_share_and_large_streams_are_fast(tok):
    """Hand count: eval = 26 distinct ids; training holds exactly the first 20 of them in order, so 20 − 13 + 1 = 8
    of the eval's 14 13-gram positions occur. And 8 M training tokens take well under a few seconds."""
    ev = torch.arange(1000, 1026)
    tr = torch.cat([torch.arange(2000, 2100), ev[:20], torch.arange(3000, 3100)])
    share, top, n = overlap(tr, ev, tok)
    assert n == 13 and share == pytest.approx(8 / 14) and top == 0
    big = torch.randint(100, 50000, (8_000_000,), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    share, _, _ = overlap(big, torch.randint(100, 50000, (50_000,), generator=torch.Generator().manual_seed(1)), tok)
    assert share == 0.0 and time.perf_counter() - start < 20


def test_finetune_refuses_a_crlf_copy_before_any_work(tiny_dir, texts, tmp_path, capsys):
    pruned = tmp_path / "p"
    assert main(["prune", "--model", str(tiny_dir), "--heads", "L0H1", "--out", str(pruned), "--device", "cpu"]) == 0
    capsys.readouterr()
    out = tmp_path / "rec"
    code = main(["finetune", str(pruned), "--steps", "1", "--out", str(out), "--train-data", str(texts / "crlf.txt"),
                 "--data", str(texts / "evaldir" / "eval.txt"), "--seq-len", "16", "--quiet", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "contains the evaluation data" in err
    assert not out.exists() and not list(tmp_path.glob("*.pt"))
