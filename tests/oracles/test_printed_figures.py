"""Figures that commands print, recomputed here from what they are derived from, measured independently:
``finetune``'s share of the pruning gap recovered (perplexities of the teacher, the pruned and the recovered
model in Hugging Face's GPT2LMHeadModel with the guide's loop) and ``prune``'s parameter and FLOP counts
(counted from the HF checkpoint's tensors and the attention formula)."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
from transformers import GPT2LMHeadModel

import headprune
from headprune.cli.main import main
from headprune.data.tokens import corpus_ids
from headprune.io.read.tokenizer import load_tokenizer
from headprune.schema import DEFAULT_MAX_TOKENS

from helpers import TINY, guide_loop

D, H, L = TINY["n_embd"], TINY["n_head"], TINY["n_layer"]
DK = D // H


@pytest.fixture(scope="module")
def eval_corpus(tmp_path_factory):
    import pydoc_data.topics

    path = tmp_path_factory.mktemp("eval") / "e.txt"
    path.write_text(" ".join(list(pydoc_data.topics.topics.values())[40:60])[:3000])
    return path


ZOO = Path(headprune.__file__).parent / "zoo" / "stdlib-gpt2-mini"  # trained: pruning it costs perplexity


def _ppl(folder, ids) -> float:
    """Perplexity of an HF checkpoint in fp32 with windows of n_positions, stride n_positions (what finetune
    measures)."""
    hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    n = hf.config.n_positions
    return math.exp(guide_loop(hf, ids, n, n)[0])


def test_finetune_prints_the_share_of_the_gap_recomputed_from_hf_perplexities(corpus, eval_corpus, tmp_path, capsys):
    pruned, out = tmp_path / "pruned", tmp_path / "recovered"
    heads = ",".join(f"L{l}H{h}" for l in (0, 1) for h in range(6))
    assert main(["prune", "--model", str(ZOO), "--heads", heads, "--out", str(pruned), "--format",
                 "hf", "--device", "cpu", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["finetune", str(pruned), "--steps", "4", "--out", str(out), "--train-data", str(corpus), "--data",
                 str(eval_corpus), "--seq-len", "16", "--batch-size", "2", "--lr", "1e-4", "--device", "cpu",
                 "--teacher", str(ZOO), "--distill-weight", "0", "--quiet"]) == 0
    printed = capsys.readouterr().out
    ids = corpus_ids(str(eval_corpus), "test", load_tokenizer(ZOO), DEFAULT_MAX_TOKENS)
    p0, pp, pr = _ppl(ZOO, ids), _ppl(pruned, ids), _ppl(out, ids)
    share = (pp - pr) / (pp - p0)
    swapped = [(p0 - pr) / (p0 - pp), (pp - p0) / (pp - pr), (pr - pp) / (pr - p0), (p0 - pp) / (p0 - pr)]
    print(f"\nppl unpruned {p0:.4f}, pruned {pp:.4f}, recovered {pr:.4f}: share {share:.4f}; swapped {swapped}")
    assert pp > p0 and pr < pp  # a gap, and some of it recovered: the share is informative
    assert min(abs(s - share) for s in swapped) > 0.01  # swapping arguments changes what is printed
    shown = float(re.search(r"perplexity ([\d.]+): ([-\d.]+)% of the pruning gap recovered", printed).group(2))
    teacher = float(re.search(r"teacher \(unpruned\) perplexity ([\d.]+)", printed).group(1))
    before, after = map(float, re.search(r"tokens\): ([\d.]+) -> ([\d.]+)", printed).groups())
    assert shown == pytest.approx(100 * share, abs=0.1)
    assert (teacher, before, after) == pytest.approx((p0, pp, pr), rel=1e-5, abs=6e-4)
    record = json.loads((out / "headprune_export.json").read_text())["finetune"]
    assert record["gap_recovered"] == pytest.approx(share, abs=1e-3)
    delta = float(re.search(r"delta NLL ([-+\d.]+) nats/token", printed).group(1))
    assert delta == pytest.approx(math.log(pr) - math.log(pp), abs=6e-5)


def test_prune_prints_parameter_and_flop_counts_recomputed_by_hand(tiny_dir, tmp_path, capsys):
    heads = [(0, 1), (1, 0), (1, 2), (2, 3)]
    out = tmp_path / "pruned"
    capsys.readouterr()
    assert main(["prune", "--model", str(tiny_dir), "--heads", "L0H1,L1H0,L1H2,L2H3", "--out", str(out),
                 "--seq-len", "48", "--device", "cpu", "--quiet"]) == 0
    printed = capsys.readouterr().out
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir)
    full = sum(p.numel() for p in hf.parameters())  # the tied LM head counted once
    per_head = 3 * D * DK + 3 * DK + DK * D  # Q/K/V columns of c_attn (weights + biases), W_O rows of c_proj
    after = full - len(heads) * per_head

    def flops(n_heads: list[int], t: int) -> int:  # per layer: Q/K/V and W_O matmuls, QKᵀ and A·V at context t
        return sum(2 * D * 3 * n * DK + 2 * n * DK * D + 2 * 2 * n * DK * t for n in n_heads)

    kept = [H - sum(1 for l, _ in heads if l == layer) for layer in range(L)]
    f0, f1 = flops([H] * L, 48), flops(kept, 48)
    assert f"parameters: {full:,} -> {after:,} (removed {full - after:,})" in printed
    assert f"attention FLOPs/token at T=48: {f0:,} -> {f1:,} (removed {f0 - f1:,})" in printed
    with torch.no_grad():
        assert sum(p.numel() for p in hf.parameters()) == full
