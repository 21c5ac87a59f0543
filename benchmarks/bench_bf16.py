"""What loading and analysing in bf16 costs in accuracy, on the shipped model (its memory is half of fp32's).

    python -m benchmarks.bench_bf16 [--model stdlib-gpt2-mini] [--max-tokens 4096]

Prints: bytes held by each model; test-split NLL in fp32 and bf16; the max |Δlogit| relative to max |logit|;
and, for the scores the sweeps compute (grad, fluct, abl_zero on the validation split), the Spearman rank
correlation and the largest |Δ| between the fp32 and bf16 scores, relative to the fp32 score range.
"""

from __future__ import annotations

import argparse

import torch
from scipy import stats

from headprune.data.tokens import corpus_ids
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.perplexity import Windowing, evaluate
from headprune.scoring import score_heads

METHODS = ["fluct", "grad", "abl_zero"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="stdlib-gpt2-mini")
    p.add_argument("--max-tokens", type=int, default=4096)
    args = p.parse_args()
    models = {dt: load_model(args.model, dtype=dt) for dt in ("fp32", "bf16")}
    tok = model_tokenizer(models["fp32"])
    test = corpus_ids("default", "test", tok, args.max_tokens)
    val = corpus_ids("default", "validation", tok, args.max_tokens)
    windows = Windowing.for_model(models["fp32"], batch_size=8)
    seq = windows.seq_len
    nll = {dt: evaluate(m, test, windows, progress=False).nll for dt, m in models.items()}
    x = test[: min(seq, len(test))].view(1, -1)
    with torch.no_grad():
        ref, low = models["fp32"](x).float(), models["bf16"](x).float()
    held = {dt: sum(t.numel() * t.element_size() for t in m.state_dict().values()) for dt, m in models.items()}
    print(f"model {args.model}: {held['fp32'] / 2**20:.1f} MiB fp32, {held['bf16'] / 2**20:.1f} MiB bf16")
    print(f"test NLL ({len(test):,} tokens): fp32 {nll['fp32']:.5f}, bf16 {nll['bf16']:.5f}, "
          f"|Δ| {abs(nll['bf16'] - nll['fp32']):.2e} nats/token")
    print(f"logits: max|Δ| / max|fp32| = {float((low - ref).abs().max() / ref.abs().max()):.4f}")
    scores = {dt: score_heads(m, val, METHODS, show_progress=False).table for dt, m in models.items()}
    for method in METHODS:
        a, b = scores["fp32"][method], scores["bf16"][method]
        rho = stats.spearmanr(a, b).statistic
        print(f"{method:9s} Spearman fp32 vs bf16 {rho:.4f}, "
              f"max|Δ| / range {float((a - b).abs().max() / (a.max() - a.min())):.4f}")


if __name__ == "__main__":
    main()
