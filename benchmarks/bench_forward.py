"""Our GPT-2 forward against Hugging Face's GPT2LMHeadModel, GPT-2-small architecture, random weights.

    python -m benchmarks.bench_forward [--batch 4 --seq 512 --repeats 5]

Prints both median times and the ratio ours / HF (target <= 1.05 on the CPU).
"""

import argparse

import torch
from transformers import GPT2LMHeadModel

from benchmarks.common import gpt2_small_checkpoint, time_interleaved
from headprune.io.loading import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    folder = gpt2_small_checkpoint()
    hf = GPT2LMHeadModel.from_pretrained(folder).to(args.device).eval()
    ours = load_model(folder, device=args.device)
    tokens = torch.randint(0, 50257, (args.batch, args.seq), generator=torch.Generator().manual_seed(0)).to(args.device)
    with torch.inference_mode():
        diff = (hf(tokens).logits - ours(tokens)).abs().max().item()
        t = time_interleaved({"hf": lambda: hf(tokens).logits, "ours": lambda: ours(tokens)}, args.repeats)
    print(f"GPT-2 small, random weights, {args.batch} x {args.seq} tokens, {torch.get_num_threads()} threads")
    print(f"max |logit diff| = {diff:.2e}")
    print(f"HF GPT2LMHeadModel: {t['hf'] * 1e3:.0f} ms   headprune: {t['ours'] * 1e3:.0f} ms   "
          f"ratio ours/HF = {t['ours'] / t['hf']:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
