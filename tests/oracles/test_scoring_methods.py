"""Every scoring method against an independent computation (HF model, explicit matrices, finite differences)."""

import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.models.folding import fold_value_biases, has_value_biases
from headprune.perplexity import Windowing, batch_nll_sum, evaluate, window_batches
from headprune.schema import DATA_METHODS, METHODS, OPT_IN, ci_columns, parse_methods, score_columns
from headprune.scoring import ScoringOptions, score_heads

from helpers import TINY, guide_loop, save_hf_gpt2

SEQ, STRIDE, BATCH = 64, 40, 3
SCORED = "all,abl_zero_folded"  # the opt-in abl_zero_folded too: it has an oracle here
DK = TINY["n_embd"] // TINY["n_head"]


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, TINY["vocab_size"], (300,), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def scored(tiny_dir, ids):
    return score_heads(load_model(tiny_dir), ids, SCORED, windowing=Windowing(SEQ, STRIDE, BATCH),
                       options=ScoringOptions(ablation_rows=6), show_progress=False)


@pytest.fixture(scope="module")
def scores(scored):
    return scored.table


def hf_scored_z(hf, ids, seq_len=SEQ, stride=STRIDE):
    """Per layer, the concatenated head outputs z (n, h·d_k) at the scored positions, via a c_proj pre-hook."""
    found = {l: [] for l in range(len(hf.transformer.h))}
    for batch in window_batches(ids, seq_len, stride, BATCH):
        hooks = [blk.attn.c_proj.register_forward_pre_hook(
            lambda mod, args, l=l, mask=batch.mask: found[l].append(args[0][:, : mask.shape[1]][mask]))
            for l, blk in enumerate(hf.transformer.h)]
        with torch.no_grad():
            hf(batch.tokens)
        for h in hooks:
            h.remove()
    return {l: torch.cat(zs).double() for l, zs in found.items()}


def test_columns_and_order(scores):
    every = parse_methods(SCORED)  # every method but abl_opt and abl_resample, in canonical order
    intervals = [c for m in DATA_METHODS if m in every for c in ci_columns(m)]
    exact = [m for m in ("abl_zero", "abl_zero_folded", "abl_mean") if m in every]
    ranks = [f"{m}_rank_{end}" for m in exact for end in ("lo", "hi")]
    assert list(scores.columns) == ["layer", "head", "head_id", "model_fingerprint"] + every + intervals + ranks
    assert list(scores.columns) == score_columns(every)
    assert scores.head_id.tolist() == [f"L{l}H{h}" for l in range(3) for h in range(4)]


@pytest.mark.parametrize("layer, head", [(0, 1), (1, 3), (2, 0)])
def test_abl_zero_and_mean_equal_hf_with_rows_zeroed(tiny_dir, ids, scored, scores, layer, head):
    """abl_zero: the head's W_O rows zeroed; abl_zero_folded: zeroed, but its value-bias share b_V W_O kept in b_O;
    abl_mean: zeroed, its mean output's share z̄ W_O added to b_O."""
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    base, n = guide_loop(hf, ids, SEQ, STRIDE)
    z_mean = hf_scored_z(hf, ids)[layer][:, head * DK : (head + 1) * DK].mean(0)  # the head's mean output
    attn = hf.transformer.h[layer].attn
    proj = attn.c_proj
    rows = slice(head * DK, (head + 1) * DK)
    b_V = attn.c_attn.bias[2 * TINY["n_embd"] + head * DK : 2 * TINY["n_embd"] + (head + 1) * DK]
    with torch.no_grad():
        contribution = (z_mean @ proj.weight[rows].double()).float()
        bias_share = (b_V.double() @ proj.weight[rows].double()).float()
        proj.weight[rows] = 0
        zeroed, _ = guide_loop(hf, ids, SEQ, STRIDE)
        proj.bias += bias_share
        folded_zeroed, _ = guide_loop(hf, ids, SEQ, STRIDE)
        proj.bias += contribution - bias_share
        mean_ablated, _ = guide_loop(hf, ids, SEQ, STRIDE)
    row = scores[(scores.layer == layer) & (scores["head"] == head)].iloc[0]
    assert row.abl_zero == pytest.approx(zeroed - base, abs=1e-4)
    assert row.abl_zero_folded == pytest.approx(folded_zeroed - base, abs=1e-4)
    assert row.abl_mean == pytest.approx(mean_ablated - base, abs=1e-4)
    assert scored.baseline["nll"] == pytest.approx(base, abs=1e-5) and scored.baseline["tokens"] == n


def test_abl_mean_fill_is_the_mean_over_scored_positions_only(tiny_dir, ids):
    """Stride 8 < seq-len 64: most windows score only their last 8 predictions, so the mean of z over every
    position of every window (the mistake) is far from the mean over the scored ones, and so is its abl_mean."""
    seq, stride, tol = 64, 8, 1e-5
    got = score_heads(load_model(tiny_dir), ids, "abl_mean", windowing=Windowing(seq, stride, BATCH),
                      options=ScoringOptions(ablation_rows=6), show_progress=False).table
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    base, _ = guide_loop(hf, ids, seq, stride)
    scored = hf_scored_z(hf, ids, seq, stride)
    everywhere = {l: [] for l in scored}  # every position of every window
    hooks = [blk.attn.c_proj.register_forward_pre_hook(lambda mod, args, l=l: everywhere[l].append(args[0][0]))
             for l, blk in enumerate(hf.transformer.h)]
    with torch.no_grad():
        for begin in range(0, len(ids), stride):
            hf(ids[begin : begin + seq].view(1, -1))
            if begin + seq >= len(ids):
                break
    for h in hooks:
        h.remove()
    def proj_of(layer):
        return hf.transformer.h[layer].attn.c_proj

    def mean_ablated(layer, cols, z_mean):  # NLL increase with z_i replaced by z_mean (folded into b_O)
        W, b = proj_of(layer).weight.detach().clone(), proj_of(layer).bias.detach().clone()
        with torch.no_grad():
            proj_of(layer).weight[cols] = 0
            proj_of(layer).bias += (z_mean @ W[cols].double()).float()
            value = guide_loop(hf, ids, seq, stride)[0] - base
            proj_of(layer).weight.copy_(W)
            proj_of(layer).bias.copy_(b)
        return value

    margins = []
    for layer, head in [(0, 1), (1, 3)]:
        cols = slice(head * DK, (head + 1) * DK)
        right = mean_ablated(layer, cols, scored[layer][:, cols].mean(0))
        wrong = mean_ablated(layer, cols, torch.cat(everywhere[layer]).double()[:, cols].mean(0))
        score = got[(got.layer == layer) & (got["head"] == head)].iloc[0].abl_mean
        assert score == pytest.approx(right, abs=tol)
        margins.append(abs(wrong - right))
    print(f"\nabl_mean scored vs all positions: {margins}")
    assert min(margins) > 100 * tol, margins  # the mistake would fail this test by far


def test_gradients_equal_finite_differences(tiny_dir, ids):
    """taylor: the corpus NLL's central difference; grad: the mean over WINDOWS of each window's |difference|."""
    model = load_model(tiny_dir, dtype=torch.float64)
    got = score_heads(model, ids, "grad,taylor", windowing=Windowing(SEQ, STRIDE, BATCH), show_progress=False).table
    batches = window_batches(ids, SEQ, STRIDE, 1)  # one window each
    eps = 1e-4
    for layer, head in [(0, 0), (1, 2), (2, 3)]:
        def losses(delta, layer=layer, head=head):
            gates = model.ones_gates(dtype=torch.float64)
            gates[layer][head] += delta
            per_batch = [batch_nll_sum(model, b, gates=gates) for b in batches]
            corpus = evaluate(model, ids, Windowing(SEQ, STRIDE, BATCH), progress=False, gates=gates).nll
            return corpus, [(s.item() / n, n) for s, n in per_batch]

        with torch.no_grad():
            (up, up_b), (down, down_b) = losses(eps), losses(-eps)
        N = sum(n for _, n in up_b)
        taylor = -(up - down) / (2 * eps)
        grad = sum(n / N * abs((u - d) / (2 * eps)) for (u, n), (d, _) in zip(up_b, down_b))
        row = got[(got.layer == layer) & (got["head"] == head)].iloc[0]
        assert row.taylor == pytest.approx(taylor, rel=1e-3)
        assert row.grad == pytest.approx(grad, rel=1e-3)


def hf_window_gate_grads(hf, ids, seq_len=SEQ, stride=STRIDE):
    """Window by window in Hugging Face: gates multiplying each head's slice of c_proj's input (z), the window's
    mean NLL over its scored tokens, autograd. Returns n_w [windows] and ∂L_w/∂g [windows, H] (layer-major)."""
    n_layer, n_head = hf.config.n_layer, hf.config.n_head
    dk = hf.config.n_embd // n_head
    ns, rows = [], []
    for batch in window_batches(ids, seq_len, stride, 1):
        gates = [torch.ones(n_head, dtype=torch.float64, requires_grad=True) for _ in range(n_layer)]
        hooks = [blk.attn.c_proj.register_forward_pre_hook(
            lambda mod, args, g=g: ((args[0].view(*args[0].shape[:2], n_head, dk) * g.to(args[0].dtype).view(-1, 1))
                                    .view(args[0].shape),))
            for blk, g in zip(hf.transformer.h, gates)]
        logits = hf(batch.tokens).logits[0, :-1].double()
        nll = torch.nn.functional.cross_entropy(logits, batch.tokens[0, 1:], reduction="none")
        mask = batch.mask[0]
        loss = nll[mask].mean()
        rows.append(torch.cat(torch.autograd.grad(loss, gates)))
        ns.append(int(mask.sum()))
        for h in hooks:
            h.remove()
    return torch.tensor(ns, dtype=torch.float64), torch.stack(rows)


def test_grad_is_per_window_and_independent_of_batch_size(tiny_dir, ids):
    """Michel et al.'s E_x |∂L(x)/∂g|: batch sizes 1, 3 and 8 agree to 1e-6 relative, and equal a window-by-window
    reference computed in Hugging Face (gates on c_proj's input)."""
    model = load_model(tiny_dir, dtype=torch.float64)
    by_batch = {b: score_heads(model, ids, "grad,taylor", windowing=Windowing(SEQ, STRIDE, b),
                               show_progress=False).table
                for b in (1, 3, 8)}
    for b in (3, 8):
        np.testing.assert_allclose(by_batch[b].grad, by_batch[1].grad, rtol=1e-6, atol=0)
        np.testing.assert_allclose(by_batch[b].taylor, by_batch[1].taylor, rtol=1e-6, atol=1e-12)
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir, torch_dtype=torch.float64).eval()
    n, d = hf_window_gate_grads(hf, ids)
    w = (n / n.sum()).unsqueeze(1)
    np.testing.assert_allclose(by_batch[8].grad, (w * d.abs()).sum(0).numpy(), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(by_batch[8].taylor, -(w * d).sum(0).numpy(), rtol=1e-6, atol=1e-12)
    # the old per-batch definition (|mean over the batch's windows|) differs: the test can tell them apart
    per_batch = [(w[i : i + 8].sum(), (w[i : i + 8] * d[i : i + 8]).sum(0) / w[i : i + 8].sum())
                 for i in range(0, len(n), 8)]
    old = sum(wb * db.abs() for wb, db in per_batch)
    assert (old - torch.tensor(by_batch[8].grad.to_numpy())).abs().max() > 1e-3 * old.abs().max()


def test_weight_norms_equal_explicit_matrices(tiny_dir, scores):
    model = load_model(tiny_dir)
    for r in scores.itertuples():
        attn = model.h[r.layer].attn
        c_attn, c_proj = attn.c_attn.weight.double().numpy(), attn.c_proj.weight.double().numpy()
        W_O = c_proj[r.head * DK : (r.head + 1) * DK]  # rows of c_proj
        W_V = c_attn[:, 2 * TINY["n_embd"] + r.head * DK : 2 * TINY["n_embd"] + (r.head + 1) * DK]
        OV = W_V @ W_O  # the explicit d x d OV matrix
        assert r.wo_fro == pytest.approx(np.linalg.norm(W_O, "fro"), rel=1e-9)
        assert r.wo_spec == pytest.approx(np.linalg.norm(W_O, 2), rel=1e-9)
        assert r.ov_fro == pytest.approx(np.linalg.norm(OV, "fro"), rel=1e-9)
        assert r.ov_spec == pytest.approx(np.linalg.norm(OV, 2), rel=1e-9)


def test_out_norm_fluct_entropy_equal_direct_computation(tiny_dir, ids, scores):
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir, attn_implementation="eager").eval()
    z = hf_scored_z(hf, ids)
    entropies = {l: [] for l in range(3)}
    for batch in window_batches(ids, SEQ, STRIDE, BATCH):
        with torch.no_grad():
            attn = hf(batch.tokens, output_attentions=True).attentions
        for l, A in enumerate(attn):  # (b, h, T, T)
            A = A.double()
            ent = -(A * torch.where(A > 0, A.log(), torch.zeros_like(A))).sum(-1)  # (b, h, T)
            entropies[l].append(ent[:, :, : batch.mask.shape[1]].transpose(1, 2)[batch.mask])
    for r in scores.itertuples():
        W = hf.transformer.h[r.layer].attn.c_proj.weight.double()[r.head * DK : (r.head + 1) * DK]
        z_i = z[r.layer][:, r.head * DK : (r.head + 1) * DK]  # (n, d_k)
        assert r.out_norm == pytest.approx((z_i @ W).norm(dim=1).mean().item(), rel=1e-5)
        fluct = (z_i.var(dim=0, unbiased=True) * (W**2).sum(1)).sum().item()
        assert r.fluct == pytest.approx(fluct, rel=1e-5)
        assert r.entropy == pytest.approx(torch.cat(entropies[r.layer])[:, r.head].mean().item(), rel=1e-5)


def test_fast_ablation_equals_naive_forward_per_head(tiny_dir, ids, scores):
    model = load_model(tiny_dir)
    base = evaluate(model, ids, Windowing(SEQ, STRIDE, BATCH), progress=False).nll
    for layer, head in model.head_ids:
        gates = model.ones_gates()
        gates[layer][head] = 0
        naive = evaluate(model, ids, Windowing(SEQ, STRIDE, BATCH), progress=False, gates=gates).nll - base
        assert scores.abl_zero[layer * 4 + head] == pytest.approx(naive, abs=1e-5)


def test_parse_methods():
    assert parse_methods("all") == [m for m in METHODS if m not in OPT_IN]  # the opt-in ones: named only
    assert OPT_IN == ("abl_zero_folded", "abl_opt", "abl_resample", "ctx_stream", "ctx_gate", "ctx_retrieval")
    assert parse_methods("abl_opt,abl_resample,abl_zero_folded,ctx_retrieval,ctx_gate,ctx_stream,all") == list(METHODS)
    assert parse_methods("taylor, wo_fro") == ["wo_fro", "taylor"]
    with pytest.raises(HeadpruneError, match="unknown scoring method"):
        parse_methods("wo_fro,magic")


@pytest.fixture(scope="module")
def biased_dir(tmp_path_factory):
    """The tiny model with every bias drawn at random (HF initialises them to 0, so there would be nothing to fold)."""
    folder = tmp_path_factory.mktemp("biased")
    hf = save_hf_gpt2(folder, **TINY)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    hf.save_pretrained(folder)
    return folder


def test_fold_value_biases_keeps_logits_and_zeroes_b_V(biased_dir, ids):
    """The fold is exact (logits equal HF's to 1e-5) and leaves the input model alone; zero ablation of the folded
    model is abl_zero_folded of the original, which equals HF with the head's W_O rows zeroed but its value-bias
    share b_V W_O kept in b_O, and differs clearly from abl_zero."""
    model = load_model(biased_dir)
    folded = fold_value_biases(model)
    assert has_value_biases(model) and not has_value_biases(folded)
    hf = GPT2LMHeadModel.from_pretrained(biased_dir).eval()
    tokens = ids[:48].view(2, 24)
    with torch.no_grad():
        reference = hf(tokens).logits
        assert (folded(tokens) - reference).abs().max() <= 1e-5
        assert (load_model(biased_dir, fold_value_bias=True)(tokens) - reference).abs().max() <= 1e-5
    window = Windowing(SEQ, STRIDE, BATCH)
    six = ScoringOptions(ablation_rows=6)
    methods = "abl_zero,abl_zero_folded"
    plain = score_heads(model, ids, methods, windowing=window, options=six, show_progress=False).table
    again = score_heads(folded, ids, methods, windowing=window, options=six, show_progress=False).table
    np.testing.assert_allclose(again.abl_zero, plain.abl_zero_folded, atol=1e-6)
    np.testing.assert_allclose(again.abl_zero_folded, again.abl_zero, atol=1e-6)  # nothing left to fold
    assert (plain.abl_zero - plain.abl_zero_folded).abs().max() > 1e-2  # the value-bias share matters here
    base, _ = guide_loop(hf, ids, SEQ, STRIDE)
    layer, head = 1, 2
    attn = hf.transformer.h[layer].attn
    rows = slice(head * DK, (head + 1) * DK)
    b_V = attn.c_attn.bias[2 * TINY["n_embd"] + head * DK : 2 * TINY["n_embd"] + (head + 1) * DK]
    with torch.no_grad():
        attn.c_proj.bias += (b_V.double() @ attn.c_proj.weight[rows].double()).float()
        attn.c_proj.weight[rows] = 0
        folded_zeroed, _ = guide_loop(hf, ids, SEQ, STRIDE)
    row = plain[(plain.layer == layer) & (plain["head"] == head)].iloc[0]
    assert row.abl_zero_folded == pytest.approx(folded_zeroed - base, abs=1e-4)
