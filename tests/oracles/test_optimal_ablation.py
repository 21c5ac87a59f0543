"""Optimal ablation (abl_opt, --compensate optimal) against independent computations in Hugging Face's
GPT2LMHeadModel: a head is ablated to a constant c by a c_proj forward pre-hook that overwrites its slice of z
with c, and NLL is the guide's sliding-window loop."""

import copy
import json

import pandas as pd
import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.cli.main import main
from headprune.data.tokens import corpus_ids
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import load_tokenizer
from headprune.io.work.progress import Progress
from headprune.perplexity import Windowing
from headprune.scoring import ScoringOptions, joint_constants, optimal_constants, score_heads
from headprune.scoring.optimal import _layer_losses, fit_set

from helpers import TINY, guide_loop, save_hf_gpt2

SEQ, STRIDE, BATCH = 64, 40, 3
VOCAB = 512  # the fit's cost is mostly the LM head: a small vocabulary keeps these tests fast
D, H, L = TINY["n_embd"], TINY["n_head"], TINY["n_layer"]
DK = D // H
STEPS = 40  # enough for the tiny model's fit to settle (the default budget is for speed, see optimal.STEPS)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    """TINY with a 512-token vocabulary."""
    folder = tmp_path_factory.mktemp("tiny-small-vocab")
    save_hf_gpt2(folder, **{**TINY, "vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0})
    return folder


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (300,), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def scored(small_dir, ids):
    return score_heads(load_model(small_dir), ids, "abl_mean,abl_opt", windowing=Windowing(SEQ, STRIDE, BATCH),
                       options=ScoringOptions(ablation_rows=6, optimal_steps=STEPS), show_progress=False)


def hf_with_constants(hf, constants: dict) -> GPT2LMHeadModel:
    """A copy of ``hf`` whose heads in ``constants`` output their constant (z_i := c_i, a c_proj pre-hook)."""
    model = copy.deepcopy(hf)
    for layer in {l for l, _ in constants}:
        heads = [(h, c) for (l, h), c in constants.items() if l == layer]

        def replace(mod, args, heads=heads):
            z = args[0].clone()
            for h, c in heads:
                z[..., h * DK:(h + 1) * DK] = c.to(z.dtype)
            return (z,)

        model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(replace)
    return model


def test_abl_opt_is_below_abl_mean_and_equals_hf(small_dir, ids, scored):
    """Every head: abl_opt <= abl_mean (mean ablation is the fit's first iterate) and abl_opt is the HF loss
    with the head's slice of z overwritten by its fitted constant; the fit gains on most heads."""
    table = scored.table
    gain = table.abl_mean - table.abl_opt
    print(f"\nabl_mean - abl_opt: min {gain.min():.2e}, median {gain.median():.2e}, max {gain.max():.2e}")
    assert (table.abl_opt <= table.abl_mean + 1e-6).all()
    assert (gain > 1e-4).mean() >= 0.75  # not just the starting point
    hf = GPT2LMHeadModel.from_pretrained(small_dir).eval()
    base, _ = guide_loop(hf, ids, SEQ, STRIDE)
    for layer, head in [(0, 1), (1, 3), (2, 0)]:
        c = scored.optimal[(layer, head)]
        ablated, _ = guide_loop(hf_with_constants(hf, {(layer, head): c}), ids, SEQ, STRIDE)
        row = table[(table.layer == layer) & (table["head"] == head)].iloc[0]
        assert row.abl_opt == pytest.approx(ablated - base, abs=1e-5)


def test_fitted_constant_is_an_optimum(small_dir, ids, scored):
    """Where the fit has settled (gradient at c* under 5% of its size at z̄), c* is a local minimum of the loss
    measured independently in HF, up to the fixed step budget: no step along ± coordinate axes or random
    directions lowers it by more than 1% of what the fit gained over z̄."""
    model = load_model(small_dir)
    batches = Windowing(SEQ, STRIDE, BATCH).batches(ids)
    ratio = {}
    for layer in range(L):
        with torch.no_grad():
            resid = [model.run_blocks(model.embed(b.tokens), stop=layer) for b in batches]
        grads = {}
        for name, source in [("mean", scored.means), ("opt", scored.optimal)]:
            fill = torch.stack([source[(layer, h)] for h in range(H)]).float()
            grads[name] = _layer_losses(model, batches, resid, layer, list(range(H)), fill, 6, grad=True)[1]
        ratio |= {(layer, h): r for h, r in enumerate((grads["opt"].norm(dim=1) / grads["mean"].norm(dim=1)).tolist())}
    settled = sorted((h for h in ratio if ratio[h] < 0.05), key=ratio.get)
    print(f"\n|grad at c*| / |grad at mean| per head: {[round(r, 3) for r in ratio.values()]}")
    assert settled

    hf = GPT2LMHeadModel.from_pretrained(small_dir).eval()
    gen = torch.Generator().manual_seed(0)
    for layer, head in settled[:2]:
        c = scored.optimal[(layer, head)].double()
        at_c, _ = guide_loop(hf_with_constants(hf, {(layer, head): c}), ids, SEQ, STRIDE)
        worst = 0.0
        spread = (scored.means[(layer, head)].double() - c).norm() / DK**0.5 + 1e-3
        directions = [torch.eye(DK, dtype=torch.float64)[k] for k in range(0, DK, 2)]
        directions += [torch.randn(DK, generator=gen, dtype=torch.float64) / DK**0.5 for _ in range(3)]
        for d in directions:
            for sign in (1, -1):
                moved, _ = guide_loop(hf_with_constants(hf, {(layer, head): c + sign * 0.1 * spread * d}), ids, SEQ,
                                      STRIDE)
                worst = max(worst, at_c - moved)
        row = scored.table[(scored.table.layer == layer) & (scored.table["head"] == head)].iloc[0]
        print(f"L{layer}H{head}: fit gained {row.abl_mean - row.abl_opt:.2e}, the best perturbation {worst:.2e} more")
        assert worst <= 0.01 * (row.abl_mean - row.abl_opt) + 1e-6  # what is left is noise next to the fit's gain


SET = [(0, 1), (1, 2), (1, 3), (2, 0)]  # heads of three layers, two in one


def test_joint_fit_of_a_set_beats_mean_and_equals_hf(small_dir, ids, scored):
    """Removing a set of heads with optimal compensation fits their constants together: the fit's NLL is the HF
    loss with all their slices of z overwritten at once, below the loss at their means (the fit's start), and
    below what the one-head-at-a-time constants c_i* give when folded together."""
    model = load_model(small_dir)
    w = Windowing(SEQ, STRIDE, BATCH)
    init = torch.stack([scored.means[h] for h in SET]).float()
    fit = fit_set(model, w.batches(ids), SET, init, STEPS)
    hf = GPT2LMHeadModel.from_pretrained(small_dir).eval()
    n = sum(int(b.mask.sum()) for b in w.batches(ids))
    joint = {h: torch.tensor(c) for h, c in zip(SET, fit["c"])}
    at_joint, _ = guide_loop(hf_with_constants(hf, joint), ids, SEQ, STRIDE)
    at_mean, _ = guide_loop(hf_with_constants(hf, {h: scored.means[h] for h in SET}), ids, SEQ, STRIDE)
    at_single, _ = guide_loop(hf_with_constants(hf, {h: scored.optimal[h] for h in SET}), ids, SEQ, STRIDE)
    print(f"\nNLL with the set ablated: means {at_mean:.5f}, single-head c* {at_single:.5f}, joint {at_joint:.5f}")
    assert fit["nll_best"] / n == pytest.approx(at_joint, abs=1e-5)
    assert fit["nll_init"] / n == pytest.approx(at_mean, abs=1e-5)
    assert at_joint < at_mean - 1e-3 and at_joint < at_single
    again = joint_constants(model, ids, SET, w, steps=STEPS, show_progress=False)  # the API: means measured itself
    assert all(torch.allclose(again[h], joint[h], atol=1e-5) for h in SET)


def test_joint_fit_of_one_head_is_at_least_abl_opt(small_dir, ids, scored):
    """For a single head the set's fit (torch's L-BFGS, no trust region) and abl_opt's per-head BFGS (steps of at
    most 1 σ) minimise the same loss from the same start: the set's fit gets at least as low, and its NLL is the
    HF loss with that head's z overwritten by its constant."""
    model = load_model(small_dir)
    w = Windowing(SEQ, STRIDE, BATCH)
    n = sum(int(b.mask.sum()) for b in w.batches(ids))
    table = scored.table.set_index(["layer", "head"])
    hf = GPT2LMHeadModel.from_pretrained(small_dir).eval()
    base, _ = guide_loop(hf, ids, SEQ, STRIDE)
    for head in [(0, 1), (2, 0)]:
        fit = fit_set(model, w.batches(ids), [head], scored.means[head].float().view(1, -1), STEPS)
        ablated, _ = guide_loop(hf_with_constants(hf, {head: torch.tensor(fit["c"][0])}), ids, SEQ, STRIDE)
        print(f"\nL{head[0]}H{head[1]}: abl_mean {table.abl_mean[head]:.4f}, abl_opt {table.abl_opt[head]:.4f}, "
              f"set fit {ablated - base:.4f}")
        assert fit["nll_best"] / n == pytest.approx(ablated, abs=1e-5)
        assert ablated - base <= table.abl_opt[head] + 1e-6


def test_optimal_constants_of_some_heads_are_the_scores_constants(small_dir, ids, scored):
    """The API for a few heads (a unit per layer holding only them) fits what score's abl_opt fitted for them."""
    c = optimal_constants(load_model(small_dir), ids, [(0, 1), (2, 0), (2, 3)], Windowing(SEQ, STRIDE, BATCH),
                          show_progress=False, steps=STEPS, ablation_rows=6)
    assert sorted(c) == [(0, 1), (2, 0), (2, 3)]
    for head, constant in c.items():
        torch.testing.assert_close(constant.double(), scored.optimal[head].double(), atol=1e-4, rtol=0)


def test_fit_resumes_from_recorded_units(small_dir, ids, tmp_path, monkeypatch):
    """Each layer's fit is one progress unit holding the constants: a rerun reads them and fits nothing."""
    model = load_model(small_dir)
    w = Windowing(SEQ, STRIDE, BATCH)
    settings = {"test": "optimal"}
    steps = 3
    options = ScoringOptions(ablation_rows=6, optimal_steps=steps)
    first = score_heads(model, ids, "abl_opt", windowing=w, options=options,
                        progress=Progress(tmp_path / "p.jsonl", settings), show_progress=False)
    units = [json.loads(line)["unit"] for line in (tmp_path / "p.jsonl").read_text().splitlines()[1:]]
    assert [u for u in units if u.startswith("opt/")] == [f"opt/s{steps}/L{l}" for l in range(L)]

    def refuse(*args, **kwargs):
        raise AssertionError("refit although the unit is recorded")

    monkeypatch.setattr("headprune.scoring.optimal.fit_layer", refuse)
    again = score_heads(model, ids, "abl_opt", windowing=w, options=options,
                        progress=Progress(tmp_path / "p.jsonl", settings), show_progress=False)
    assert again.table.abl_opt.tolist() == first.table.abl_opt.tolist()
    assert all(torch.equal(again.optimal[h], first.optimal[h]) for h in first.optimal)


@pytest.mark.slow  # fits 3, then all 12 heads of a model with GPT-2's 50257-token LM head
def test_prune_compensate_optimal_export_equals_optimally_ablated_hf(tiny_dir, corpus, tmp_path):
    """The exported (HF format) model without L0H1, L1H2, L1H3 has the NLL of the original with those heads' z
    overwritten by the constants optimal for ablating the three together (fitted on the scoring data), and
    curve --compensate optimal reports that NLL at the same head set and says where the fills came from."""
    window = ["--seq-len", str(SEQ), "--stride", str(STRIDE), "--max-tokens", "300", "--quiet"]
    heads = [(0, 1), (1, 2), (1, 3)]
    out = tmp_path / "pruned"
    assert main(["prune", "--model", str(tiny_dir), "--heads", "L0H1,L1H2,L1H3", "--compensate", "optimal",
                 "--score-data", str(corpus), "--format", "hf", "--out", str(out), *window]) == 0
    meta = json.loads((out / "headprune_export.json").read_text())
    assert meta["compensate"] == "optimal" and "300 tokens" in meta["fill_data"]

    model = load_model(tiny_dir)
    score_ids = corpus_ids(str(corpus), "validation", load_tokenizer(tiny_dir, vocab_size=TINY["vocab_size"]), 300)
    w = Windowing(SEQ, STRIDE, 8)
    constants = joint_constants(model, score_ids, heads, w, show_progress=False)
    assert sorted(constants) == heads
    eval_ids = corpus_ids(str(corpus), "test", load_tokenizer(tiny_dir, vocab_size=TINY["vocab_size"]), 300)
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    want, _ = guide_loop(hf_with_constants(hf, constants), eval_ids, SEQ, STRIDE)
    got, _ = guide_loop(GPT2LMHeadModel.from_pretrained(out).eval(), eval_ids, SEQ, STRIDE)
    print(f"\nexport NLL {got:.6f}, optimally ablated {want:.6f}")
    assert got == pytest.approx(want, abs=1e-5)

    scores = tmp_path / "scores.csv"  # ranks exactly these three heads lowest
    pd.DataFrame({"layer": [l for l in range(L) for _ in range(H)], "head": list(range(H)) * L,
                  "wo_fro": [0.0 if (l, h) in heads else 1.0 + l * H + h for l in range(L) for h in range(H)],
                  "model_fingerprint": model_fingerprint(model)}
                 ).to_csv(scores, index=False)
    curve = tmp_path / "curve.csv"
    assert main(["curve", "--model", str(tiny_dir), "--data", str(corpus), "--scores", str(scores), "--methods",
                 "wo_fro", "--fractions", "0,0.25", "--seeds", "1", "--compensate", "optimal", "--score-data",
                 str(corpus), "--out", str(curve), *window]) == 0
    table = pd.read_csv(curve, keep_default_na=False)
    row = table[(table.compensation == "optimal") & (table.fraction == 0.25)].iloc[0]
    assert row.heads_pruned == 3 and row.nll == pytest.approx(want, abs=1e-5)
    assert "300 tokens" in row.fill_data and (table[table.compensation == "none"].fill_data == "").all()
