"""Curve points started from residual streams of models evaluated before (a shared prefix of pruned layers) equal
points computed from the embeddings, bit for bit, and take fewer layers."""

import pandas as pd
import pytest
import torch

import headprune.pruning.curves as curves_module
from headprune.io.read.loading import load_model
from headprune.perplexity import Windowing
from headprune.pruning.curves import layer_keys, pruning_curves
from headprune.pruning.options import Compensation, CurveOptions, Selection
from headprune.scoring import score_heads

from helpers import TINY

SEQ, WINDOWS = 16, 4
# the same heads with and without mean compensation: their layers differ by the fills alone
VARIANTS = [("abl_zero", "none"), ("wo_fro", "none"), ("wo_fro@layer", "none"), ("random", "none"),
            ("abl_zero", "mean"), ("wo_fro", "mean")]
FRACTIONS = (0.0, 0.25, 0.5, 0.75)


@pytest.fixture(scope="module")
def inputs(tiny_dir):
    model = load_model(tiny_dir)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, TINY["vocab_size"], (SEQ * WINDOWS,), generator=gen)
    windowing = Windowing(SEQ, SEQ, 2)
    scored = score_heads(model, ids, ["wo_fro", "fluct", "abl_zero"], windowing=windowing, show_progress=False)
    return model, ids, windowing, scored


def _curves(inputs, monkeypatch, **limits) -> tuple[pd.DataFrame, int]:
    """The curves with the cache limits given, and the number of layers the evaluations ran."""
    model, ids, windowing, scored = inputs
    for name, value in limits.items():
        monkeypatch.setattr(curves_module, name, value)
    layers = []
    work = curves_module.pruned_window_sums

    def counting(pruned, batches, start=0, streams=None, keep=None):
        layers.append(pruned.cfg.n_layers - start)
        return work(pruned, batches, start, streams, keep)

    monkeypatch.setattr(curves_module, "pruned_window_sums", counting)
    options = CurveOptions(FRACTIONS, seeds=3, bootstrap=4, selection=Selection(seed=2), windowing=windowing)
    df = pruning_curves(model, ids, scored.table, VARIANTS, options=options,
                        compensation=Compensation(means=scored.means), show_progress=False)
    monkeypatch.undo()
    return df, sum(layers)


def test_shared_prefixes_change_no_value_and_save_layers(inputs, monkeypatch):
    shared, shared_layers = _curves(inputs, monkeypatch)
    unpruned_only, first_pruned_layers = _curves(inputs, monkeypatch, PREFIX_CACHE_BYTES=0)
    embeddings, all_layers = _curves(inputs, monkeypatch, CACHE_BYTES=0)
    columns = ["nll", "ppl", "delta_nll", "nll_std", "delta_nll_ci_lo", "delta_nll_ci_hi"]
    pd.testing.assert_frame_equal(shared[columns], embeddings[columns], check_exact=True)
    pd.testing.assert_frame_equal(unpruned_only[columns], embeddings[columns], check_exact=True)
    assert shared_layers < first_pruned_layers < all_layers


def test_layer_keys_name_each_layers_heads_and_fills():
    fills = {(0, 1): torch.tensor([1.0, 2.0]), (2, 0): torch.tensor([0.5, 0.0]), (2, 3): torch.zeros(2)}
    keys = layer_keys([(2, 3), (0, 1), (2, 0)], fills, 4)
    double = lambda t: t.double().numpy().tobytes()
    assert keys == (((1, double(fills[(0, 1)])),), (), ((0, double(fills[(2, 0)])), (3, double(fills[(2, 3)]))), ())
    assert layer_keys([(2, 3), (0, 1)], None, 3) == (((1, None),), (), ((3, None),))
    bf16 = {(0, 1): torch.tensor([1.0, 2.0], dtype=torch.bfloat16)}  # exactly representable: the same key
    assert layer_keys([(0, 1)], bf16, 1) == layer_keys([(0, 1)], {(0, 1): torch.tensor([1.0, 2.0])}, 1)
