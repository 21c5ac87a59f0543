"""Issue 26, class 7: the Python API raises HeadpruneError with a clear message, never a raw torch error or a
silent success."""

from __future__ import annotations

import pytest
import torch

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.pruning.prune import prune_model
from headprune.scoring import joint_constants, optimal_constants, score_heads


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 1000, (200,), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("bad", ["2d", "float", "oov", "negative"])
def test_score_heads_refuses_bad_ids(model, ids, bad):
    given = {"2d": ids.view(2, -1), "float": ids.float(), "oov": torch.cat([ids, torch.tensor([60000])]),
             "negative": torch.cat([ids, torch.tensor([-1])])}[bad]
    with pytest.raises(HeadpruneError, match="token ids"):
        score_heads(model, given, ["abl_zero"], show_progress=False)


def test_forward_refuses_out_of_vocabulary_ids(model):
    with pytest.raises(HeadpruneError, match=r"outside the model's vocabulary \[0, 50257\)"):
        model(torch.tensor([[1, 2, 50257]]))
    with pytest.raises(HeadpruneError, match="integer tensor"):
        model(torch.tensor([[1.0, 2.0]]))


@pytest.mark.parametrize("heads", [[(0, 1.5)], [(True, 1)], [(0, "1")], [(0,)]])
def test_prune_model_refuses_non_integer_heads(model, heads):
    with pytest.raises(HeadpruneError, match="whole number"):
        prune_model(model, heads)


def test_prune_model_accepts_numpy_and_torch_integers(model):
    import numpy as np

    pruned = prune_model(model, [(np.int64(0), torch.tensor(1))])
    assert pruned.cfg.kept_heads[0] == [0, 2, 3]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_prune_model_refuses_non_finite_fills(model, value):
    fill = torch.zeros(model.cfg.d_head)
    fill[2] = value
    with pytest.raises(HeadpruneError, match="finite"):
        prune_model(model, [(0, 1)], {(0, 1): fill})


@pytest.mark.parametrize("fn", [optimal_constants, joint_constants])
def test_constants_of_heads_that_do_not_exist(model, ids, fn):
    with pytest.raises(HeadpruneError, match="the model has no (layer|head)"):
        fn(model, ids, [(7, 0)], show_progress=False)
    with pytest.raises(HeadpruneError, match="the model has no head"):
        fn(model, ids, [(0, 9)], show_progress=False)
