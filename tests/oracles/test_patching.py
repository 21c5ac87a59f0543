"""Activation patching, attribution patching and resample ablation against independent computations on
Hugging Face's GPT2LMHeadModel built from the same weights (TransformerLens-style hooks, torch.autograd)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.patching.attribution import atp_star_z, atp_z
from headprune.patching.exact import PatchOptions, patch, patch_z
from headprune.patching.pairs import PromptPairs, read_pairs
from headprune.patching.tasks import induction

from helpers import PATCH_CFG as CFG
from helpers import module_inputs, save_hf_gpt2


@pytest.fixture(scope="module")
def model(patch_dir):
    return load_model(patch_dir)


@pytest.fixture(scope="module")
def hf(patch_dir):
    return GPT2LMHeadModel.from_pretrained(patch_dir).eval()


@pytest.fixture(scope="module")
def pairs():
    """Induction pairs of two lengths (right padding exercised): 6 pairs of 11 tokens, 4 of 7."""
    long, short = induction(CFG["vocab_size"], 6, 6, seed=0), induction(CFG["vocab_size"], 4, 4, seed=1)
    rows = lambda p, t: [r[: int(n)].tolist() for r, n in zip(t, p.lengths)]
    return PromptPairs.from_lists(rows(long, long.clean) + rows(short, short.clean),
                                  rows(long, long.corrupt) + rows(short, short.corrupt),
                                  long.answer.tolist() + short.answer.tolist(),
                                  long.wrong.tolist() + short.wrong.tolist())


def hf_z(hf, ids):
    """Every layer's concatenated head outputs z (T, h·d_k) on one prompt (the c_proj input)."""
    return module_inputs([blk.attn.c_proj for blk in hf.transformer.h], lambda: hf(torch.tensor([ids])))


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

                def overwrite(x, cols=cols, layer=layer, found=found):
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
    ours = patch(model, few, activation, options=PatchOptions(rows=8))
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

            def hook(m, a, t=t, cols=cols, z=z[layer]):
                x = a[0].clone()
                x[0, t, cols] = z[t, cols]
                return (x,)
            handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook)
            with torch.no_grad():
                logits = hf(pairs.corrupt[p : p + 1]).logits[0, -1]
            handle.remove()
            expected = (logits[pairs.answer[p]] - logits[pairs.wrong[p]]).item()
            assert ours.values[p, layer * 4 + head, t].item() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("activation", ["q", "k", "v"])
def test_by_position_qkv_equals_hf_with_one_positions_slice_overwritten(model, hf, activation):
    """by_position for q, k and v: position t of head i's slice of the c_attn output from the clean run."""
    pairs = induction(CFG["vocab_size"], 2, 4, seed=6)
    ours = patch(model, pairs, activation, options=PatchOptions(by_position=True, rows=16))
    assert ours.values.shape == (2, 12, 7)
    d, dk = CFG["n_embd"], CFG["n_embd"] // CFG["n_head"]
    offset = {"q": 0, "k": d, "v": 2 * d}[activation]
    moved = 0.0
    for layer, head, t in [(0, 2, 1), (1, 0, 4), (2, 3, 6), (0, 1, 5)]:
        cols = slice(offset + head * dk, offset + (head + 1) * dk)
        for p in range(2):
            found = hf_qkv(hf, pairs.clean[p].tolist())[layer]

            def hook(m, a, out, t=t, cols=cols, found=found):
                out = out.clone()
                out[0, t, cols] = found[t, cols]
                return out
            handle = hf.transformer.h[layer].attn.c_attn.register_forward_hook(hook)
            with torch.no_grad():
                logits = hf(pairs.corrupt[p : p + 1]).logits[0, -1]
            handle.remove()
            expected = (logits[pairs.answer[p]] - logits[pairs.wrong[p]]).item()
            assert ours.values[p, layer * 4 + head, t].item() == pytest.approx(expected, abs=1e-5)
            moved = max(moved, abs(expected - ours.m_corrupt[p].item()))
    assert moved > 1e-3  # the patched positions change the metric: the comparison can fail


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
        handles = [blk.attn.c_proj.register_forward_pre_hook(lambda m, a, l=l, found=found: found.__setitem__(l, a[0]))
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
    other = json.dumps({"clean_ids": [1, 2, 7], "corrupt_ids": [1, 4, 7], "answer_id": 5, "wrong_id": 6})
    path.write_text(good + "\n\n" + other + "\n")  # blank lines are skipped
    assert len(read_pairs(path, vocab_size=96)) == 2


def test_text_pairs_need_one_token_answers(tmp_path):
    from headprune.io.read.tokenizer import load_tokenizer

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
    assert (pairs.clean[0].tolist() == tok(row["clean"])["input_ids"]
            and pairs.answer.tolist() == [tok(")")["input_ids"][0]])


def hf_graddrop(hf, pairs):
    """AtP* GradDrop independently: per layer ℓ, HF's forward with block ℓ's output replaced by
    input + (output − input).detach() (same values, no gradient through the block), autograd, |Δz·grad|,
    averaged over the L − 1 layers. [P, H]."""
    cfg = hf.config
    dk = cfg.n_embd // cfg.n_head
    out = torch.zeros(len(pairs), cfg.n_layer * cfg.n_head, dtype=torch.float64)
    for p in range(len(pairs)):
        n = int(pairs.lengths[p])
        clean, corrupt = pairs.clean[p, :n].tolist(), pairs.corrupt[p, :n].tolist()
        z_source = hf_z(hf, clean)
        for drop in range(cfg.n_layer):
            found = {}
            handles = [blk.attn.c_proj.register_forward_pre_hook(
                           lambda m, a, l=l, found=found: found.__setitem__(l, a[0]))
                       for l, blk in enumerate(hf.transformer.h)]
            handles.append(hf.transformer.h[drop].register_forward_hook(
                lambda m, args, output: args[0] + (output - args[0]).detach()))
            logits = hf(torch.tensor([corrupt])).logits[0, -1]
            for h in handles:
                h.remove()
            m = logits[pairs.answer[p]] - logits[pairs.wrong[p]]
            grads = torch.autograd.grad(m, [found[l] for l in range(cfg.n_layer)], allow_unused=True)
            for l, g in enumerate(grads):
                g = torch.zeros_like(found[l]) if g is None else g
                prod = ((z_source[l] - found[l][0].detach()) * g[0]).double().view(n, cfg.n_head, dk).sum((0, 2))
                out[p, l * cfg.n_head : (l + 1) * cfg.n_head] += prod.abs() / (cfg.n_layer - 1)
    return out


def test_graddrop_finds_the_head_whose_effects_cancel(tmp_path):
    """A 2-layer model whose second block's output is scaled (bisection on the scale) until head L0H2's direct
    effect and its effect through layer 1 cancel in AtP; AtP* (GradDrop) still sees the direct effect, and
    equals an independent GradDrop on HF's model with the same weights."""
    cfg = {**CFG, "n_layer": 2}
    save_hf_gpt2(tmp_path, seed=2, **cfg)
    model, hf = load_model(tmp_path), GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    pairs = induction(cfg["vocab_size"], 1, 5, seed=3)
    names = [n for n, _ in model.named_parameters() if n.startswith("h.1.") and "c_proj" in n]
    original = {n: model.get_parameter(n).detach().clone() for n in names}

    def scale(alpha):
        for n in names:
            model.get_parameter(n).data = original[n] * alpha
            hf.get_parameter(f"transformer.{n}").data = original[n] * alpha

    def atp_head(alpha):
        scale(alpha)
        a = atp_z(model, pairs)
        return (a.values - a.m_corrupt.view(-1, 1))[0, 2].item()

    lo, hi = 2.0, 16.0
    assert atp_head(lo) > 0 > atp_head(hi)  # the indirect path's sign flips it: a cancelling scale exists
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if atp_head(mid) > 0 else (lo, mid)
    scale(lo)
    plain = atp_z(model, pairs)
    star = atp_star_z(model, pairs)
    plain_est = (plain.values - plain.m_corrupt.view(-1, 1))[0]
    star_est = (star.values - star.m_corrupt.view(-1, 1))[0]
    print(f"\nscale {lo:.4f}: L0H2 AtP {plain_est[2]:.2e}, AtP* {star_est[2]:.3f}")
    assert abs(plain_est[2]) < 1e-4 and star_est[2] > 0.1  # AtP cancels, AtP* does not
    assert (star_est[4:] - plain_est[4:].abs()).abs().max() < 1e-5  # last layer: only its own drop is 0
    expected = hf_graddrop(hf, pairs)[0]
    assert (star_est - expected).abs().max().item() <= 1e-5


def test_abl_resample_equals_slow_reference(model, hf):
    """abl_resample against a slow loop on HF's model: per draw, window and head, the window's forward with the
    head's c_proj-input slice overwritten by its output on the drawn source window (prefix), NLL summed over
    the scored tokens; averaged over draws, minus the baseline, per scored token."""
    from headprune.perplexity import Windowing
    from headprune.scoring import ScoringOptions, score_heads
    from headprune.scoring.resample import resample_sources

    ids = torch.randint(0, CFG["vocab_size"], (5 * 8 + 5,), generator=torch.Generator().manual_seed(11))
    windowing = Windowing(8, 8, 2)  # 5 full windows and a short last one (5 tokens): sources may be longer
    table = score_heads(model, ids, "abl_resample", windowing=windowing,
                        options=ScoringOptions(bootstrap=20, seed=4, resample_draws=2), show_progress=False).table
    batches = windowing.batches(ids)
    windows = [(b.tokens[j], b.mask[j]) for b in batches for j in range(len(b.tokens))]
    sources = resample_sources([len(t) for t, _ in windows], 2, 4)
    cfg = hf.config
    dk = cfg.n_embd // cfg.n_head
    nll = lambda logits, tokens, mask: torch.nn.functional.cross_entropy(
        logits[0, :-1].double(), tokens[1:], reduction="none")[mask].sum().item()
    n_scored = sum(int(mask.sum()) for _, mask in windows)
    with torch.no_grad():
        base = sum(nll(hf(t[None]).logits, t, mask) for t, mask in windows)
        for l, head in [(0, 0), (1, 2), (2, 3)]:
            cols = slice(head * dk, (head + 1) * dk)
            total = 0.0
            for s in range(2):
                for w, (tokens, mask) in enumerate(windows):
                    src_tokens = windows[sources[s][w]][0][: len(tokens)]
                    z_src = hf_z(hf, src_tokens.tolist())[l]

                    def hook(m, a, z_src=z_src, cols=cols):
                        x = a[0].clone()
                        x[0, :, cols] = z_src[:, cols]
                        return (x,)
                    handle = hf.transformer.h[l].attn.c_proj.register_forward_pre_hook(hook)
                    total += nll(hf(tokens[None]).logits, tokens, mask)
                    handle.remove()
            expected = (total / 2 - base) / n_scored
            got = table.loc[table.head_id == f"L{l}H{head}", "abl_resample"].item()
            assert got == pytest.approx(expected, abs=1e-5), (l, head)
    assert table.abl_resample.abs().max() > 0.01  # heads matter on this model
    assert ((table.abl_resample_ci_lo <= table.abl_resample).all()
            and (table.abl_resample <= table.abl_resample_ci_hi).all())
    assert all(v != w for draw in sources for w, v in enumerate(draw)) and len(windows[-1][0]) == 5


def test_tasks_are_seeded_and_well_formed():
    from headprune.io.read.tokenizer import load_tokenizer
    from headprune.patching.tasks import ioi

    a, b, c = induction(96, 4, 5, seed=0), induction(96, 4, 5, seed=0), induction(96, 4, 5, seed=1)
    assert torch.equal(a.clean, b.clean) and torch.equal(a.corrupt, b.corrupt) and not torch.equal(a.clean, c.clean)
    assert torch.equal(a.clean[:, :5], a.corrupt[:, :5]) and torch.equal(a.clean[:, 5:], a.clean[:, :4])
    assert torch.equal(a.answer, a.clean[:, 4]) and not (a.corrupt[:, 5:] == a.clean[:, 5:]).any()
    tok = load_tokenizer(None)  # GPT-2's BPE
    pairs = ioi(tok, 8, seed=0)
    assert torch.equal(pairs.clean, ioi(tok, 8, seed=0).clean)
    for p in range(len(pairs)):
        n = int(pairs.lengths[p])
        clean, corrupt = tok.decode(pairs.clean[p, :n]), tok.decode(pairs.corrupt[p, :n])
        io, s = tok.decode([pairs.answer[p]]), tok.decode([pairs.wrong[p]])
        assert clean.count(io) == 1 and clean.count(s) == 2 and io not in corrupt and s not in corrupt, (clean, corrupt)
    assert len(set(pairs.lengths.tolist())) > 1  # several templates: padding is used


def test_brackets_task_runs_on_the_shipped_model():
    """The stdlib model closes "(" with ")" and "[" with "]": every pair's logit diff is larger clean."""
    from headprune.patching.exact import run_pairs
    from headprune.patching.tasks import task_pairs

    model = load_model("stdlib-gpt2-mini")
    runs = run_pairs(model, task_pairs("brackets", model, n_pairs=16))
    gap = (runs.m_clean - runs.m_corrupt).mean().item()
    print(f"\nbrackets on stdlib-gpt2-mini: m_clean {runs.m_clean.mean():.2f}, m_corrupt {runs.m_corrupt.mean():.2f}")
    assert gap > 2 and (runs.m_clean > runs.m_corrupt).all()


def test_table_and_agreement(model, pairs):
    from headprune.patching.table import agreement, patch_table

    exact, approx = patch_z(model, pairs), atp_z(model, pairs)
    table = patch_table(model, [exact, approx], bootstrap=50)
    assert list(table.columns[:4]) == ["layer", "head", "head_id", "model_fingerprint"]
    assert table.patch_z.tolist() == pytest.approx(exact.effect.tolist())
    assert (table.patch_z_ci_lo <= table.patch_z_ci_hi).all()
    denominator = (exact.m_clean - exact.m_corrupt).mean()
    assert table.patch_z[5] == pytest.approx(((exact.values[:, 5] - exact.m_corrupt).mean() / denominator).item())
    same = agreement(exact, [exact, approx], k=3, bootstrap=50)
    assert same.spearman[0] == pytest.approx(1) and same.recall_at_k[0] == 1 and same.spearman_ci_lo[0] == 1
    assert -1 <= same.spearman[1] <= 1 and same.spearman_ci_lo[1] <= same.spearman_ci_hi[1]
