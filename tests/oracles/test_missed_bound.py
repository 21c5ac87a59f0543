"""AtP*'s subsampling bound on what the unverified heads can hide (headprune.patching.missed): the joint patch
of a subset against Hugging Face's model with several c_proj slices overwritten, the estimates against a
per-head loop, and the bound against exact patching of every head."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm
from transformers import GPT2LMHeadModel

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.patching.attribution import atp_star_z
from headprune.patching.exact import patch_z, run_pairs
from headprune.patching.missed import Subsampling, missed_bound, subsample_estimates, subset_changes
from headprune.patching.tasks import induction

from helpers import PATCH_CFG as CFG
from helpers import module_inputs


@pytest.fixture(scope="module")
def model(patch_dir):
    return load_model(patch_dir)


@pytest.fixture(scope="module")
def pairs():
    return induction(CFG["vocab_size"], 8, 5, seed=2)


def _hf_metric(hf, base, source, heads, answer, wrong):
    """Logit difference of ``base`` with the c_proj input slices of ``heads`` [(layer, head)] from ``source``."""
    dk = CFG["n_embd"] // CFG["n_head"]
    found = module_inputs([blk.attn.c_proj for blk in hf.transformer.h], lambda: hf(torch.tensor([source])))

    def overwrite(m, a, layer):
        x = a[0].clone()
        for l, i in heads:
            if l == layer:
                x[0, :, i * dk : (i + 1) * dk] = found[layer][:, i * dk : (i + 1) * dk]
        return (x,)
    hooks = [blk.attn.c_proj.register_forward_pre_hook(lambda m, a, l=l: overwrite(m, a, l))
             for l, blk in enumerate(hf.transformer.h)]
    with torch.no_grad():
        logits = hf(torch.tensor([base])).logits[0, -1]
    for h in hooks:
        h.remove()
    return (logits[answer] - logits[wrong]).item()


def test_joint_patch_of_a_subset_equals_hf_with_those_slices_overwritten(model, patch_dir, pairs):
    hf = GPT2LMHeadModel.from_pretrained(patch_dir).eval()
    runs = run_pairs(model, pairs)
    subsets = [[(0, 1), (1, 3), (2, 0)], [(1, 0), (1, 2)], [], [(2, 1), (2, 2), (0, 0), (0, 3)]]
    ours = subset_changes(model, runs, subsets, rows=10)  # 10 rows < 4 subsets x 8 pairs: chunks of one subset
    gap = float((runs.m_clean - runs.m_corrupt).mean())
    for r, heads in enumerate(subsets):
        m = [_hf_metric(hf, pairs.corrupt[p].tolist(), pairs.clean[p].tolist(), heads, int(pairs.answer[p]),
                        int(pairs.wrong[p])) for p in range(len(pairs))]
        want = (np.mean(m) - float(runs.m_corrupt.mean())) / gap
        assert ours[r].item() == pytest.approx(want, abs=1e-5)
    assert ours[2].item() == 0.0 and abs(ours[0].item()) > 0.01


def test_estimates_equal_a_per_head_loop_and_the_bound_covers_additive_effects():
    rng = np.random.default_rng(0)
    effects = rng.normal(0, 0.01, size=30)
    effects[17] = 0.3  # one head the ranking missed
    masks = rng.random((200, 30)) < 0.5
    changes = masks.astype(float) @ effects + rng.normal(0, 0.002, size=200)
    est, se, upper = subsample_estimates(masks, changes, level=0.95)
    zb = norm.ppf(1 - 0.05 / (2 * 30))  # Bonferroni over the 30 heads
    for n in range(30):
        inside, outside = changes[masks[:, n]], changes[~masks[:, n]]
        assert est[n] == pytest.approx(inside.mean() - outside.mean(), abs=1e-12)
        s = np.sqrt(inside.var(ddof=1) / len(inside) + outside.var(ddof=1) / len(outside))
        assert se[n] == pytest.approx(s, abs=1e-12)
        assert upper[n] == pytest.approx(abs(est[n]) + zb * s, abs=1e-12)
    assert int(np.argmax(upper)) == 17 and upper.max() >= 0.3 and abs(est[17] - 0.3) < 0.05
    with pytest.raises(HeadpruneError, match="fewer than 2"):
        subsample_estimates(masks[:3], changes[:3])


def test_bound_covers_every_unverified_heads_exact_effect(model, pairs):
    runs = run_pairs(model, pairs)
    exact = patch_z(model, pairs, runs=runs)
    star = atp_star_z(model, pairs, runs=runs)
    subsampling = Subsampling(subsets=96, seed=0)
    result = missed_bound(model, runs, star, verified=2, subsampling=subsampling)
    order = torch.argsort(-star.change.abs(), stable=True)
    ids = [f"L{l}H{h}" for l, h in model.head_ids]
    assert result.verified == [ids[i] for i in order[:2].tolist()]
    unverified = [i for i in range(12) if ids[i] not in result.verified]
    assert result.table["head_id"].tolist() == [ids[i] for i in unverified]
    worst_exact = exact.change.abs()[unverified].max().item()
    print(f"\nbound {result.bound:.3f} (worst {result.worst}), largest exact |change| unverified {worst_exact:.3f}")
    assert result.bound >= worst_exact > 0.01
    assert missed_bound(model, runs, star, verified=2, subsampling=subsampling).bound == result.bound  # seeded
    with pytest.raises(HeadpruneError, match="too few"):
        missed_bound(model, runs, star, verified=11)


@pytest.mark.parametrize("inclusion", [0.2, 0.8])
def test_subsets_include_each_head_with_the_inclusion_probability(model, pairs, monkeypatch, inclusion):
    """The subsets patched together hold each unverified head with probability ``inclusion`` (R·|U| Bernoulli draws:
    the observed share within 4 standard errors); a bound that ignored it would draw at ½."""
    from headprune.patching import missed

    drawn = []
    real = missed.subset_changes

    def recording(model_, runs_, chosen, rows):
        drawn.extend(chosen)
        return real(model_, runs_, chosen, rows)

    monkeypatch.setattr(missed, "subset_changes", recording)
    runs = run_pairs(model, pairs)
    result = missed_bound(model, runs, atp_star_z(model, pairs), subsampling=Subsampling(subsets=64,
                                                                                          inclusion=inclusion))
    unverified = len(result.table)
    share = sum(len(s) for s in drawn) / (len(drawn) * unverified)
    assert len(drawn) == 64 and result.inclusion == inclusion
    assert abs(share - inclusion) < 4 * (inclusion * (1 - inclusion) / (64 * unverified)) ** 0.5
