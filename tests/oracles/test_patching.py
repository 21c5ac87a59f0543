"""Activation patching, attribution patching and resample ablation against independent computations on
Hugging Face's GPT2LMHeadModel built from the same weights (TransformerLens-style hooks, torch.autograd)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.errors import HeadpruneError
from headprune.loading import load_model
from headprune.patching.attribution import atp_star_z, atp_z
from headprune.patching.exact import patch, patch_z, run_pairs
from headprune.patching.pairs import PromptPairs, read_pairs
from headprune.patching.tasks import induction

from helpers import TINY, save_hf_gpt2

CFG = {**TINY, "vocab_size": 96, "n_positions": 32, "bos_token_id": 0, "eos_token_id": 0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("patch-gpt2")
    save_hf_gpt2(path, seed=1, **CFG)
    return path


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder)


@pytest.fixture(scope="module")
def hf(folder):
    return GPT2LMHeadModel.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def pairs():
    """Induction pairs of two lengths (right padding exercised): 6 pairs of 11 tokens, 4 of 7."""
    long, short = induction(CFG["vocab_size"], 6, 6, seed=0), induction(CFG["vocab_size"], 4, 4, seed=1)
    rows = lambda p, t: [r[: int(n)].tolist() for r, n in zip(t, p.lengths)]
    return PromptPairs.from_lists(rows(long, long.clean) + rows(short, short.clean),
                                  rows(long, long.corrupt) + rows(short, short.corrupt),
                                  long.answer.tolist() + short.answer.tolist(), long.wrong.tolist() + short.wrong.tolist())


def hf_z(hf, ids):
    """Every layer's concatenated head outputs z (T, h·d_k) on one prompt (the c_proj input)."""
    found = {}
    handles = [blk.attn.c_proj.register_forward_pre_hook(lambda m, a, l=l: found.__setitem__(l, a[0][0].clone()))
               for l, blk in enumerate(hf.transformer.h)]
    with torch.no_grad():
        hf(torch.tensor([ids]))
    for h in handles:
        h.remove()
    return found


def hf_qkv(hf, ids):
    """Every layer's c_attn output [q|k|v] (T, 3·h·d_k) on one prompt."""
    found = {}
    handles = [blk.attn.c_attn.register_forward_hook(lambda m, a, out, l=l: found.__setitem__(l, out[0].clone()))
               for l, blk in enumerate(hf.transformer.h)]
    with torch.no_grad():
        hf(torch.tensor([ids]))
    for h in handles:
        h.remove()
    return found


def loop_patch(hf, pairs, direction="denoise", activation="z"):
    """TransformerLens's get_act_patch_attn_head_{out,q,k,v}_all_pos, one pair and one head at a time: the base
    prompt's forward with head (l, i)'s slice of the c_proj input (z) or c_attn output (q, k, v) overwritten
    by the source prompt's. [P, H] logit diffs."""
    cfg = hf.config
    d, dk = cfg.n_embd, cfg.n_embd // cfg.n_head
    out = torch.zeros(len(pairs), cfg.n_layer * cfg.n_head, dtype=torch.float64)
    for p in range(len(pairs)):
        n = int(pairs.lengths[p])
        clean, corrupt = pairs.clean[p, :n].tolist(), pairs.corrupt[p, :n].tolist()
        base, source = (corrupt, clean) if direction == "denoise" else (clean, corrupt)
        found = hf_z(hf, source) if activation == "z" else hf_qkv(hf, source)
        offset = {"z": 0, "q": 0, "k": d, "v": 2 * d}[activation]
        for layer in range(cfg.n_layer):
            for head in range(cfg.n_head):
                cols = slice(offset + head * dk, offset + (head + 1) * dk)

                def overwrite(x, cols=cols, layer=layer):
                    x = x.clone()
                    x[0, :, cols] = found[layer][:, cols]
                    return x
                blk = hf.transformer.h[layer].attn
                handle = (blk.c_proj.register_forward_pre_hook(lambda m, a: (overwrite(a[0]),)) if activation == "z"
                          else blk.c_attn.register_forward_hook(lambda m, a, o: overwrite(o)))
                with torch.no_grad():
                    logits = hf(torch.tensor([base])).logits[0, -1]
                handle.remove()
                out[p, layer * cfg.n_head + head] = (logits[pairs.answer[p]] - logits[pairs.wrong[p]]).item()
    return out


@pytest.fixture(scope="module")
def few(pairs):
    """Two pairs of each length: what the slow per-head HF loops run on."""
    return pairs.select([0, 1, 6, 7])


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_patch_z_equals_tl_style_hf_loop(model, hf, few, direction):
    ours = patch_z(model, few, direction=direction, rows=3)  # rows 3 < 4 pairs: pair chunks and copies both
    loop = loop_patch(hf, few, direction)
    diff = (ours.values - loop).abs().max().item()
    print(f"\npatch_z {direction}: max |ours - HF loop| = {diff:.2e}, effect range {ours.effect.min():.2f}.."
          f"{ours.effect.max():.2f}")
    assert diff <= 1e-5
    assert (ours.values - ours.m_corrupt.view(-1, 1)).abs().max() > 0.05  # heads matter: the test can fail


@pytest.mark.parametrize("activation", ["q", "k", "v"])
def test_patch_qkv_equals_hf_loop(model, hf, few, activation):
    ours = patch(model, few, activation, rows=8)
    diff = (ours.values - loop_patch(hf, few, "denoise", activation)).abs().max().item()
    print(f"\npatch_{activation}: max |ours - HF loop| = {diff:.2e}")
    assert diff <= 1e-5


def test_by_position_sums_to_the_single_position_runs(model, hf):
    """by_position: the [pair, head, position] table equals the HF loop patching one position's slice."""
    pairs = induction(CFG["vocab_size"], 3, 4, seed=5)
    ours = patch_z(model, pairs, by_position=True, rows=16)
    assert ours.values.shape == (3, 12, 7)
    dk = CFG["n_embd"] // CFG["n_head"]
    for layer, head, t in [(0, 1, 0), (1, 2, 3), (2, 3, 6), (2, 0, 5)]:
        for p in range(3):
            z = hf_z(hf, pairs.clean[p].tolist())
            cols = slice(head * dk, (head + 1) * dk)

            def hook(m, a):
                x = a[0].clone()
                x[0, t, cols] = z[layer][t, cols]
                return (x,)
            handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook)
            with torch.no_grad():
                logits = hf(pairs.corrupt[p : p + 1]).logits[0, -1]
            handle.remove()
            expected = (logits[pairs.answer[p]] - logits[pairs.wrong[p]]).item()
            assert ours.values[p, layer * 4 + head, t].item() == pytest.approx(expected, abs=1e-5)


def test_padding_equals_each_pair_alone(model, pairs):
    """Right-padded batches of unequal lengths give each pair exactly what it gives alone."""
    together = patch_z(model, pairs, rows=64)
    for p in [0, 5, 6, 9]:
        alone = patch_z(model, pairs.select([p]), rows=64)
        assert (together.values[p] - alone.values[0]).abs().max().item() <= 1e-5
        assert together.m_clean[p].item() == pytest.approx(alone.m_clean[0].item(), abs=1e-5)
    assert pairs.clean.shape[1] > int(pairs.lengths.min())  # the batch really is padded


def hf_atp(hf, pairs, direction="denoise"):
    """AtP independently: torch.autograd on HF's model, ∂m/∂(c_proj input) at the base run, dotted per head
    with the z difference. [P, H]."""
    cfg = hf.config
    dk = cfg.n_embd // cfg.n_head
    out = torch.zeros(len(pairs), cfg.n_layer * cfg.n_head, dtype=torch.float64)
    for p in range(len(pairs)):
        n = int(pairs.lengths[p])
        clean, corrupt = pairs.clean[p, :n].tolist(), pairs.corrupt[p, :n].tolist()
        base, source = (corrupt, clean) if direction == "denoise" else (clean, corrupt)
        z_source = hf_z(hf, source)
        found = {}
        handles = [blk.attn.c_proj.register_forward_pre_hook(lambda m, a, l=l: found.__setitem__(l, a[0]))
                   for l, blk in enumerate(hf.transformer.h)]
        logits = hf(torch.tensor([base])).logits[0, -1]
        for h in handles:
            h.remove()
        m = logits[pairs.answer[p]] - logits[pairs.wrong[p]]
        grads = torch.autograd.grad(m, [found[l] for l in range(cfg.n_layer)])
        for l, g in enumerate(grads):
            prod = ((z_source[l] - found[l][0].detach()) * g[0]).double()  # (T, h·d_k)
            out[p, l * cfg.n_head : (l + 1) * cfg.n_head] = prod.view(n, cfg.n_head, dk).sum((0, 2))
    return out


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_atp_z_equals_hf_autograd(model, hf, pairs, direction):
    ours = atp_z(model, pairs, direction=direction)
    base = ours.m_corrupt if direction == "denoise" else ours.m_clean
    estimate = ours.values - base.view(-1, 1)
    expected = hf_atp(hf, pairs, direction)
    diff = (estimate - expected).abs().max().item()
    print(f"\natp_z {direction}: max |ours - HF autograd| = {diff:.2e} (largest {expected.abs().max():.2f})")
    assert diff <= 1e-5 and expected.abs().max() > 0.05


def test_bad_pair_files_name_the_line(tmp_path):
    good = json.dumps({"clean_ids": [1, 2, 3], "corrupt_ids": [1, 4, 3], "answer_id": 5, "wrong_id": 6})
    cases = {
        "not valid JSON": [good, "{oops"],
        "equally long": [good, good, json.dumps({"clean_ids": [1, 2], "corrupt_ids": [1], "answer_id": 5,
                                                  "wrong_id": 6})],
        "outside the vocabulary": [json.dumps({"clean_ids": [1, 200], "corrupt_ids": [1, 2], "answer_id": 5,
                                               "wrong_id": 6})],
        "expected the keys": [good, json.dumps({"clean": "a"})],
        "non-empty list": [json.dumps({"clean_ids": [], "corrupt_ids": [], "answer_id": 5, "wrong_id": 6})],
    }
    lines = {"not valid JSON": 2, "equally long": 3, "outside the vocabulary": 1, "expected the keys": 2,
             "non-empty list": 1}
    for words, rows in cases.items():
        path = tmp_path / "pairs.jsonl"
        path.write_text("\n".join(rows) + "\n")
        with pytest.raises(HeadpruneError, match=f"line {lines[words]}: .*{words}"):
            read_pairs(path, vocab_size=96)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(HeadpruneError, match="no prompt pairs"):
        read_pairs(tmp_path / "empty.jsonl")
    path.write_text(good + "\n\n" + good + "\n")  # blank lines are skipped
    assert len(read_pairs(path, vocab_size=96)) == 2


def test_text_pairs_need_one_token_answers(tmp_path):
    from headprune.loading import load_tokenizer

    tok = load_tokenizer("stdlib-gpt2-mini")
    row = {"clean": "os.join(path", "corrupt": "os.join[path", "answer": ")", "wrong": "]"}
    path = tmp_path / "text.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "answer": " antidisestablishment"}) + "\n")
    with pytest.raises(HeadpruneError, match="line 2: answer .* tokens for this tokenizer; it must be one token"):
        read_pairs(path, tok, 8192)
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "corrupt": "os.join[path, name"}) + "\n")
    with pytest.raises(HeadpruneError, match="line 2: the clean prompt is 5 tokens and the corrupt one 7"):
        read_pairs(path, tok, 8192)
    path.write_text(json.dumps(row) + "\n")
    pairs = read_pairs(path, tok, 8192)
    assert pairs.clean[0].tolist() == tok(row["clean"])["input_ids"] and pairs.answer.tolist() == [tok(")")["input_ids"][0]]
