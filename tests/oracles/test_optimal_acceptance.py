"""abl_opt's acceptance rule on its own: a fit whose steps overshoot never leaves a head above its starting loss.
Two constructions: the first step made 100 times longer with no trust region (on this random-init model the
loss mostly keeps falling far along the gradient, yet some heads overshoot), and the same length uphill
(negative first-step scale: every trial point is above the start, so every head must stay at z̄). The loss at z̄
and at each fitted constant is measured independently in Hugging Face's GPT2LMHeadModel (a c_proj pre-hook
overwrites the head's slice of z)."""

import pytest
import torch
from test_optimal_ablation import hf_with_constants
from transformers import GPT2LMHeadModel

from headprune.io.read.loading import load_model
from headprune.perplexity import Windowing
from headprune.scoring import head_means, optimal
from headprune.scoring.optimal import fit_layer

from helpers import TINY, guide_loop, save_hf_gpt2

SEQ, STRIDE, BATCH, VOCAB = 64, 40, 3, 512
H, L = TINY["n_head"], TINY["n_layer"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-acceptance")
    save_hf_gpt2(folder, **{**TINY, "vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0})
    return folder


@pytest.mark.parametrize("lr, overshooting", [(30.0, 1), (-30.0, L * H)])
def test_overshooting_steps_never_raise_a_heads_loss(model_dir, monkeypatch, lr, overshooting):
    ids = torch.randint(0, VOCAB, (300,), generator=torch.Generator().manual_seed(3))
    model = load_model(model_dir)
    w = Windowing(SEQ, STRIDE, BATCH)
    batches = w.batches(ids)
    n = sum(int(b.mask.sum()) for b in batches)
    means = head_means(model, ids, w, show_progress=False)
    monkeypatch.setattr(optimal, "MAX_STEP", 1e6)  # no trust region: the long first step is taken as it is
    trials: list[torch.Tensor] = []
    real = optimal._layer_losses

    def recording(*args, **kwargs):
        sums, grad = real(*args, **kwargs)
        trials.append(sums.clone())
        return sums, grad

    monkeypatch.setattr(optimal, "_layer_losses", recording)
    hf = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    overshoots = 0
    for layer in range(L):
        trials.clear()
        init = torch.stack([means[(layer, h)] for h in range(H)]).float()
        fit = fit_layer(model, batches, layer, init, steps=5, lr=lr, rows=6)
        start = trials[0]
        overshoots += int((torch.stack(trials[1:]) > start + 1e-6).any(0).sum())  # trial points above the start
        for h in range(H):
            at_mean, _ = guide_loop(hf_with_constants(hf, {(layer, h): means[(layer, h)]}), ids, SEQ, STRIDE)
            at_fit, _ = guide_loop(hf_with_constants(hf, {(layer, h): torch.tensor(fit["c"][h])}), ids, SEQ, STRIDE)
            assert fit["nll_init"][h] / n == pytest.approx(at_mean, abs=1e-5)
            assert fit["nll_best"][h] / n == pytest.approx(at_fit, abs=1e-5)
            assert at_fit <= at_mean + 1e-6, (layer, h, at_fit, at_mean)
    print(f"\n{overshoots} of {L * H} heads had a trial point above their starting loss")
    assert overshoots >= overshooting  # the case is constructed: steps do overshoot
