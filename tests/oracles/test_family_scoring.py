"""headprune.scoring on grouped-query models, against transformers 5's own model with o_proj forward-pre-hooks.

Under GQA every score is per QUERY head: ablations act on the query head's z_i (the o_proj input slice), OV norms
use W_V of the head's KV group with its own W_O^(i), and value-bias folding moves b_V^(g(i)) W_O^(i) into b_O."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headprune.io.read.loading import load_model
from headprune.models.folding import fold_value_biases, has_value_biases
from headprune.perplexity import Windowing
from headprune.scoring import ScoringOptions, score_heads

from helpers import GQA_FAMILIES, save_gqa_family

VOCAB, SEQ, WINDOWS = 131, 16, 6


@pytest.fixture(scope="module", params=GQA_FAMILIES)
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_gqa_family(request.param, folder, VOCAB, seed=3)
    return hf, load_model(folder)


IDS = torch.randint(0, VOCAB, (SEQ * WINDOWS,), generator=torch.Generator().manual_seed(0))
WINDOWING = Windowing.resolve(64, SEQ, SEQ, batch_size=4)  # non-overlapping windows: each scores SEQ-1 tokens


def hf_nll(hf, replace=None) -> float:
    """Mean next-token NLL of transformers' model over the windows; ``replace`` = (layer, head, value or None): an
    o_proj pre-hook sets that query head's slice to ``value`` (0 when None)."""
    hooks = []
    if replace is not None:
        layer, head, value = replace
        dk = getattr(hf.config, "head_dim", None) or hf.config.hidden_size // hf.config.num_attention_heads

        def hook(_m, args):
            z = args[0].clone()
            z[..., head * dk:(head + 1) * dk] = 0 if value is None else value
            return (z,)
        hooks.append(hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            x = IDS.view(WINDOWS, SEQ)
            logits = hf(x).logits[:, :-1]
            return F.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1)).item()
    finally:
        for h in hooks:
            h.remove()


def test_ablations_equal_o_proj_prehook(models):
    hf, ours = models
    table = score_heads(ours, IDS, ["abl_zero", "abl_zero_folded"], windowing=WINDOWING,
                        options=ScoringOptions(bootstrap=0), show_progress=False).table
    base = hf_nll(hf)
    r = ours.cfg.n_heads // ours.cfg.n_kv_heads
    for row in table.itertuples():
        b_V = hf.model.layers[row.layer].self_attn.v_proj.bias
        b_V_group = None if b_V is None else b_V.view(ours.cfg.n_kv_heads, -1)[row.head // r]  # b_V^(g(i))
        assert row.abl_zero == pytest.approx(hf_nll(hf, (row.layer, row.head, None)) - base, abs=2e-5)
        folded = hf_nll(hf, (row.layer, row.head, b_V_group)) - base  # only what the head computes goes
        assert row.abl_zero_folded == pytest.approx(folded, abs=2e-5)
    assert table.abl_zero.abs().max() > 1e-3  # heads matter
    if b_V is not None:  # Qwen2: the two ablations differ by the value-bias constant
        assert (table.abl_zero - table.abl_zero_folded).abs().max() > 1e-4


def test_folding_keeps_logits_and_clears_value_biases(models):
    _, ours = models
    folded = fold_value_biases(ours)
    x = IDS.view(WINDOWS, SEQ)
    with torch.no_grad():
        assert (folded(x) - ours(x)).abs().max() <= 1e-5
    assert not has_value_biases(folded)
    assert folded.cfg.o_bias == has_value_biases(ours)  # an o_proj bias appears where one was folded in


def test_weight_and_activation_scores_per_query_head(models):
    hf, ours = models
    cfg = ours.cfg
    scores = score_heads(ours, IDS, ["ov_fro", "out_norm", "taylor"], windowing=WINDOWING,
                         options=ScoringOptions(bootstrap=0), show_progress=False)
    r, dk = cfg.n_heads // cfg.n_kv_heads, cfg.d_head
    seen = {}
    hooks = [blk.self_attn.o_proj.register_forward_pre_hook(lambda _m, a, l=l: seen.__setitem__(l, a[0]))
             for l, blk in enumerate(hf.model.layers)]
    hf_nll(hf)
    for h in hooks:
        h.remove()
    for row in scores.table.itertuples():
        sa = hf.model.layers[row.layer].self_attn
        W_V = sa.v_proj.weight.view(cfg.n_kv_heads, dk, -1)[row.head // r].T.double()  # [d, d_k] of KV group g(i)
        W_O = sa.o_proj.weight[:, row.head * dk:(row.head + 1) * dk].T.double()  # [d_k, d] of query head i
        assert row.ov_fro == pytest.approx(torch.linalg.matrix_norm(W_V @ W_O).item(), rel=1e-9)
        z = seen[row.layer][:, :-1, row.head * dk:(row.head + 1) * dk].double()  # scored positions
        assert row.out_norm == pytest.approx((z @ W_O).norm(dim=-1).mean().item(), rel=1e-5)

    # taylor = −∂L/∂g_i: the same derivative through a multiplicative gate in the HF pre-hook
    gates = torch.ones(cfg.n_layers, cfg.n_heads, requires_grad=True)
    hooks = [blk.self_attn.o_proj.register_forward_pre_hook(
        lambda _m, a, l=l: (a[0] * gates[l].repeat_interleave(dk),)) for l, blk in enumerate(hf.model.layers)]
    x = IDS.view(WINDOWS, SEQ)
    loss = F.cross_entropy(hf(x).logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))
    (grad,) = torch.autograd.grad(loss, gates)
    for h in hooks:
        h.remove()
    assert scores.table.taylor.to_numpy() == pytest.approx((-grad).reshape(-1).numpy(), abs=1e-6)


def test_ledger_counts_the_checkpoint_parameters(models):
    from headprune.models.ledger import attention_table, format_info, param_table
    from headprune.models.prune import prune_heads

    hf, ours = models
    cfg = ours.cfg
    assert int(param_table(ours).params.sum()) == hf.num_parameters()  # tied embeddings counted once
    table = attention_table(ours, SEQ)
    dk, d, r = cfg.d_head, cfg.d_model, cfg.n_heads // cfg.n_kv_heads
    assert table.qkv_flops_per_token[0] == 2 * d * (cfg.n_heads + 2 * cfg.n_kv_heads) * dk
    pruned = prune_heads(ours, [(0, h) for h in range(r)] + [(1, 0)])  # KV head 0 of layer 0 goes with its group
    t = attention_table(pruned, SEQ)
    assert t.kv_heads.tolist() == [cfg.n_kv_heads - 1, cfg.n_kv_heads]
    assert t.shared_by[1] == [r - 1] + [r] * (cfg.n_kv_heads - 1)
    assert "grouped-query" in format_info(ours, 1, SEQ)
