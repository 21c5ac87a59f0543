"""Passes split by a memory budget give what the whole batch gives: the gradient scores with each block
checkpointed and one window per backward, the entropy sums with the probabilities reduced inside the forward, and
the head roles and logit attribution one window at a time (float64, so rounding cannot hide a difference)."""

from __future__ import annotations

import pytest
import torch

from headprune.anatomy import attribution, roles
from headprune.io.read.loading import load_model
from headprune.models.head_config import HeadConfig
from headprune.models.memory import backward_windows, capture_windows, pattern_windows
from headprune.perplexity import Batch
from headprune.scoring import activations, gradients


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


@pytest.fixture(scope="module")
def model_and_batch(tiny_dir):
    model = load_model(tiny_dir).double()
    tokens = torch.randint(0, 30, (4, 20), generator=torch.Generator().manual_seed(3))  # duplicates for the roles
    mask = torch.rand(4, 19, generator=torch.Generator().manual_seed(4)) > 0.2
    return model, Batch(tokens, mask)


def test_gradients_one_window_per_checkpointed_backward_equal_the_whole_batch(model_and_batch, monkeypatch):
    model, batch = model_and_batch
    assert backward_windows(model.cfg, 20)[0] >= 4 and not backward_windows(model.cfg, 20)[1]  # one backward
    whole = gradients.batch_gate_grad(model, batch)
    monkeypatch.setattr(gradients, "backward_windows", lambda cfg, seq_len: (1, True))
    split = gradients.batch_gate_grad(model, batch)
    assert split["n"] == whole["n"]
    expected = f64(whole["dL_dg"])
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(f64(split["dL_dg"]), expected, rtol=1e-10, atol=1e-12)


def test_entropy_reduced_in_the_forward_and_split_equals_the_whole_probabilities(model_and_batch, monkeypatch):
    model, batch = model_and_batch
    whole = activations.batch_sums(model, batch)
    probs_capture = activations.Capture()
    model(batch.tokens, capture=probs_capture, need_weights=True)
    m = batch.mask.double()
    reference = torch.cat([(-torch.special.xlogy(probs_capture.attn[l], probs_capture.attn[l]).sum(-1)[:, :, :19]
                            * m[:, None]).sum(-1) for l in model.active_layers], 1)  # (b, H) from the whole (b,h,T,T)
    torch.testing.assert_close(f64(whole["sum_entropy"]), reference, rtol=1e-12, atol=1e-12)
    assert capture_windows(model.cfg, 20) >= 4 and pattern_windows(model.cfg, 20) >= 4  # one forward
    whole_z = activations.batch_sums(model, batch, entropy=False)  # no probabilities: the fused attention
    for budget in ("pattern_windows", "capture_windows"):  # either budget alone splits the batch
        with monkeypatch.context() as patched:
            patched.setattr(activations, budget, lambda cfg, seq_len: 1)
            for entropy, reference in ((True, whole), (False, whole_z)):
                split = activations.batch_sums(model, batch, entropy)
                assert split.keys() == reference.keys()
                for key in reference:
                    torch.testing.assert_close(f64(split[key]), f64(reference[key]), rtol=1e-12, atol=1e-12)


def test_roles_and_attribution_one_window_at_a_time_equal_the_whole_batch(model_and_batch, monkeypatch):
    model, batch = model_and_batch
    roles_whole = roles.detect_heads(model, batch.tokens)
    dla_whole = attribution.logit_attribution(model, batch.tokens)
    monkeypatch.setattr(roles, "pattern_windows", lambda cfg, seq_len: 1)
    monkeypatch.setattr(attribution, "capture_windows", lambda cfg, seq_len: 1)
    roles_split = roles.detect_heads(model, batch.tokens)
    dla_split = attribution.logit_attribution(model, batch.tokens)
    for role in roles.ROLES:
        assert roles_whole[role].abs().max() > 0
        torch.testing.assert_close(torch.tensor(roles_split[role].values), torch.tensor(roles_whole[role].values),
                                   rtol=1e-6, atol=1e-9)  # the role scores are summed in fp32 by design
    torch.testing.assert_close(torch.tensor(dla_split.heads["dla"].values), torch.tensor(dla_whole.heads["dla"].values),
                               rtol=1e-12, atol=1e-14)


def test_budgets_of_the_real_shapes():
    """SmolLM2-135M (30 × 9 heads of 64, d 576, d_mlp 1536) and Gemma 3 270M (18 × 4 of 256, d 640, d_mlp 2048)
    at windows of 1024: one window's activations exceed the 256 MiB budget, so blocks are checkpointed."""
    smol = HeadConfig(vocab_size=49152, n_positions=8192, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
                      d_head=64, d_mlp=1536)
    gemma = HeadConfig(vocab_size=262144, n_positions=32768, d_model=640, n_layers=18, n_heads=4, n_kv_heads=1,
                       d_head=256, d_mlp=2048)
    assert backward_windows(smol, 1024) == (4, True)  # 61,440 B per token and block: 60 MiB per window and block
    assert backward_windows(gemma, 1024) == (3, True)  # 79,872 B: 78 MiB
    assert pattern_windows(smol, 1024) == 1 and pattern_windows(gemma, 1024) == 2
    assert capture_windows(smol, 1024) == 1 and capture_windows(gemma, 1024) == 1
