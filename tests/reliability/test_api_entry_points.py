"""Issue 38, the API's other entry points: pruning, curves, loading and exporting called from Python with a bad
value get one HeadpruneError naming it, before any evaluation or write."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.write.export import export_hf, export_native
from headprune.pruning import curves
from headprune.pruning.apply import compensated_prune
from headprune.pruning.iterative import prune_iteratively
from headprune.pruning.options import CurveOptions
from headprune.pruning.prune import prune_model
from headprune.pruning.selection import select_heads


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)  # 3 layers × 4 heads


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 1000, (300,), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def scores():
    return pd.DataFrame({"layer": [layer for layer in range(3) for _ in range(4)], "head": list(range(4)) * 3,
                         "grad": [float(i) for i in range(12)]})


PRUNES = {  # id: (heads, the refusal's words)
    "a layer the model lacks": ([(5, 0)], "the model has no layer 5"),
    "a head the model lacks": ([(0, 9)], "the model has no head 9"),
    "a negative head": ([(0, -1)], "the model has no head -1"),
    "not pairs": ("L0H1", "heads must be \\(layer, head\\) pairs"),
}


@pytest.mark.parametrize("heads, words", PRUNES.values(), ids=PRUNES.keys())
@pytest.mark.parametrize("prune", ["prune_model", "compensated_prune"])
def test_prunes_of_heads_the_model_lacks(model, ids, prune, heads, words):
    call = {"prune_model": lambda: prune_model(model, heads),
            "compensated_prune": lambda: compensated_prune(model, heads, "mean", ids)}[prune]
    with pytest.raises(HeadpruneError, match=words):
        call()


def test_a_head_pruned_twice_is_refused(model):
    with pytest.raises(HeadpruneError, match="L0H1 was already pruned"):
        prune_model(prune_model(model, [(0, 1)]), [(0, 1)])


def test_a_head_listed_twice_is_one_head(model):
    """Heads are a set (check_heads deduplicates, as the CLI's L0H1,L0H1 does): listed twice removes it once."""
    twice, once = prune_model(model, [(0, 1), (2, 3), (0, 1)]), prune_model(model, [(2, 3), (0, 1)])
    assert twice.cfg.kept_heads == once.cfg.kept_heads == [[0, 2, 3], [0, 1, 2, 3], [0, 1, 2]]
    assert all(torch.equal(a, b) for a, b in zip(twice.state_dict().values(), once.state_dict().values(),
                                                  strict=True))


@pytest.mark.parametrize("fraction", [1.5, -0.1, float("nan"), True])
def test_a_fraction_outside_0_1_is_refused(model, scores, fraction):
    with pytest.raises(HeadpruneError, match="must be a number in \\[0, 1\\]"):
        select_heads(scores, "grad", fraction)
    with pytest.raises(HeadpruneError, match="must be a number in \\[0, 1\\]"):
        prune_iteratively(model, scores, "grad", fraction, show_progress=False)


CURVES = {  # id: (CurveOptions fields, the refusal's words)
    "no fractions": ({"fractions": ()}, "fractions is empty"),
    "a fraction twice": ({"fractions": (0.0, 0.5, 0.5)}, "fraction 0.5 is given twice"),
    "a fraction past 1": ({"fractions": (0.0, 1.5)}, "fraction 1.5 must be a number in \\[0, 1\\]"),
    "a NaN fraction": ({"fractions": (float("nan"),)}, "fraction nan must be a number"),
    "no seeds": ({"fractions": (0.5,), "seeds": 0}, "seeds 0 must be a whole number ≥ 1"),
    "bootstrap 1": ({"fractions": (0.5,), "bootstrap": 1}, "bootstrap 1: give 0"),
    "bootstrap negative": ({"fractions": (0.5,), "bootstrap": -3}, "bootstrap -3: give 0"),
}


@pytest.mark.parametrize("fields, words", CURVES.values(), ids=CURVES.keys())
def test_curve_options_refused_before_any_evaluation(model, ids, scores, monkeypatch, fields, words):
    def no_evaluation(*args, **kwargs):
        raise AssertionError("the curve evaluated a model")

    monkeypatch.setattr(curves, "run_units", no_evaluation)
    with pytest.raises(HeadpruneError, match=words):
        curves.pruning_curves(model, ids, scores, [("random", "none"), ("grad", "none")],
                              options=CurveOptions(**fields), show_progress=False)


CONFIGS = {  # id: (config.json, the refusal's words)
    "bert": ({"model_type": "bert", "architectures": ["BertForMaskedLM"]}, "holds a 'bert' model; headprune supports"),
    "phi3": ({"model_type": "phi3"}, "holds a 'phi3' model; headprune supports"),
    "no model_type": ({"architectures": ["LlamaForCausalLM"]}, "config.json has no model_type; headprune supports"),
}


@pytest.mark.parametrize("config, words", CONFIGS.values(), ids=CONFIGS.keys())
def test_load_model_of_an_unsupported_architecture(tmp_path, config, words):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadpruneError, match=words):
        load_model(tmp_path)


@pytest.mark.parametrize("export", [export_hf, export_native])
def test_export_into_a_folder_that_is_not_an_export(model, tmp_path, export):
    """A non-empty folder without headprune's export record, or a file: refused, left as it was."""
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(HeadpruneError, match="is a non-empty folder that is not a headprune export"):
        export(model, tmp_path)
    with pytest.raises(HeadpruneError, match="is a file; choose a folder"):
        export(model, tmp_path / "notes.txt")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"] and (tmp_path / "notes.txt").read_text() == "mine"
