"""Activation patching and AtP on grouped-query models, against transformers 5's own model: z_i is the query
head's slice of the o_proj input, overwritten by an o_proj forward-pre-hook (TransformerLens-style, one forward
per head and pair) or differentiated by torch.autograd."""

from __future__ import annotations

import pytest
import torch

from headprune.errors import HeadpruneError
from headprune.models.hf_families import load_family_model
from headprune.patching import atp_z, patch, patch_z, run_pairs
from headprune.patching.missed import missed_bound, subset_changes
from headprune.patching.tasks import induction

from helpers import GQA_FAMILIES, module_inputs, save_gqa_family

VOCAB = 97


@pytest.fixture(scope="module", params=GQA_FAMILIES)
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_gqa_family(request.param, folder, VOCAB, seed=5)
    return hf, load_family_model(folder)


def _o_proj_inputs(hf, ids):
    return module_inputs([layer.self_attn.o_proj for layer in hf.model.layers], lambda: hf(torch.tensor([ids])))


def _logit_diff(hf, ids, answer, wrong, layer=None, cols=None, value=None):
    hooks = []
    if layer is not None:
        def hook(_m, args):
            z = args[0].clone()
            z[0, :, cols] = value[:, cols]
            return (z,)
        hooks.append(hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(hook))
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, -1]
    for h in hooks:
        h.remove()
    return (logits[answer] - logits[wrong]).item()


def test_patch_z_of_each_query_head_equals_hf_with_its_o_proj_slice_overwritten(models):
    hf, model = models
    pairs = induction(VOCAB, 3, 5, seed=1)
    ours = patch_z(model, pairs, rows=4)
    h, dk = hf.config.num_attention_heads, hf.config.hidden_size // hf.config.num_attention_heads
    moved = 0.0
    for p in range(len(pairs)):
        clean, corrupt = pairs.clean[p].tolist(), pairs.corrupt[p].tolist()
        a, w = int(pairs.answer[p]), int(pairs.wrong[p])
        source = _o_proj_inputs(hf, clean)
        for layer in range(hf.config.num_hidden_layers):
            for head in range(h):
                want = _logit_diff(hf, corrupt, a, w, layer, slice(head * dk, (head + 1) * dk), source[layer])
                assert ours.values[p, layer * h + head].item() == pytest.approx(want, abs=1e-5)
                moved = max(moved, abs(want - ours.m_corrupt[p].item()))
    assert moved > 1e-3


def test_atp_z_equals_hf_autograd(models):
    hf, model = models
    pairs = induction(VOCAB, 4, 5, seed=2)
    runs = run_pairs(model, pairs)
    ours = atp_z(model, pairs, runs=runs)
    h, dk = hf.config.num_attention_heads, hf.config.hidden_size // hf.config.num_attention_heads
    for p in range(len(pairs)):
        corrupt = pairs.corrupt[p].tolist()
        source = _o_proj_inputs(hf, pairs.clean[p].tolist())
        found = {}
        hooks = [layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a, l=l, f=found: f.__setitem__(l, a[0]))
                 for l, layer in enumerate(hf.model.layers)]  # z in the graph: ∂m/∂z by autograd
        logits = hf(torch.tensor([corrupt])).logits[0, -1]
        for hook in hooks:
            hook.remove()
        m = logits[int(pairs.answer[p])] - logits[int(pairs.wrong[p])]
        grads = torch.autograd.grad(m, [found[l] for l in range(len(found))])
        for layer, g in enumerate(grads):
            diff = (source[layer] - found[layer][0].detach()) * g[0]  # (T, h·d_k)
            for head in range(h):
                want = float(diff[:, head * dk : (head + 1) * dk].sum())
                assert ours.values[p, layer * h + head].item() - ours.m_corrupt[p].item() == pytest.approx(
                    want, abs=1e-5)


def test_subsets_patched_together_equal_hf_with_those_o_proj_slices_overwritten(models):
    """The bound's joint patches on a GQA model: several query heads (of one KV group or of two layers) at once."""
    hf, model = models
    pairs = induction(VOCAB, 3, 5, seed=3)
    runs = run_pairs(model, pairs)
    dk = hf.config.hidden_size // hf.config.num_attention_heads
    subsets = [[(0, 0), (0, 1)], [(0, 2), (1, 0)], [(1, 1), (1, 2), (0, 0)]]
    ours = subset_changes(model, runs, subsets, rows=4)
    gap = float((runs.m_clean - runs.m_corrupt).mean())
    for r, heads in enumerate(subsets):
        metrics = []
        for p in range(len(pairs)):
            source = _o_proj_inputs(hf, pairs.clean[p].tolist())
            hooks = []
            for layer in {l for l, _ in heads}:
                cols = [c for l, i in heads if l == layer for c in range(i * dk, (i + 1) * dk)]

                def hook(_m, args, cols=cols, value=source[layer]):
                    z = args[0].clone()
                    z[0, :, cols] = value[:, cols]
                    return (z,)
                hooks.append(hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(hook))
            metrics.append(_logit_diff(hf, pairs.corrupt[p].tolist(), int(pairs.answer[p]), int(pairs.wrong[p])))
            for handle in hooks:
                handle.remove()
        want = (sum(metrics) / len(metrics) - float(runs.m_corrupt.mean())) / gap
        assert ours[r].item() == pytest.approx(want, abs=1e-5)
    exact = patch_z(model, pairs, runs=runs)
    bound = missed_bound(model, runs, atp_z(model, pairs, runs=runs), verified=1, subsets=64)
    unverified = [i for i, (l, i_) in enumerate(model.head_ids) if f"L{l}H{i_}" not in bound.verified]
    print(f"\nbound {bound.bound:.3f}, largest exact |change| unverified {exact.change.abs()[unverified].max():.3f}")


def test_q_k_v_patching_is_refused_on_other_families(models):
    _, model = models
    with pytest.raises(HeadpruneError, match="GPT-2 only"):
        patch(model, induction(VOCAB, 2, 4, seed=0), "k")
