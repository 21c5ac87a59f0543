"""``refuse_same_data`` (fine-tuning must not train on its evaluation text) is keyed on two signals, each tested
here on its own: the corpus specs naming the same text (the tokens differ), and the token streams being equal
(the names differ). Removing either signal fails a test; neither firing lets training go ahead."""

import pytest
import torch

from headprune.data.overlap import refuse_same_data
from headprune.errors import HeadpruneError

TRAIN = torch.arange(100)
OTHER = torch.arange(100) + 7  # different tokens from TRAIN


@pytest.mark.parametrize("train_spec, eval_spec", [
    ("hf:wikitext:wikitext-2-raw-v1:test", "hf:wikitext:wikitext-2-raw-v1:test"),
    ("SAME", "SAME"),  # one file, spelt once as given and once through a symlink / relative path (below)
])
def test_refused_by_name_alone(train_spec, eval_spec, tmp_path, monkeypatch):
    if train_spec == "SAME":
        text = tmp_path / "corpus.txt"
        text.write_text("some text")
        (tmp_path / "link.txt").symlink_to(text)
        monkeypatch.chdir(tmp_path)
        train_spec, eval_spec = str(text), "link.txt"
    with pytest.raises(HeadpruneError, match="is the evaluation data"):
        refuse_same_data(train_spec, eval_spec, TRAIN, OTHER)  # the tokens differ: only the name can tell


def test_refused_by_tokens_alone(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"  # two files: the names differ
    with pytest.raises(HeadpruneError, match="is the evaluation data"):
        refuse_same_data(str(a), str(b), TRAIN, TRAIN.clone())
    with pytest.raises(HeadpruneError, match="is the evaluation data"):
        refuse_same_data("default", "hf:x:y:test", TRAIN, TRAIN.clone())


@pytest.mark.parametrize("train_spec, eval_spec", [
    ("default", "default"),  # the default corpus is split three ways: its train split is not its test split
    ("default", "hf:wikitext:wikitext-2-raw-v1:test"),
    ("hf:a:b:train", "hf:a:b:test"),
    ("FILES", "FILES"),
])
def test_allowed_when_neither_signal_fires(train_spec, eval_spec, tmp_path):
    if train_spec == "FILES":
        train_spec, eval_spec = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")
    refuse_same_data(train_spec, eval_spec, TRAIN, OTHER)  # no error
    refuse_same_data(train_spec, eval_spec, TRAIN, TRAIN[:-1])  # a prefix is other tokens
