"""Attribution patching of queries and keys (plain AtP, AtP*'s QK-fix, QK-fix + GradDrop) against independent
autograd on Hugging Face's GPT2LMHeadModel (hooks on c_attn, its eager attention probabilities), against exact
patch_q / patch_k on a saturated head, and to first order for a tiny patch."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.cli.main import main
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.work.files import read_table
from headprune.models.hooks import Capture
from headprune.patching import atp_qk, atp_qkfix, atp_star_qk, patch, run_pairs, task_pairs
from headprune.patching.tasks import induction

from helpers import PATCH_CFG as CFG
from helpers import save_hf_gpt2


@pytest.fixture(scope="module")
def model(patch_dir):
    return load_model(patch_dir)


@pytest.fixture(scope="module")
def hf(patch_dir):
    return GPT2LMHeadModel.from_pretrained(patch_dir, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def pairs():
    return induction(CFG["vocab_size"], 3, 4, seed=2)  # 3 pairs of 9 tokens


def estimate(result):
    base = result.m_corrupt if result.direction == "denoise" else result.m_clean
    return result.values - base.view(-1, 1)


def hf_run(hf, ids, drop=None):
    """HF's forward on one prompt with every layer's c_attn output kept (in the graph) and its attention
    probabilities; ``drop``: block ``drop``'s output replaced by input + (output − input).detach() (GradDrop)."""
    found = {}
    handles = [blk.attn.c_attn.register_forward_hook(lambda m, a, out, l=l: found.__setitem__(l, out))
               for l, blk in enumerate(hf.transformer.h)]
    if drop is not None:
        handles.append(hf.transformer.h[drop].register_forward_hook(
            lambda m, args, output: args[0] + (output - args[0]).detach()))
    out = hf(torch.tensor([ids]), output_attentions=True)
    for h in handles:
        h.remove()
    return out.logits[0, -1], found, out.attentions


def heads(hf, t):
    """(T, 3·h·d_k) c_attn output -> q, k (each (h, T, d_k))."""
    cfg = hf.config
    T = t.shape[0]
    q, k, _ = t.view(T, 3, cfg.n_head, cfg.n_embd // cfg.n_head).permute(1, 2, 0, 3)
    return q, k


def hf_qkfix_change(hf, q, k):
    """softmax(q kᵀ/√d_k + causal mask) written out: (h, T, T)."""
    T, dk = q.shape[1], q.shape[2]
    scores = (q @ k.transpose(-1, -2)) / dk**0.5
    return scores.masked_fill(torch.ones(T, T, dtype=torch.bool).tril().logical_not(), float("-inf")).softmax(-1)


def hf_estimates(hf, pairs, activation, method, direction="denoise"):
    """[P, H] per the module docstring's formulas, computed on HF's model: atp (∂m/∂c_attn output · Δq or Δk),
    qkfix ((A' − A) · ∂m/∂A), star (qkfix with GradDrop, mean of |·| over the L − 1 dropped layers)."""
    cfg = hf.config
    which = ("q", "k").index(activation)
    out = torch.zeros(len(pairs), cfg.n_layer * cfg.n_head, dtype=torch.float64)
    for p in range(len(pairs)):
        n = int(pairs.lengths[p])
        clean, corrupt = pairs.clean[p, :n].tolist(), pairs.corrupt[p, :n].tolist()
        base, source = (corrupt, clean) if direction == "denoise" else (clean, corrupt)
        with torch.no_grad():
            _, src, _ = hf_run(hf, source)
        for drop in (range(cfg.n_layer) if method == "star" else [None]):
            logits, found, attn = hf_run(hf, base, drop)
            m = logits[pairs.answer[p]] - logits[pairs.wrong[p]]
            wrt = [found[l] for l in range(cfg.n_layer)] if method == "atp" else list(attn)
            grads = torch.autograd.grad(m, wrt, allow_unused=True)
            for l, g in enumerate(grads):
                g = torch.zeros_like(wrt[l]) if g is None else g
                qb, kb = heads(hf, found[l][0].detach())
                qs, ks = heads(hf, src[l][0])
                if method == "atp":
                    diff = (qs - qb) if which == 0 else (ks - kb)
                    per_head = (diff.double() * torch.stack(heads(hf, g[0]))[which].double()).sum((1, 2))
                else:
                    patched = hf_qkfix_change(hf, qs, kb) if which == 0 else hf_qkfix_change(hf, qb, ks)
                    per_head = ((patched - attn[l][0].detach()).double() * g[0].double()).sum((1, 2))
                sl = slice(l * cfg.n_head, (l + 1) * cfg.n_head)
                out[p, sl] += per_head.abs() / (cfg.n_layer - 1) if method == "star" else per_head
    return out


@pytest.mark.parametrize("activation, direction", [("q", "denoise"), ("k", "denoise"), ("k", "noise")])
def test_atp_and_qkfix_equal_hf_autograd(model, hf, pairs, activation, direction):
    for name, ours in (("atp", atp_qk), ("qkfix", atp_qkfix)):
        got = estimate(ours(model, pairs, activation, direction=direction))
        expected = hf_estimates(hf, pairs, activation, name, direction)
        diff = (got - expected).abs().max().item()
        print(f"\n{name}_{activation} {direction}: max |ours - HF| = {diff:.2e} (largest {expected.abs().max():.3f})")
        assert diff <= 1e-5 and expected.abs().max() > 0.01


@pytest.mark.parametrize("activation", ["q", "k"])
def test_atp_star_qk_equals_hf_graddrop(model, hf, pairs, activation):
    got = estimate(atp_star_qk(model, pairs, activation))
    expected = hf_estimates(hf, pairs, activation, "star")
    diff = (got - expected).abs().max().item()
    print(f"\natp_star_{activation}: max |ours - HF GradDrop| = {diff:.2e} (largest {expected.abs().max():.3f})")
    assert diff <= 1e-5 and expected.abs().max() > 0.01
    assert (got >= 0).all()


def test_qkfix_recovers_a_saturated_head(tmp_path):
    """Layer 0's queries and keys scaled ×8 (scores ×64): its attention is near one-hot, the softmax's gradient
    near 0, and plain AtP of k misses what patching the keys does; the QK-fix computes the new pattern exactly, and
    what it linearises after the pattern is made nearly linear (no MLP, small head outputs beside ln_f's input)."""
    cfg = {**CFG, "n_layer": 1}
    save_hf_gpt2(tmp_path, seed=4, **cfg)
    model = load_model(tmp_path)
    w, b = model.h[0].attn.c_attn.weight, model.h[0].attn.c_attn.bias
    d = cfg["n_embd"]
    with torch.no_grad():
        w[:, : 2 * d] *= 8.0
        b[: 2 * d] *= 8.0
        model.h[0].mlp.c_proj.weight.zero_()  # after the pattern m is nearly linear: no MLP, and the heads'
        model.h[0].attn.c_proj.weight.mul_(0.1)  # output small beside the embedding, so ln_f barely bends
    pairs = induction(cfg["vocab_size"], 4, 5, seed=6)
    runs = run_pairs(model, pairs)
    cap = Capture()
    with torch.no_grad():
        model.run_blocks(model.embed(pairs.corrupt), capture=cap, need_weights=True)
    saturation = cap.attn[0][:, :, 1:].amax(-1).mean().item()  # mean largest probability per row (row 0 is 1)
    exact = estimate(patch(model, pairs, "k", runs=runs))
    plain = estimate(atp_qk(model, pairs, "k", runs=runs))
    fixed = estimate(atp_qkfix(model, pairs, "k", runs=runs))
    err = lambda e: ((e - exact).abs().sum() / exact.abs().sum()).item()
    print(f"\nsaturated k (mean max prob {saturation:.3f}): |exact| {exact.abs().mean():.3f}, relative error "
          f"AtP {err(plain):.3f}, QK-fix {err(fixed):.3f}")
    assert saturation > 0.9 and exact.abs().mean() > 0.01
    assert err(plain) > 0.5 and err(fixed) < 0.2


@pytest.mark.parametrize("activation", ["q", "k"])
def test_a_tiny_patch_is_first_order_exact(model, pairs, activation):
    """The source run's residual stream moved toward the base run's, source_eps = base + ε·(source − base): AtP and
    the QK-fix equal exact patching up to O(ε²), so their error shrinks ~4× when ε halves."""
    runs = run_pairs(model, pairs)
    source = dict(runs.source_resid)
    errors = {}
    for eps in (0.04, 0.02):
        runs.source_resid = {l: runs.base_resid[l] + eps * (source[l] - runs.base_resid[l]) for l in source}
        exact = estimate(patch(model, pairs, activation, runs=runs))
        for name, f in (("atp", atp_qk), ("qkfix", atp_qkfix)):
            errors[name, eps] = ((estimate(f(model, pairs, activation, runs=runs)) - exact).abs().max()
                                 / exact.abs().max()).item()
        assert exact.abs().max() > 1e-3
    print(f"\n{activation}: relative error at eps 0.04 / 0.02: " +
          ", ".join(f"{n} {errors[n, 0.04]:.2e} / {errors[n, 0.02]:.2e}" for n in ("atp", "qkfix")))
    for name in ("atp", "qkfix"):
        assert errors[name, 0.02] < 0.05 and errors[name, 0.04] / errors[name, 0.02] > 1.5


def test_atp_qk_refuses_other_activations(model, pairs):
    with pytest.raises(HeadpruneError, match="q or k"):
        atp_qkfix(model, pairs, "v")


def test_cli_compares_q_and_k_rows_with_their_exact_patching(tiny_dir, tmp_path, capsys):
    out = tmp_path / "patch.csv"
    argv = ["patch", "--model", str(tiny_dir), "--task", "induction", "--n-pairs", "3", "--seed", "1",
            "--bootstrap", "0", "--out", str(out), "--quiet", "--json", "--activations", "z,k",
            "--approximations", "atp,atp_star,atp_qkfix"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    agreement = read_table(tmp_path / "patch_agreement.csv")
    assert [(r["method"], r["exact"]) for r in summary["agreement"]] == [
        ("atp_z", "patch_z"), ("atp_star_z", "patch_z"),
        ("atp_k", "patch_k"), ("atp_star_k", "patch_k"), ("atp_qkfix_k", "patch_k")]
    assert list(agreement["method"]) == [r["method"] for r in summary["agreement"]]
    table = read_table(out)
    model = load_model(tiny_dir)
    expected = atp_qkfix(model, task_pairs("induction", model, n_pairs=3, seed=1), "k").effect.numpy()
    assert abs(table["atp_qkfix_k"].to_numpy() - expected).max() <= 1e-12
    assert main([*argv[:-4], "--activations", "z", "--approximations", "atp_qkfix"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("headprune: error:") and "atp_qkfix" in err[0]
