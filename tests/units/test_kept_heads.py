"""Both configs (GPT-2's GPT2Config and the families' HeadConfig) check the heads each layer keeps the same way."""

import pytest

from headprune.models.gpt2_config import GPT2Config
from headprune.models.head_config import HeadConfig

CONFIGS = [lambda kept: GPT2Config(d_model=8, n_layers=2, n_heads=4, kept_heads=kept),
           lambda kept: HeadConfig(d_model=8, n_layers=2, n_heads=4, n_kv_heads=2, kept_heads=kept)]


@pytest.mark.parametrize("make", CONFIGS)
def test_every_head_kept_by_default_and_a_valid_list_as_given(make):
    assert make([]).kept_heads == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert make([[0, 3], []]).kept_heads == [[0, 3], []]


@pytest.mark.parametrize("make", CONFIGS)
@pytest.mark.parametrize("kept", [[[0, 0], [1]], [[2, 1], [1]], [[0, 4], [1]], [[-1], [1]], [[0, 1]],
                                  [[0], [1], [2]]], ids=["repeated", "unsorted", "too high", "negative",
                                                         "too few layers", "too many layers"])
def test_a_bad_list_is_refused(make, kept):
    with pytest.raises(ValueError, match="kept_heads must list sorted distinct head indices below 4 for each of 2"):
        make(kept)


@pytest.mark.parametrize("config", [GPT2Config, HeadConfig])
def test_a_size_below_one_is_refused(config):
    with pytest.raises(ValueError, match="n_layers must be a positive integer, got 0"):
        config(n_layers=0)
