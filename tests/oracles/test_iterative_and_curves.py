"""The orchestration layer (iterative pruning, mean compensation, pruning curves) against oracles computed
independently in Hugging Face's GPT2LMHeadModel: a head is removed by zeroing its rows of c_proj.weight
(which drops z_i W_O^(i) entirely, its b_V share included), mean-ablated by a c_proj forward pre-hook that
replaces its slice of z by a mean measured with the same hook, and NLL is the guide's sliding-window loop.
"""

import copy
import json
import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.cli.main import main
from headprune.data.tokens import corpus_ids
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import load_tokenizer
from headprune.pruning.options import PruningOptions, ScoringData, Selection
from headprune.pruning.selection import select_heads

from helpers import TINY, guide_loop

SEQ, STRIDE, MAX_TOKENS = 64, 40, 300
D, H, L = TINY["n_embd"], TINY["n_head"], TINY["n_layer"]
DK = D // H
HEADS = [(layer, head) for layer in range(L) for head in range(H)]
TOL = 1e-5  # fp32 NLL / logits
WINDOW = ["--seq-len", str(SEQ), "--stride", str(STRIDE), "--max-tokens", str(MAX_TOKENS), "--quiet"]


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Two different texts: the evaluation corpus and the scoring corpus (means, re-scoring)."""
    import pydoc_data.topics

    folder = tmp_path_factory.mktemp("oracle-corpus")
    topics = list(pydoc_data.topics.topics.values())
    (folder / "eval.txt").write_text(" ".join(topics[:30])[:6000])
    (folder / "score.txt").write_text(" ".join(topics[40:70])[:6000])
    return folder / "eval.txt", folder / "score.txt"


@pytest.fixture(autouse=True)
def token_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))


@pytest.fixture(scope="module")
def token_ids(tiny_dir, corpora, tmp_path_factory):
    """(eval ids, score ids): the first MAX_TOKENS tokens of each corpus, as the CLI's --max-tokens cuts them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))
        tok = load_tokenizer(tiny_dir, vocab_size=TINY["vocab_size"])
        eval_ids, score_ids = (corpus_ids(str(c), split, tok, MAX_TOKENS)
                               for c, split in zip(corpora, ["test", "validation"]))
    assert len(eval_ids) == len(score_ids) == MAX_TOKENS and not torch.equal(eval_ids, score_ids)
    return eval_ids, score_ids


@pytest.fixture(scope="module")
def hf(tiny_dir):
    return GPT2LMHeadModel.from_pretrained(tiny_dir).eval()


@pytest.fixture(scope="module")
def full_abl_zero(hf, token_ids):
    """abl_zero of every head of the unpruned model, in HF on the scoring corpus."""
    return hf_abl_zero(hf, token_ids[1], [])


@pytest.fixture(scope="module")
def scores_file(hf, full_abl_zero, tiny_dir, tmp_path_factory):
    """A scores table written by hand: abl_zero from HF on the scoring corpus, wo_fro from c_proj's rows."""
    abl = full_abl_zero
    wo = [hf.transformer.h[l].attn.c_proj.weight[h * DK : (h + 1) * DK].double().norm().item() for l, h in HEADS]
    table = pd.DataFrame({"layer": [l for l, _ in HEADS], "head": [h for _, h in HEADS],
                          "head_id": [f"L{l}H{h}" for l, h in HEADS], "wo_fro": wo, "abl_zero": [abl[h] for h in HEADS],
                          "model_fingerprint": model_fingerprint(load_model(tiny_dir))})
    path = tmp_path_factory.mktemp("oracle-scores") / "scores.csv"
    table.to_csv(path, index=False)
    return path


# ---------------------------------------------------------------- independent HF computations

def scored_spans(n: int, seq_len: int, stride: int) -> list[tuple[int, int, int]]:
    """Per guide window (begin, end, p0): window-relative positions p0 .. end-begin-2 are those whose next-token
    prediction the loop scores (labels of the last trg_len tokens, shifted by one)."""
    spans, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + seq_len, n)
        first_target = max(prev_end, begin + 1)  # labels before end - trg_len are -100; position 0 has none
        spans.append((begin, end, first_target - 1 - begin))
        prev_end = end
        if end == n:
            break
    return spans


def hf_means(hf, ids, seq_len=SEQ, stride=STRIDE, scored_only=True) -> dict[int, torch.Tensor]:
    """Per layer the mean (float64, [h·d_k]) of c_proj's input z over the scored positions of the windows
    (or, the mistake, over every position of every window)."""
    sums = {l: torch.zeros(D, dtype=torch.float64) for l in range(L)}
    count = 0
    for begin, end, p0 in scored_spans(len(ids), seq_len, stride):
        lo, hi = (p0, end - begin - 1) if scored_only else (0, end - begin)
        def add(mod, args, layer, lo=lo, hi=hi):
            sums[layer] += args[0][0, lo:hi].double().sum(0)  # returns None: the input is left as it is

        hooks = [blk.attn.c_proj.register_forward_pre_hook(lambda mod, args, l=l: add(mod, args, l))
                 for l, blk in enumerate(hf.transformer.h)]
        with torch.no_grad():
            hf(ids[begin:end].view(1, -1))
        for hook in hooks:
            hook.remove()
        count += max(hi - lo, 0)
    return {l: s / count for l, s in sums.items()}


def hf_without(hf, heads, means: dict[int, torch.Tensor] | None = None) -> GPT2LMHeadModel:
    """A copy of ``hf`` without ``heads``: c_proj rows zeroed, or (``means``) z_i replaced by its mean."""
    model = copy.deepcopy(hf)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    for layer, hs in by_layer.items():
        proj = model.transformer.h[layer].attn.c_proj
        if means is None:
            with torch.no_grad():
                for head in hs:
                    proj.weight[head * DK : (head + 1) * DK] = 0
            continue
        cols = torch.cat([torch.arange(head * DK, (head + 1) * DK) for head in hs])
        fill = means[layer].float()[cols]

        def replace(mod, args, cols=cols, fill=fill):
            z = args[0].clone()
            z[..., cols] = fill
            return (z,)

        proj.register_forward_pre_hook(replace)
    return model


def nll(model, ids) -> float:
    return guide_loop(model, ids, SEQ, STRIDE)[0]


def hf_abl_zero(hf, ids, removed) -> dict[tuple[int, int], float]:
    """NLL increase of removing each remaining head from ``hf`` without ``removed``."""
    base = nll(hf_without(hf, removed), ids)
    return {h: nll(hf_without(hf, removed + [h]), ids) - base for h in HEADS if h not in removed}


def lowest(scores: dict, k: int) -> list[tuple[int, int]]:
    """The k lowest-scored heads, least important first; ties by (layer, head)."""
    return sorted(scores, key=lambda h: (scores[h], h))[:k]


def cut_gap(scores: dict, k: int) -> float:
    """How far the k-th lowest score is from the (k+1)-th: the room rounding has before the choice changes."""
    values = sorted(scores.values())
    return values[k] - values[k - 1] if 0 < k < len(values) else math.inf


def exported_heads(folder) -> list[tuple[int, int]]:
    spec = json.loads((folder / "headprune_export.json").read_text())["heads"]
    return [(int(l), int(h)) for l, h in re.findall(r"L(\d+)H(\d+)", spec)]


def random_tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- iterative pruning (issue 17, point 2)

def test_iterative_abl_zero_equals_hand_rescoring_loop(tiny_dir, hf, token_ids, full_abl_zero, scores_file, corpora,
                                                       tmp_path):
    """5 heads in 3 steps (2, 1, 2 heads): before each step the remaining heads' abl_zero is re-measured in HF
    on the model pruned so far; the CLI must remove exactly those heads, in that order, and not the one-shot set."""
    _, score_ids = token_ids
    removed, gaps = [], []
    for step in range(3):
        delta = hf_abl_zero(hf, score_ids, removed) if step else full_abl_zero
        take = round(5 * (step + 1) / 3) - len(removed)
        gaps.append(cut_gap(delta, take))
        removed += lowest(delta, take)
    file_scores = pd.read_csv(scores_file)
    one_shot = lowest(dict(zip(zip(file_scores.layer, file_scores["head"]), file_scores.abl_zero)), 5)
    print(f"\niterative {removed}, one-shot {one_shot}, smallest score gap at a cut {min(gaps):.2e}")
    assert min(gaps) > 100 * TOL, gaps  # the oracle's choice is not decided by rounding
    assert set(removed) != set(one_shot)  # re-scoring matters here

    args = ["prune", "--model", str(tiny_dir), "--scores", str(scores_file), "--method", "abl_zero", "--count", "5",
            "--score-data", str(corpora[1]), *WINDOW]
    assert main(args + ["--iterative", "3", "--out", str(tmp_path / "it")]) == 0
    assert main(args + ["--out", str(tmp_path / "once")]) == 0
    assert exported_heads(tmp_path / "it") == removed
    assert exported_heads(tmp_path / "once") == one_shot
    tokens = random_tokens(2)
    with torch.no_grad():
        want = hf_without(hf, removed)(tokens).logits
        assert (load_model(tmp_path / "it")(tokens) - want).abs().max() <= TOL


# ---------------------------------------------------------------- mean compensation (issue 17, point 3)

def test_mean_compensated_export_equals_hf_mean_ablation(tiny_dir, hf, corpora, tmp_path, capsys):
    """``--compensate mean`` with stride 16 < seq-len 64 (48 of 64 positions of most windows unscored): the export
    equals HF with the heads' z replaced by their mean over the scored positions of the scoring corpus."""
    stride = 16
    heads = [(0, 1), (2, 3), (2, 0)]
    args = ["prune", "--model", str(tiny_dir), "--heads", "L0H1,L2H3,L2H0", "--compensate", "mean",
            "--score-data", str(corpora[1]), "--seq-len", str(SEQ), "--stride", str(stride),
            "--max-tokens", str(MAX_TOKENS), "--quiet"]
    assert main(args + ["--out", str(tmp_path / "native")]) == 0
    assert main(args + ["--out", str(tmp_path / "hf"), "--format", "hf"]) == 0
    tok = load_tokenizer(tiny_dir, vocab_size=TINY["vocab_size"])
    score_ids = corpus_ids(str(corpora[1]), "validation", tok, MAX_TOKENS)
    means = hf_means(hf, score_ids, SEQ, stride)
    all_positions = hf_means(hf, score_ids, SEQ, stride, scored_only=False)
    other_head = {l: m.view(H, DK).roll(1, 0).reshape(-1) for l, m in means.items()}  # head h gets h-1's mean
    tokens = random_tokens(1)
    with torch.no_grad():
        want = hf_without(hf, heads, means)(tokens).logits
        err = max((load_model(tmp_path / "native")(tokens) - want).abs().max().item(),
                  (GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()(tokens).logits - want).abs().max().item())
        wrong = {name: (hf_without(hf, heads, m)(tokens).logits - want).abs().max().item()
                 for name, m in [("all positions", all_positions), ("other head", other_head)]}
    print(f"\ncompensated export: max |logit error| {err:.2e}; wrong variants {wrong}")
    assert err <= TOL
    assert min(wrong.values()) > 100 * TOL, wrong  # the test tells the usual mistakes apart


# ---------------------------------------------------------------- pruning curves (issue 17, point 4)

def test_curve_points_equal_hf_pruned_models(tiny_dir, hf, token_ids, scores_file, corpora, tmp_path):
    """Every point of ``headprune curve`` (two methods, random with 3 seeds, mean compensation) against HF models
    pruned by hand, the random mean/std (ddof=1) from the per-seed NLLs, and params against a hand count."""
    eval_ids, score_ids = token_ids
    fractions = [0, 0.25, 0.75]
    out = tmp_path / "curves.parquet"
    assert main(["curve", "--model", str(tiny_dir), "--data", str(corpora[0]), "--score-data", str(corpora[1]),
                 "--scores", str(scores_file), "--methods", "abl_zero,wo_fro",
                 "--fractions", ",".join(map(str, fractions)),
                 "--seeds", "3", "--compensate", "mean", "--out", str(out), *WINDOW]) == 0
    curves = pd.read_parquet(out)
    expected = [(m, c) for c, ms in [("none", ["abl_zero", "wo_fro", "random"]), ("mean", ["abl_zero", "wo_fro"])]
                for m in ms]
    assert list(dict.fromkeys(zip(curves.method, curves.compensation))) == expected
    assert len(curves) == len(expected) * len(fractions)

    table = pd.read_csv(scores_file)
    means = hf_means(hf, score_ids)
    full_params = sum(p.numel() for p in hf.parameters())  # the tied LM head counted once
    per_head = 3 * D * DK + 3 * DK + DK * D  # Q/K/V columns of c_attn (weights + biases) and W_O rows of c_proj
    memo: dict = {}

    def pruned_nll(heads, comp="none"):  # pruned models recur (fraction 0, random seeds): evaluate each once
        key = (tuple(sorted(heads)), comp)
        if key not in memo:
            memo[key] = nll(hf_without(hf, heads, means if comp == "mean" else None), eval_ids)
        return memo[key]

    base = pruned_nll([])
    stds = []
    for row in curves.itertuples():
        k = round(row.fraction * len(HEADS))
        if row.method == "random":
            chosen = [select_heads(table, "random", fraction=row.fraction, selection=Selection(seed=s))
                      for s in range(3)]
            assert all(len(c) == k for c in chosen)
            per_seed = np.array([pruned_nll(c) for c in chosen])
            want_nll, want_ppl = per_seed.mean(), np.exp(per_seed).mean()
            assert row.n_seeds == 3
            assert row.nll_std == pytest.approx(per_seed.std(ddof=1), abs=TOL)
            assert row.ppl_std == pytest.approx(np.exp(per_seed).std(ddof=1), rel=1e-5)
            stds.append(per_seed.std(ddof=1))
        else:
            heads = lowest(dict(zip(zip(table.layer, table["head"]), table[row.method])), k)
            want_nll = pruned_nll(heads, row.compensation)
            want_ppl = math.exp(want_nll)
            assert row.n_seeds == 1
        assert row.heads_pruned == k
        assert row.params == full_params - k * per_head
        assert row.nll == pytest.approx(want_nll, abs=TOL), row
        assert row.delta_nll == pytest.approx(want_nll - base, abs=TOL)
        assert row.ppl == pytest.approx(want_ppl, rel=TOL)
    # the random spread is large enough that ddof=0 (a factor sqrt(2/3)) would be far outside TOL
    assert min(s for s in stds if s > 1e-9) * (1 - math.sqrt(2 / 3)) > 100 * TOL


# ---------------------------------------------------------------- iterative branches (issue 22, point 2)

def test_iterative_per_layer_equals_hand_rescoring_loop(tiny_dir, hf, token_ids, full_abl_zero, scores_file, corpora,
                                                        tmp_path):
    """``--per-layer --fraction 0.75 --iterative 3``: each layer loses 3 of its 4 heads, 1 per step; before each
    step after the first the remaining heads' abl_zero is re-measured in HF on the model pruned so far, and each
    layer's lowest remaining head goes. Not the one-shot per-layer set, and no layer loses more than its share."""
    _, score_ids = token_ids
    removed, gaps = [], []
    for step in range(3):
        delta = hf_abl_zero(hf, score_ids, removed) if step else full_abl_zero
        for layer in range(L):
            in_layer = {h: v for h, v in delta.items() if h[0] == layer}
            gaps.append(cut_gap(in_layer, 1))
            removed += lowest(in_layer, 1)
    one_shot = [h for layer in range(L) for h in lowest({h: v for h, v in full_abl_zero.items() if h[0] == layer}, 3)]
    print(f"\nper-layer iterative {removed}, one-shot {one_shot}, smallest score gap at a cut {min(gaps):.2e}")
    assert min(gaps) > 100 * TOL, gaps
    assert set(removed) != set(one_shot)  # re-scoring changes the choice here

    args = ["prune", "--model", str(tiny_dir), "--scores", str(scores_file), "--method", "abl_zero", "--fraction",
            "0.75", "--per-layer", "--score-data", str(corpora[1]), *WINDOW]
    assert main(args + ["--iterative", "3", "--out", str(tmp_path / "it")]) == 0
    got = exported_heads(tmp_path / "it")
    assert sorted(got) == sorted(removed)
    for step in range(3):  # removal order: step by step, each step one head per layer
        assert sorted(got[L * step: L * (step + 1)]) == sorted(removed[L * step: L * (step + 1)])
    tokens = random_tokens(3)
    with torch.no_grad():
        want = hf_without(hf, removed)(tokens).logits
        assert (load_model(tmp_path / "it")(tokens) - want).abs().max() <= TOL


def test_iterative_optimal_compensation_refits_on_each_steps_model(tiny_dir, hf, token_ids, scores_file):
    """``compensate="optimal"`` in 2 steps by wo_fro (4 heads, 2 per step): step 1's constants are those optimal
    for its two heads on the unpruned model, step 2's those optimal for its two on the model after step 1. The
    result equals HF with all four heads' z overwritten by their step's constants; the constants fitted for all
    four at once (one-shot), or for step 2's heads on the unpruned model, give another model."""
    from headprune.perplexity import Windowing
    from headprune.pruning.iterative import prune_iteratively
    from headprune.pruning.prune import prune_model
    from headprune.scoring import joint_constants

    _, score_ids = token_ids
    table = pd.read_csv(scores_file)
    order = lowest(dict(zip(zip(table.layer, table["head"]), table.wo_fro)), 4)
    w = Windowing(SEQ, STRIDE, 8)
    model = load_model(tiny_dir)
    pruned, got = prune_iteratively(load_model(tiny_dir), table, "wo_fro", count=4,
                                    options=PruningOptions(steps=2, compensate="optimal"),
                                    data=ScoringData(score_ids, w), show_progress=False)
    assert got == order
    first = joint_constants(model, score_ids, order[:2], w, show_progress=False)
    second = joint_constants(prune_model(model, order[:2], first), score_ids, order[2:], w, show_progress=False)

    def hf_overwritten(constants):
        out = copy.deepcopy(hf)
        for layer in {l for l, _ in constants}:
            heads = [(h, c) for (l, h), c in constants.items() if l == layer]

            def replace(mod, args, heads=heads):
                z = args[0].clone()
                for h, c in heads:
                    z[..., h * DK:(h + 1) * DK] = c.to(z.dtype)
                return (z,)
            out.transformer.h[layer].attn.c_proj.register_forward_pre_hook(replace)
        return out

    tokens = random_tokens(4)
    with torch.no_grad():
        want = hf_overwritten({**first, **second})(tokens).logits
        err = (pruned(tokens) - want).abs().max().item()
        one_shot = hf_overwritten(joint_constants(model, score_ids, order, w, show_progress=False))(tokens).logits
        stale = hf_overwritten({**first, **joint_constants(model, score_ids, order[2:], w, show_progress=False)})
        wrong = {"one-shot": (one_shot - want).abs().max().item(),
                 "stale": (stale(tokens).logits - want).abs().max().item()}
    print(f"\niterative optimal: max |logit error| {err:.2e}; the wrong variants differ by {wrong}")
    assert err <= 1e-4
    assert min(wrong.values()) > 100 * 1e-4, wrong


def test_iterative_random_and_mean_compensation_and_refusals(tiny_dir, hf, token_ids, scores_file):
    """The other branches of prune_iteratively. ``random`` in 2 steps: each step draws u ~ U(0,1) afresh from
    default_rng(seed) over the remaining heads in (layer, head) order (drawn here by hand) and removes the lowest.
    Mean compensation in 2 steps by wo_fro: step 2's means are measured in HF on the model whose step-1 heads
    already output their means. Bad compensation and missing scoring data are refused."""
    from headprune.errors import HeadpruneError
    from headprune.perplexity import Windowing
    from headprune.pruning.iterative import prune_iteratively

    _, score_ids = token_ids
    table = pd.read_csv(scores_file)
    w = Windowing(SEQ, STRIDE, 8)
    left, want_random = list(HEADS), []
    for _ in range(2):
        u = np.random.default_rng(5).random(len(left))
        take = [left[i] for i in np.argsort(u, kind="stable")[:2]]
        want_random += take
        left = [h for h in left if h not in take]
    pruned, got = prune_iteratively(load_model(tiny_dir), table, "random", count=4,
                                    options=PruningOptions(steps=2, selection=Selection(seed=5)), show_progress=False)
    assert got == want_random
    tokens = random_tokens(5)
    with torch.no_grad():
        assert (pruned(tokens) - hf_without(hf, want_random)(tokens).logits).abs().max() <= TOL

    order = lowest(dict(zip(zip(table.layer, table["head"]), table.wo_fro)), 4)
    pruned, got = prune_iteratively(load_model(tiny_dir), table, "wo_fro", count=4,
                                    options=PruningOptions(steps=2, compensate="mean"),
                                    data=ScoringData(score_ids, w), show_progress=False)
    assert got == order
    first = hf_means(hf, score_ids)
    second = hf_means(hf_without(hf, order[:2], first), score_ids)  # step-1 heads' slices already hold their means
    with torch.no_grad():
        want = hf_without(hf, order, second)(tokens).logits
        stale = hf_without(hf, order, first)(tokens).logits  # all means from the unpruned model: one-shot
        err, gap = (pruned(tokens) - want).abs().max().item(), (stale - want).abs().max().item()
    print(f"\niterative mean compensation: max |logit error| {err:.2e}, one-shot means differ by {gap:.2e}")
    assert err <= TOL and gap > 100 * TOL

    with pytest.raises(HeadpruneError, match="must be one of none, mean, optimal"):
        prune_iteratively(load_model(tiny_dir), table, "wo_fro", count=1, options=PruningOptions(compensate="median"),
                          data=ScoringData(score_ids))
    with pytest.raises(HeadpruneError, match="needs scoring data"):
        prune_iteratively(load_model(tiny_dir), table, "abl_zero", count=2, options=PruningOptions(steps=2))
    with pytest.raises(HeadpruneError, match="at least 1"):
        prune_iteratively(load_model(tiny_dir), table, "wo_fro", count=2, options=PruningOptions(steps=0))
