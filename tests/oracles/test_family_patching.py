"""Activation patching and AtP on grouped-query models, against transformers 5's own model: z_i is the query
head's slice of the o_proj input, overwritten by an o_proj forward-pre-hook (TransformerLens-style, one forward
per head and pair) or differentiated by torch.autograd; q, k and v are slices of q_proj/k_proj/v_proj's outputs
(k and v per KV group); the pattern is replaced inside transformers' eager attention."""

from __future__ import annotations

import pytest
import torch

from headprune.io.read.loading import load_model
from headprune.patching import PatchOptions, atp_z, patch, patch_z, run_pairs
from headprune.patching.attribution_qk import atp_qk, atp_qkfix
from headprune.patching.exact import unit_ids
from headprune.patching.missed import Subsampling, missed_bound, subset_changes
from headprune.patching.study import StudyOptions, patch_study
from headprune.patching.tasks import induction

from helpers import GQA_FAMILIES, module_inputs, save_gqa_family

VOCAB = 97


@pytest.fixture(scope="module", params=GQA_FAMILIES)
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_gqa_family(request.param, folder, VOCAB, seed=5)
    return hf, load_model(folder)


def head_dim(config) -> int:
    """d_k of a transformers config: its head_dim (Gemma 3's differs from d/h), else d/h."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _o_proj_inputs(hf, ids):
    return module_inputs([layer.self_attn.o_proj for layer in hf.model.layers], lambda: hf(torch.tensor([ids])))


def _metric(hf, ids, answer, wrong, handles):
    """HF's logit difference at ids' last position; the hooks ``handles`` are removed after the forward."""
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, -1]
    for h in handles:
        h.remove()
    return (logits[answer] - logits[wrong]).item()


def _logit_diff(hf, ids, answer, wrong, layer=None, cols=None, value=None):
    """:func:`_metric` with o_proj's input columns ``cols`` of ``layer`` overwritten by value's (a pre-hook)."""
    hooks = []
    if layer is not None:
        def hook(_m, args):
            z = args[0].clone()
            z[0, :, cols] = value[:, cols]
            return (z,)
        hooks.append(hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(hook))
    return _metric(hf, ids, answer, wrong, hooks)


def _assert_each_unit_equals_hf(hf, ours, pairs, n, source_of, patched_metric):
    """ours.values[p, l·n + u] is HF's metric on pair p's corrupt prompt with unit u of layer l (d_k columns) taken
    from the clean run: ``source_of(clean_ids)[l]`` read by ``patched_metric(ids, answer, wrong, l, cols, source)``,
    to 1e-5; and some patch moves the metric."""
    dk = head_dim(hf.config)
    moved = 0.0
    for p in range(len(pairs)):
        corrupt, a, w = pairs.corrupt[p].tolist(), int(pairs.answer[p]), int(pairs.wrong[p])
        source = source_of(pairs.clean[p].tolist())
        for layer in range(hf.config.num_hidden_layers):
            for u in range(n):
                want = patched_metric(corrupt, a, w, layer, slice(u * dk, (u + 1) * dk), source[layer])
                assert ours.values[p, layer * n + u].item() == pytest.approx(want, abs=1e-5)
                moved = max(moved, abs(want - ours.m_corrupt[p].item()))
    assert moved > 1e-3


def test_patch_z_of_each_query_head_equals_hf_with_its_o_proj_slice_overwritten(models):
    hf, model = models
    pairs = induction(VOCAB, 3, 5, seed=1)
    ours = patch_z(model, pairs, rows=4)
    _assert_each_unit_equals_hf(hf, ours, pairs, hf.config.num_attention_heads, lambda ids: _o_proj_inputs(hf, ids),
                                lambda *args: _logit_diff(hf, *args))


def test_atp_z_equals_hf_autograd(models):
    hf, model = models
    pairs = induction(VOCAB, 4, 5, seed=2)
    runs = run_pairs(model, pairs)
    ours = atp_z(model, pairs, runs=runs)
    h, dk = hf.config.num_attention_heads, head_dim(hf.config)
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
    dk = head_dim(hf.config)
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
    bound = missed_bound(model, runs, atp_z(model, pairs, runs=runs), verified=1, subsampling=Subsampling(subsets=64))
    unverified = [i for i, (l, i_) in enumerate(model.head_ids) if f"L{l}H{i_}" not in bound.verified]
    print(f"\nbound {bound.bound:.3f}, largest exact |change| unverified {exact.change.abs()[unverified].max():.3f}")


def _projection_outputs(hf, ids, name):
    """Each layer's q_proj, k_proj or v_proj output (1, T, n·d_k) of a run on ids."""
    out = {}
    hooks = [getattr(layer.self_attn, name).register_forward_hook(lambda m, a, o, l=l: out.__setitem__(l, o))
             for l, layer in enumerate(hf.model.layers)]
    hf(torch.tensor([ids]))
    for hook in hooks:
        hook.remove()
    return out


def _overwritten(hf, name, layer, cols, value, positions=slice(None)):
    """A forward hook writing value's ``cols`` into layer's ``name`` output at ``positions``."""
    def hook(_m, _a, out):
        out = out.clone()
        out[0, positions, cols] = value[0, positions, cols]
        return out
    return getattr(hf.model.layers[layer].self_attn, name).register_forward_hook(hook)


@pytest.mark.parametrize("activation", ["q", "k", "v"])
def test_patch_q_k_v_equals_hf_with_a_projection_slice_overwritten(models, activation):
    """q per query head; k and v per KV group (every query head of the group reads them), rows named L{l}G{g}.
    Rotary acts per position, so overwriting the projection's output before it equals patching after it."""
    hf, model = models
    pairs = induction(VOCAB, 3, 5, seed=4)
    ours = patch(model, pairs, activation, options=PatchOptions(rows=4))
    cfg = hf.config
    n = cfg.num_attention_heads if activation == "q" else cfg.num_key_value_heads
    assert ours.kv_heads == (activation != "q")
    ids = unit_ids(model, activation != "q")
    assert ids[: n + 1] == ([f"L0H{i}" for i in range(n)] + ["L1H0"] if activation == "q"
                            else [f"L0G{g}" for g in range(n)] + ["L1G0"])
    name = f"{activation}_proj"
    _assert_each_unit_equals_hf(hf, ours, pairs, n, lambda ids: _projection_outputs(hf, ids, name),
                                lambda ids, a, w, layer, cols, value: _metric(
                                    hf, ids, a, w, [_overwritten(hf, name, layer, cols, value)]))


def test_patch_k_by_position_equals_hf_with_one_position_overwritten(models):
    hf, model = models
    pairs = induction(VOCAB, 2, 4, seed=6)
    ours = patch(model, pairs, "k", options=PatchOptions(by_position=True, rows=4))
    cfg = hf.config
    dk, n, T = head_dim(cfg), cfg.num_key_value_heads, pairs.clean.shape[1]
    assert ours.values.shape == (len(pairs), cfg.num_hidden_layers * n, T)
    for p in range(len(pairs)):
        source = _projection_outputs(hf, pairs.clean[p].tolist(), "k_proj")
        for layer, g, t in ((0, n - 1, 1), (1, 0, T - 2), (0, 0, T - 1)):
            handle = _overwritten(hf, "k_proj", layer, slice(g * dk, (g + 1) * dk), source[layer], t)
            want = _metric(hf, pairs.corrupt[p].tolist(), int(pairs.answer[p]), int(pairs.wrong[p]), [handle])
            assert ours.values[p, layer * n + g, t].item() == pytest.approx(want, abs=1e-5)


def _eager_with_pattern(override):
    """transformers' eager attention, with ``override(layer, probs) -> probs`` applied before the values."""
    from transformers.models.llama.modeling_llama import repeat_kv

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
        scores = query @ key.transpose(2, 3) * scaling
        if attention_mask is None:  # transformers leaves causality (and a layer's window) to a custom function
            T, window = scores.shape[-1], getattr(module, "sliding_window", None)
            allowed = torch.ones(T, T, dtype=torch.bool).tril()
            if window is not None:  # Gemma's sliding layers: t attends to s only when t − s < window
                allowed &= ~torch.ones(T, T, dtype=torch.bool).tril(diagonal=-window)
            scores = scores.masked_fill(~allowed, float("-inf"))
        else:
            scores = scores + attention_mask
        probs = override(module.layer_idx, torch.softmax(scores.float(), dim=-1).to(query.dtype))
        return (probs @ value).transpose(1, 2).contiguous(), probs
    return attention


def test_patch_pattern_equals_hf_attention_with_the_source_pattern(models):
    from transformers import AttentionInterface

    hf, model = models
    pairs = induction(VOCAB, 2, 5, seed=7)
    ours = patch(model, pairs, "pattern", options=PatchOptions(rows=4))
    h, target = hf.config.num_attention_heads, {}

    def override(layer, probs):
        if target.get("layer") != layer:
            return probs
        probs = probs.clone()
        probs[:, target["head"]] = target["source"][:, target["head"]]
        return probs
    AttentionInterface.register("headprune_test_pattern", _eager_with_pattern(override))
    hf.set_attn_implementation("headprune_test_pattern")
    try:
        for p in range(len(pairs)):
            with torch.no_grad():
                source = hf(pairs.clean[p : p + 1], output_attentions=True).attentions  # (1,h,T,T) per layer
            for layer in range(hf.config.num_hidden_layers):
                for head in range(h):
                    target.update(layer=layer, head=head, source=source[layer])
                    want = _metric(hf, pairs.corrupt[p].tolist(), int(pairs.answer[p]), int(pairs.wrong[p]), [])
                    assert ours.values[p, layer * h + head].item() == pytest.approx(want, abs=1e-5)
            target.clear()
    finally:
        hf.set_attn_implementation("eager")


@pytest.mark.parametrize("activation", ["q", "k"])
def test_atp_q_k_equal_hf_autograd_on_the_projections(models, activation):
    """AtP of q per query head and of k per KV group: Σ (x_clean − x_corrupt) · ∂m/∂x on q_proj/k_proj's output
    (rotary is an orthogonal map per position, so the dot product is the same before and after it)."""
    hf, model = models
    if hasattr(hf.model.layers[0].self_attn, "q_norm"):
        pytest.skip("with a q/k norm after the projections (Gemma 3) AtP linearises at the normed q/k headprune "
                    "patches, not at q_proj's output: two first-order estimates, not one (exact patching agrees)")
    pairs = induction(VOCAB, 3, 5, seed=8)
    ours = atp_qk(model, pairs, activation)
    cfg = hf.config
    dk = head_dim(cfg)
    n = cfg.num_attention_heads if activation == "q" else cfg.num_key_value_heads
    for p in range(len(pairs)):
        source = _projection_outputs(hf, pairs.clean[p].tolist(), f"{activation}_proj")
        base = {}
        hooks = [getattr(layer.self_attn, f"{activation}_proj").register_forward_hook(
            lambda m, a, o, l=l, b=base: b.__setitem__(l, o)) for l, layer in enumerate(hf.model.layers)]
        logits = hf(pairs.corrupt[p : p + 1]).logits[0, -1]
        for hook in hooks:
            hook.remove()
        m = logits[int(pairs.answer[p])] - logits[int(pairs.wrong[p])]
        grads = torch.autograd.grad(m, [base[l] for l in range(cfg.num_hidden_layers)])
        for layer, g in enumerate(grads):
            diff = ((source[layer] - base[layer].detach()) * g)[0]  # (T, n·d_k)
            for u in range(n):
                want = float(diff[:, u * dk : (u + 1) * dk].sum())
                got = ours.values[p, layer * n + u].item() - ours.m_corrupt[p].item()
                assert got == pytest.approx(want, abs=1e-5)


def test_atp_qkfix_k_sums_its_kv_groups_query_heads_against_hf(models):
    """QK-fix of KV group g: HF's exact pattern with k_g from the clean run (every head of the group changes),
    minus the unpatched one, dotted with ∂m/∂A from autograd, summed over the group's query heads."""
    hf, model = models
    pairs = induction(VOCAB, 2, 5, seed=9)
    ours = atp_qkfix(model, pairs, "k")
    cfg = hf.config
    dk, n_kv = head_dim(cfg), cfg.num_key_value_heads
    r = cfg.num_attention_heads // n_kv
    hf.set_attn_implementation("eager")
    for p in range(len(pairs)):
        corrupt = pairs.corrupt[p : p + 1]
        out = hf(corrupt, output_attentions=True)
        m = out.logits[0, -1, int(pairs.answer[p])] - out.logits[0, -1, int(pairs.wrong[p])]
        grads = torch.autograd.grad(m, list(out.attentions))
        source = _projection_outputs(hf, pairs.clean[p].tolist(), "k_proj")
        for layer in range(cfg.num_hidden_layers):
            for g in range(n_kv):
                handle = _overwritten(hf, "k_proj", layer, slice(g * dk, (g + 1) * dk), source[layer])
                with torch.no_grad():
                    patched = hf(corrupt, output_attentions=True).attentions[layer]
                handle.remove()
                heads = slice(g * r, (g + 1) * r)
                want = float(((patched - out.attentions[layer].detach()) * grads[layer])[0, heads].sum())
                got = ours.values[p, layer * n_kv + g].item() - ours.m_corrupt[p].item()
                assert got == pytest.approx(want, abs=1e-5)


def test_study_table_has_a_row_per_kv_group_for_k_and_v(models):
    _, model = models
    pairs = induction(VOCAB, 3, 5, seed=10)
    study = patch_study(model, pairs, StudyOptions(activations=("z", "k", "v"), bootstrap=20, bound_subsets=0))
    table = study.table.set_index("head_id")
    cfg = model.cfg
    groups = [f"L{l}G{g}" for l in range(cfg.n_layers) for g in range(cfg.n_kv_heads)]
    heads = [f"L{l}H{i}" for l in range(cfg.n_layers) for i in range(cfg.n_heads)]
    assert list(table.index) == heads + groups
    assert (table.loc[groups, "unit"] == "kv_group").all() and table.loc[groups, "patch_z"].isna().all()
    assert table.loc[heads, "patch_k"].isna().all() and table.loc[groups, "head"].isna().all()
    assert [int(table.loc[h, "kv_head"]) for h in heads] == [i // cfg.group_size for _ in range(cfg.n_layers)
                                                            for i in range(cfg.n_heads)]
    k = patch(model, pairs, "k")
    assert table.loc[groups, "patch_k"].tolist() == pytest.approx(k.effect.tolist(), abs=1e-12)
    agree = study.agreement.set_index("method")
    assert {"atp_k", "atp_star_k"} <= set(agree.index)
