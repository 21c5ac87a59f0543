"""Options are keyword-only in the public library API (issue 52, 5): an options object passed one place too early is
a TypeError, not a value silently landing in another parameter's slot."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

import headprune
from headprune.perplexity import Windowing
from headprune.pruning.gates import GateOptions
from headprune.pruning.options import CurveOptions
from headprune.scoring import ScoringOptions

#: entry point -> its inputs, the parameters that may be given by position; every other parameter is keyword-only
INPUTS = {
    "load_model": ("source",), "evaluate": ("model", "ids", "windowing"),
    "score_heads": ("model", "ids", "methods"), "head_means": ("model", "ids", "windowing"),
    "joint_constants": ("model", "ids", "heads", "windowing"), "prune_model": ("model", "heads", "fills"),
    "pruning_curves": ("model", "ids", "scores", "variants"), "learn_gates": ("model", "batches"),
    "head_anatomy": ("model", "probe", "corpus"), "export_native": ("model", "folder"),
    "export_hf": ("model", "folder"), "export_gguf": ("model", "path"),
}


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_only_the_inputs_are_positional(name):
    fn = getattr(importlib.import_module(headprune._EXPORTS[name]), name)
    params = inspect.signature(fn).parameters.values()
    positional = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    assert positional == INPUTS[name]
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params if p.name not in INPUTS[name])


def test_verify_ranking_takes_its_settings_by_keyword():
    from headprune.scoring.verified import verify_ranking

    params = inspect.signature(verify_ranking).parameters
    assert [p for p in params if params[p].kind is not inspect.Parameter.KEYWORD_ONLY] == [
        "model", "ids", "estimate", "method"]


def test_an_options_object_one_place_too_early_is_a_type_error(tiny_dir):
    from headprune import learn_gates, load_model, pruning_curves, score_heads
    from headprune.scoring.verified import Verification, verify_ranking

    model = load_model(tiny_dir)
    ids = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(0))
    w = Windowing.resolve(model.cfg.n_positions, 16, 16, 2)
    with pytest.raises(TypeError):
        score_heads(model, ids, "wo_fro", w, ScoringOptions(bootstrap=0))
    with pytest.raises(TypeError):
        score_heads(model, ids, "wo_fro", ScoringOptions(bootstrap=0))  # where windowing was
    with pytest.raises(TypeError):
        learn_gates(model, w.batches(ids), GateOptions(2))
    with pytest.raises(TypeError):
        pruning_curves(model, ids, None, [("wo_fro", "none")], CurveOptions((0.5,)))
    with pytest.raises(TypeError):
        verify_ranking(model, ids, torch.zeros(12), "abl_zero", Verification(2, 8))
    with pytest.raises(TypeError):
        load_model(tiny_dir, "cpu")
    assert score_heads(model, ids, "wo_fro", windowing=w, options=ScoringOptions(bootstrap=0),
                       show_progress=False).table["wo_fro"].notna().all()  # the keyword call works
